// kx.c: dlopen/dlsym of libnixl_capi.so and the C trampolines Go calls
// (cgo cannot call C function pointers itself). See capi.go.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "kx.h"

// nixl_capi_agent_config_t; field offsets checked against the wheel's
// nixl_capi_create_configured_agent (0,1,4,8,12,16,24,32).
typedef struct {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
} kx_agent_config;

static void *kx_lib;
static int (*r_post)(void *, void *, const void *);
static int (*r_status)(void *, void *);

#define KX_FN(ret, name, args) static ret (*p_##name) args;
#define KX_FUNCS(X) \
	X(kx_st, create_configured_agent, (const char *, const kx_agent_config *, kx_h *)) \
	X(kx_st, destroy_agent, (kx_h)) \
	X(kx_st, get_local_md, (kx_h, void **, size_t *)) \
	X(kx_st, load_remote_md, (kx_h, const void *, size_t, char **)) \
	X(kx_st, invalidate_remote_md, (kx_h, const char *)) \
	X(kx_st, check_remote_md, (kx_h, const char *, kx_h)) \
	X(kx_st, get_available_plugins, (kx_h, kx_h *)) \
	X(kx_st, string_list_size, (kx_h, size_t *)) \
	X(kx_st, string_list_get, (kx_h, size_t, const char **)) \
	X(kx_st, destroy_string_list, (kx_h)) \
	X(kx_st, create_params, (kx_h *)) \
	X(kx_st, params_add, (kx_h, const char *, const char *)) \
	X(kx_st, destroy_params, (kx_h)) \
	X(kx_st, create_backend, (kx_h, const char *, kx_h, kx_h *)) \
	X(kx_st, destroy_backend, (kx_h)) \
	X(kx_st, create_opt_args, (kx_h *)) \
	X(kx_st, destroy_opt_args, (kx_h)) \
	X(kx_st, opt_args_set_notif_msg, (kx_h, const void *, size_t)) \
	X(kx_st, opt_args_set_has_notif, (kx_h, bool)) \
	X(kx_st, create_reg_dlist, (int, kx_h *, bool)) \
	X(kx_st, reg_dlist_add_desc, (kx_h, uintptr_t, size_t, uint64_t, const void *, size_t)) \
	X(kx_st, destroy_reg_dlist, (kx_h)) \
	X(kx_st, register_mem, (kx_h, kx_h, kx_h)) \
	X(kx_st, deregister_mem, (kx_h, kx_h, kx_h)) \
	X(kx_st, create_xfer_dlist, (int, kx_h *, bool)) \
	X(kx_st, xfer_dlist_add_desc, (kx_h, uintptr_t, size_t, uint64_t)) \
	X(kx_st, destroy_xfer_dlist, (kx_h)) \
	X(kx_st, prep_xfer_dlist, (kx_h, const char *, kx_h, kx_h *, kx_h)) \
	X(kx_st, release_xfer_dlist_handle, (kx_h, kx_h)) \
	X(kx_st, make_xfer_req, (kx_h, int, kx_h, const int *, size_t, kx_h, const int *, size_t, kx_h *, kx_h)) \
	X(kx_st, create_xfer_req, (kx_h, int, kx_h, kx_h, const char *, kx_h *, kx_h)) \
	X(kx_st, post_xfer_req, (kx_h, kx_h, kx_h)) \
	X(kx_st, get_xfer_status, (kx_h, kx_h)) \
	X(kx_st, release_xfer_req, (kx_h, kx_h)) \
	X(kx_st, destroy_xfer_req, (kx_h)) \
	X(kx_st, create_notif_map, (kx_h *)) \
	X(kx_st, destroy_notif_map, (kx_h)) \
	X(kx_st, get_notifs, (kx_h, kx_h, kx_h)) \
	X(kx_st, notif_map_size, (kx_h, size_t *)) \
	X(kx_st, notif_map_get_agent_at, (kx_h, size_t, const char **)) \
	X(kx_st, notif_map_get_notifs_size, (kx_h, const char *, size_t *)) \
	X(kx_st, notif_map_get_notif, (kx_h, const char *, size_t, const void **, size_t *)) \
	X(kx_st, notif_map_clear, (kx_h)) \
	X(kx_st, gen_notif, (kx_h, const char *, const void *, size_t, kx_h))

KX_FUNCS(KX_FN)

// kx_open loads the library and resolves every symbol. It returns NULL or a
// static/dlerror message that the caller copies at once (it runs under a Go
// sync.Once, so dlerror's buffer is not shared).
const char *kx_open(const char *path) {
	kx_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!kx_lib) return dlerror();
