// kx.h: kvxfer's own view of libnixl_capi (NIXL's src/bindings/rust/wrapper.h is
// not installed) and the trampolines in kx.c. Nothing here needs NIXL to build.
#ifndef KVXFER_LIBNIXL_KX_H
#define KVXFER_LIBNIXL_KX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Handles of the libnixl_capi ABI (declared by us: NIXL's wrapper.h is
// not installed) are opaque pointers; statuses are C enums (int).
typedef void *kx_h;
typedef int kx_st;

const char *kx_open(const char *path);
int kx_has_raw(void);
int kx_raw_post(kx_h a, kx_h x);
int kx_raw_status(kx_h a, kx_h x);
kx_st kx_create_agent(const char *name, bool prog, int sync, uint64_t pthr_delay_us, kx_h *out);
kx_st kx_destroy_agent(kx_h a);
kx_st kx_create_backend(kx_h a, const char *plugin, char **kv, size_t n, kx_h *out);
kx_st kx_plugins(kx_h a, char **out);
kx_st kx_reg(kx_h a, int mem, const uint64_t *t, size_t n, int reg);
kx_st kx_prep(kx_h a, const char *peer, int mem, const uint64_t *t, size_t n, kx_h *out);
kx_st kx_release_list(kx_h a, kx_h h);
kx_st kx_make(kx_h a, int op, kx_h l, const int *li, kx_h r, const int *ri, size_t n, const void *msg, size_t mlen, bool has, kx_h *out);
kx_st kx_create(kx_h a, int op, int lmem, const uint64_t *lt, int rmem, const uint64_t *rt, size_t n, const char *peer, const void *msg, size_t mlen, bool has, kx_h *out);
kx_st kx_post(kx_h a, kx_h x);
kx_st kx_status(kx_h a, kx_h x);
kx_st kx_release(kx_h a, kx_h x);
kx_st kx_local_md(kx_h a, void **data, size_t *len);
kx_st kx_load_md(kx_h a, const void *d, size_t n, char **name);
kx_st kx_invalidate(kx_h a, const char *peer);
kx_st kx_check_md(kx_h a, const char *peer);
kx_st kx_gen_notif(kx_h a, const char *peer, const void *m, size_t n);
kx_st kx_new_notif_map(kx_h *m);
kx_st kx_free_notif_map(kx_h m);
kx_st kx_drain(kx_h a, kx_h m, char **out, size_t *outlen);

#endif
