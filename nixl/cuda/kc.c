// kc.c: dlopen/dlsym of libcuda.so.1 and the trampolines Go calls (cgo cannot
// call C function pointers). Every call that needs a context makes the given
// primary context current on the calling OS thread first, inside the same C
// call, so Go's goroutine scheduling can never run it under another context.
// Copies end with cuCtxSynchronize: device-to-device copies do not block the
// host, and the caller reports completion (and sends notifications) only
// after the bytes have landed.
#include <dlfcn.h>
#include <string.h>

#include "kc.h"

typedef unsigned long long kc_dptr;
typedef struct {
	char reserved[64];
} kc_ipc_handle;

#define KC_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define KC_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1

static void *kc_lib;
static int (*p_init)(unsigned int);
static int (*p_device_get_count)(int *);
static int (*p_device_get)(int *, int);
static int (*p_primary_retain)(kc_ctx *, int);
static int (*p_primary_release)(int);
static int (*p_ctx_set_current)(kc_ctx);
static int (*p_ctx_synchronize)(void);
static int (*p_get_error_name)(int, const char **);
static int (*p_ipc_open)(kc_dptr *, kc_ipc_handle, unsigned int);
static int (*p_ipc_close)(kc_dptr);
static int (*p_ipc_get)(kc_ipc_handle *, kc_dptr);
static int (*p_addr_range)(kc_dptr *, size_t *, kc_dptr);
static int (*p_ptr_attr)(void *, int, kc_dptr);
static int (*p_dtod)(kc_dptr, kc_dptr, size_t);
static int (*p_peer)(kc_dptr, kc_ctx, kc_dptr, kc_ctx, size_t);
static int (*p_dtoh)(void *, kc_dptr, size_t);
static int (*p_htod)(kc_dptr, const void *, size_t);
static int (*p_alloc)(kc_dptr *, size_t);
static int (*p_free)(kc_dptr);
static int (*p_memset)(kc_dptr, unsigned char, size_t);

// sym resolves the versioned name first (the CUDA headers map the plain names
// to these since CUDA 4/11), then the plain one.
static void *sym(const char *v2, const char *plain) {
	void *p = v2 ? dlsym(kc_lib, v2) : NULL;
	if (!p && plain) p = dlsym(kc_lib, plain);
	return p;
}

#define KC_SYM(dst, v2, plain)                        \
	do {                                              \
		*(void **)(&dst) = sym(v2, plain);            \
		if (!dst) return "missing symbol " plain;     \
	} while (0)