#define KX_SYM(ret, name, args) \
	p_##name = (ret(*) args)dlsym(kx_lib, "nixl_capi_" #name); \
	if (!p_##name) return "missing symbol nixl_capi_" #name;
	KX_FUNCS(KX_SYM)
	// Optional: nixlAgent's own postXferReq/getXferStatus (in libnixl.so, a
	// dependency dlsym searches). They return the raw nixl_status_t, which keeps
	// REMOTE_DISCONNECT and REPOST_ACTIVE that the C API folds into BACKEND.
	r_post = (int (*)(void *, void *, const void *))dlsym(kx_lib,
		"_ZNK9nixlAgent11postXferReqEP12nixlXferReqHPK21nixlAgentOptionalArgs");
	r_status = (int (*)(void *, void *))dlsym(kx_lib, "_ZNK9nixlAgent13getXferStatusEP12nixlXferReqH");
	return NULL;
}

int kx_has_raw(void) { return r_post != NULL && r_status != NULL; }

// The C API's agent and request wrappers hold the C++ pointer as their first
// field (struct nixl_capi_agent_s { nixlAgent *inner; }, nixl_capi_xfer_req_s
// { nixlXferReqH *req; }); a non-virtual const member function takes this as
// its first argument. A NULL extra keeps the notification given at creation.
int kx_raw_post(kx_h a, kx_h x) { return r_post(*(void **)a, *(void **)x, NULL); }
int kx_raw_status(kx_h a, kx_h x) { return r_status(*(void **)a, *(void **)x); }

// Trampolines: cgo cannot call C function pointers directly. The ones below
// also batch what would otherwise be one cgo crossing per descriptor or index.

kx_st kx_create_agent(const char *name, bool prog, int sync, uint64_t pthr_delay_us, kx_h *out) {
	kx_agent_config c;
	memset(&c, 0, sizeof c);
	c.enable_prog_thread = prog;
	c.listen_port = 8888;
	c.thread_sync = sync;
	c.num_workers = 1;
	c.pthr_delay_us = pthr_delay_us;
	c.lthr_delay_us = 100000;
	return p_create_configured_agent(name, &c, out);
}
kx_st kx_destroy_agent(kx_h a) { return p_destroy_agent(a); }

// kx_create_backend builds a params map from n key/value pairs (kv[2i], kv[2i+1]).
kx_st kx_create_backend(kx_h a, const char *plugin, char **kv, size_t n, kx_h *out) {
	kx_h params = NULL;
	kx_st st = p_create_params(&params);
	if (st != 0) return st;
	for (size_t i = 0; i < n && st == 0; i++) st = p_params_add(params, kv[2*i], kv[2*i+1]);
	if (st == 0) st = p_create_backend(a, plugin, params, out);
	p_destroy_params(params);
	return st;
}

// kx_plugins joins the available plugin names with '\n' into a malloc'd string.
kx_st kx_plugins(kx_h a, char **out) {
	kx_h l = NULL;
	kx_st st = p_get_available_plugins(a, &l);
	if (st != 0) return st;
	size_t n = 0, total = 1;
	p_string_list_size(l, &n);
	for (size_t i = 0; i < n; i++) { const char *s = ""; p_string_list_get(l, i, &s); total += strlen(s) + 1; }
	char *buf = malloc(total), *w = buf;
	for (size_t i = 0; i < n; i++) {
		const char *s = ""; p_string_list_get(l, i, &s);
		size_t k = strlen(s); memcpy(w, s, k); w += k; *w++ = '\n';
	}
	*w = 0;
	p_destroy_string_list(l);
	*out = buf;
	return 0;
}

// kx_reg builds a registration list of n (addr,len,dev) triples and registers
// (reg != 0) or deregisters it.
kx_st kx_reg(kx_h a, int mem, const uint64_t *t, size_t n, int reg) {
	kx_h d = NULL;
	kx_st st = p_create_reg_dlist(mem, &d, false);
	if (st != 0) return st;
	for (size_t i = 0; i < n && st == 0; i++) st = p_reg_dlist_add_desc(d, (uintptr_t)t[3*i], (size_t)t[3*i+1], t[3*i+2], NULL, 0);
	if (st == 0) st = reg ? p_register_mem(a, d, NULL) : p_deregister_mem(a, d, NULL);
	p_destroy_reg_dlist(d);
	return st;
}

static kx_st kx_dlist(int mem, const uint64_t *t, size_t n, kx_h *out) {
	kx_h d = NULL;
	kx_st st = p_create_xfer_dlist(mem, &d, false);
	if (st != 0) return st;
	for (size_t i = 0; i < n && st == 0; i++) st = p_xfer_dlist_add_desc(d, (uintptr_t)t[3*i], (size_t)t[3*i+1], t[3*i+2]);
	if (st != 0) { p_destroy_xfer_dlist(d); return st; }
	*out = d;
	return 0;
}

kx_st kx_prep(kx_h a, const char *peer, int mem, const uint64_t *t, size_t n, kx_h *out) {
	kx_h d = NULL;
	kx_st st = kx_dlist(mem, t, n, &d);
	if (st != 0) return st;
	st = p_prep_xfer_dlist(a, peer, d, out, NULL);
	p_destroy_xfer_dlist(d);
	return st;
}
kx_st kx_release_list(kx_h a, kx_h h) { return p_release_xfer_dlist_handle(a, h); }

