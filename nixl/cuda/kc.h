// kc.h: kvxfer's view of the few CUDA driver entry points it uses, resolved
// with dlsym from libcuda.so.1 at run time (kc.c). Nothing here needs the CUDA
// toolkit to build: the types are declared by us from the driver ABI
// (CUdeviceptr is 64-bit, CUcontext a pointer, CUresult an int enum,
// CUipcMemHandle a 64-byte struct passed by value).
#ifndef KVXFER_CUDA_KC_H
#define KVXFER_CUDA_KC_H

#include <stddef.h>
#include <stdint.h>

typedef void *kc_ctx;

const char *kc_open(const char *path);
int kc_init(void);
int kc_device_count(int *n);
int kc_ctx_retain(int dev, kc_ctx *out);
int kc_ctx_release(int dev);
const char *kc_error_name(int code);
int kc_ipc_open(kc_ctx c, const void *handle64, uint64_t *out);
int kc_ipc_close(kc_ctx c, uint64_t ptr);
int kc_ipc_get(kc_ctx c, uint64_t ptr, void *handle64);
int kc_addr_range(kc_ctx c, uint64_t ptr, uint64_t *base, uint64_t *size);
int kc_ptr_device(kc_ctx c, uint64_t ptr, int *dev);
int kc_copy_dtod(kc_ctx c, uint64_t dst, uint64_t src, uint64_t n);
int kc_copy_peer(kc_ctx dc, uint64_t dst, kc_ctx sc, uint64_t src, uint64_t n);
int kc_copy_dtoh(kc_ctx c, void *dst, uint64_t src, uint64_t n);
int kc_copy_htod(kc_ctx c, uint64_t dst, const void *src, uint64_t n);
int kc_alloc(kc_ctx c, uint64_t n, uint64_t *out);
int kc_free(kc_ctx c, uint64_t ptr);
int kc_memset(kc_ctx c, uint64_t ptr, unsigned char v, uint64_t n);

#endif