const char *kc_open(const char *path) {
	kc_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!kc_lib) return dlerror();
	KC_SYM(p_init, NULL, "cuInit");
	KC_SYM(p_device_get_count, NULL, "cuDeviceGetCount");
	KC_SYM(p_device_get, NULL, "cuDeviceGet");
	KC_SYM(p_primary_retain, NULL, "cuDevicePrimaryCtxRetain");
	KC_SYM(p_primary_release, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
	KC_SYM(p_ctx_set_current, NULL, "cuCtxSetCurrent");
	KC_SYM(p_ctx_synchronize, NULL, "cuCtxSynchronize");
	KC_SYM(p_get_error_name, NULL, "cuGetErrorName");
	KC_SYM(p_ipc_open, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle");
	KC_SYM(p_ipc_close, NULL, "cuIpcCloseMemHandle");
	KC_SYM(p_ipc_get, NULL, "cuIpcGetMemHandle");
	KC_SYM(p_addr_range, "cuMemGetAddressRange_v2", "cuMemGetAddressRange");
	KC_SYM(p_ptr_attr, NULL, "cuPointerGetAttribute");
	KC_SYM(p_dtod, "cuMemcpyDtoD_v2", "cuMemcpyDtoD");
	KC_SYM(p_peer, NULL, "cuMemcpyPeer");
	KC_SYM(p_dtoh, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
	KC_SYM(p_htod, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
	KC_SYM(p_alloc, "cuMemAlloc_v2", "cuMemAlloc");
	KC_SYM(p_free, "cuMemFree_v2", "cuMemFree");
	KC_SYM(p_memset, "cuMemsetD8_v2", "cuMemsetD8");
	return NULL;
}

int kc_init(void) { return p_init(0); }
int kc_device_count(int *n) { return p_device_get_count(n); }

int kc_ctx_retain(int ordinal, kc_ctx *out) {
	int dev;
	int st = p_device_get(&dev, ordinal);
	if (st) return st;
	return p_primary_retain(out, dev);
}

int kc_ctx_release(int ordinal) {
	int dev;
	int st = p_device_get(&dev, ordinal);
	if (st) return st;
	return p_primary_release(dev);
}

const char *kc_error_name(int code) {
	const char *s = NULL;
	if (p_get_error_name && p_get_error_name(code, &s) == 0) return s;
	return NULL;
}

#define KC_CUR(c)                             \
	do {                                      \
		int st_ = p_ctx_set_current(c);       \
		if (st_) return st_;                  \
	} while (0)

int kc_ipc_open(kc_ctx c, const void *handle64, uint64_t *out) {
	KC_CUR(c);
	kc_ipc_handle h;
	memcpy(h.reserved, handle64, sizeof h.reserved);
	kc_dptr p = 0;
	int st = p_ipc_open(&p, h, KC_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	*out = p;
	return st;
}

int kc_ipc_close(kc_ctx c, uint64_t ptr) {
	KC_CUR(c);
	return p_ipc_close(ptr);
}

int kc_ipc_get(kc_ctx c, uint64_t ptr, void *handle64) {
	KC_CUR(c);
	kc_ipc_handle h;
	int st = p_ipc_get(&h, ptr);
	if (!st) memcpy(handle64, h.reserved, sizeof h.reserved);
	return st;
}

int kc_addr_range(kc_ctx c, uint64_t ptr, uint64_t *base, uint64_t *size) {
	KC_CUR(c);
	kc_dptr b = 0;
	size_t n = 0;
	int st = p_addr_range(&b, &n, ptr);
	*base = b;
	*size = n;
	return st;
}

int kc_ptr_device(kc_ctx c, uint64_t ptr, int *dev) {
	KC_CUR(c);
	return p_ptr_attr(dev, KC_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
}

int kc_copy_dtod(kc_ctx c, uint64_t dst, uint64_t src, uint64_t n) {
	KC_CUR(c);
	int st = p_dtod(dst, src, n);
	return st ? st : p_ctx_synchronize();
}

int kc_copy_peer(kc_ctx dc, uint64_t dst, kc_ctx sc, uint64_t src, uint64_t n) {
	KC_CUR(sc);
	int st = p_peer(dst, dc, src, sc, n);
	if (st) return st;
	st = p_ctx_synchronize();
	if (st) return st;
	KC_CUR(dc);
	return p_ctx_synchronize();
}

int kc_copy_dtoh(kc_ctx c, void *dst, uint64_t src, uint64_t n) {
	KC_CUR(c);
	return p_dtoh(dst, src, n);
}

int kc_copy_htod(kc_ctx c, uint64_t dst, const void *src, uint64_t n) {
	KC_CUR(c);
	int st = p_htod(dst, src, n);
	return st ? st : p_ctx_synchronize();
}

int kc_alloc(kc_ctx c, uint64_t n, uint64_t *out) {
	KC_CUR(c);
	kc_dptr p = 0;
	int st = p_alloc(&p, n);
	*out = p;
	return st;
}

int kc_free(kc_ctx c, uint64_t ptr) {
	KC_CUR(c);
	return p_free(ptr);
}

int kc_memset(kc_ctx c, uint64_t ptr, unsigned char v, uint64_t n) {
	KC_CUR(c);
	int st = p_memset(ptr, v, n);
	return st ? st : p_ctx_synchronize();
}