// kx_notif_args returns opt args carrying a notification, or NULL for none.
static kx_h kx_notif_args(const void *msg, size_t len, bool has) {
	kx_h o = NULL;
	if (!has || p_create_opt_args(&o) != 0) return NULL;
	p_opt_args_set_notif_msg(o, len ? msg : NULL, len);
	p_opt_args_set_has_notif(o, true);
	return o;
}

kx_st kx_make(kx_h a, int op, kx_h l, const int *li, kx_h r, const int *ri, size_t n,
		const void *msg, size_t mlen, bool has, kx_h *out) {
	kx_h o = kx_notif_args(msg, mlen, has);
	kx_st st = p_make_xfer_req(a, op, l, li, n, r, ri, n, out, o);
	if (o) p_destroy_opt_args(o);
	return st;
}

kx_st kx_create(kx_h a, int op, int lmem, const uint64_t *lt, int rmem, const uint64_t *rt, size_t n,
		const char *peer, const void *msg, size_t mlen, bool has, kx_h *out) {
	kx_h l = NULL, r = NULL;
	kx_st st = kx_dlist(lmem, lt, n, &l);
	if (st != 0) return st;
	st = kx_dlist(rmem, rt, n, &r);
	if (st != 0) { p_destroy_xfer_dlist(l); return st; }
	kx_h o = kx_notif_args(msg, mlen, has);
	st = p_create_xfer_req(a, op, l, r, peer, out, o);
	if (o) p_destroy_opt_args(o);
	p_destroy_xfer_dlist(l);
	p_destroy_xfer_dlist(r);
	return st;
}

kx_st kx_post(kx_h a, kx_h x) { return p_post_xfer_req(a, x, NULL); }
kx_st kx_status(kx_h a, kx_h x) { return p_get_xfer_status(a, x); }

// kx_release releases a request and frees its wrapper; a failed release keeps it.
kx_st kx_release(kx_h a, kx_h x) {
	kx_st st = p_release_xfer_req(a, x);
	if (st == 0) p_destroy_xfer_req(x);
	return st;
}

kx_st kx_local_md(kx_h a, void **data, size_t *len) { return p_get_local_md(a, data, len); }
kx_st kx_load_md(kx_h a, const void *d, size_t n, char **name) { return p_load_remote_md(a, d, n, name); }
kx_st kx_invalidate(kx_h a, const char *peer) { return p_invalidate_remote_md(a, peer); }
kx_st kx_check_md(kx_h a, const char *peer) { return p_check_remote_md(a, peer, NULL); }
kx_st kx_gen_notif(kx_h a, const char *peer, const void *m, size_t n) { return p_gen_notif(a, peer, m, n, NULL); }
kx_st kx_new_notif_map(kx_h *m) { return p_create_notif_map(m); }
kx_st kx_free_notif_map(kx_h m) { return p_destroy_notif_map(m); }

// kx_drain fetches notifications into map m and flattens them into one malloc'd
// buffer of records: u32 name length, name, u32 message length, message.
kx_st kx_drain(kx_h a, kx_h m, char **out, size_t *outlen) {
	*out = NULL; *outlen = 0;
	kx_st st = p_get_notifs(a, m, NULL);
	if (st != 0) return st;
	size_t na = 0, total = 0;
	p_notif_map_size(m, &na);
	if (na == 0) return 0;
	for (size_t i = 0; i < na; i++) {
		const char *name = NULL; size_t k = 0;
		if (p_notif_map_get_agent_at(m, i, &name) != 0) continue;
		p_notif_map_get_notifs_size(m, name, &k);
		for (size_t j = 0; j < k; j++) {
			const void *d = NULL; size_t dl = 0;
			p_notif_map_get_notif(m, name, j, &d, &dl);
			total += 8 + strlen(name) + dl;
		}
	}
	char *buf = malloc(total ? total : 1), *w = buf;
	for (size_t i = 0; i < na; i++) {
		const char *name = NULL; size_t k = 0;
		if (p_notif_map_get_agent_at(m, i, &name) != 0) continue;
		uint32_t nl = (uint32_t)strlen(name);
		p_notif_map_get_notifs_size(m, name, &k);
		for (size_t j = 0; j < k; j++) {
			const void *d = NULL; size_t dl = 0;
			p_notif_map_get_notif(m, name, j, &d, &dl);
			uint32_t l32 = (uint32_t)dl;
			memcpy(w, &nl, 4); w += 4; memcpy(w, name, nl); w += nl;
			memcpy(w, &l32, 4); w += 4; if (dl) memcpy(w, d, dl); w += dl;
		}
	}
	p_notif_map_clear(m);
	*out = buf; *outlen = (size_t)(w - buf);
	return 0;
}
