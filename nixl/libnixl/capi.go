package libnixl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Our own declarations of the libnixl_capi ABI (NIXL's src/bindings/rust/wrapper.h,
// which is not installed). Handles are opaque pointers; statuses are C enums (int).
typedef void *kx_h;
typedef int kx_st;

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
static const char *kx_open(const char *path) {
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

static int kx_has_raw(void) { return r_post != NULL && r_status != NULL; }

// The C API's agent and request wrappers hold the C++ pointer as their first
// field (struct nixl_capi_agent_s { nixlAgent *inner; }, nixl_capi_xfer_req_s
// { nixlXferReqH *req; }); a non-virtual const member function takes this as
// its first argument. A NULL extra keeps the notification given at creation.
static int kx_raw_post(kx_h a, kx_h x) { return r_post(*(void **)a, *(void **)x, NULL); }
static int kx_raw_status(kx_h a, kx_h x) { return r_status(*(void **)a, *(void **)x); }

// Trampolines: cgo cannot call C function pointers directly. The ones below
// also batch what would otherwise be one cgo crossing per descriptor or index.

static kx_st kx_create_agent(const char *name, bool prog, int sync, kx_h *out) {
	kx_agent_config c;
	memset(&c, 0, sizeof c);
	c.enable_prog_thread = prog;
	c.listen_port = 8888;
	c.thread_sync = sync;
	c.num_workers = 1;
	c.lthr_delay_us = 100000;
	return p_create_configured_agent(name, &c, out);
}
static kx_st kx_destroy_agent(kx_h a) { return p_destroy_agent(a); }

// kx_create_backend builds a params map from n key/value pairs (kv[2i], kv[2i+1]).
static kx_st kx_create_backend(kx_h a, const char *plugin, char **kv, size_t n, kx_h *out) {
	kx_h params = NULL;
	kx_st st = p_create_params(&params);
	if (st != 0) return st;
	for (size_t i = 0; i < n && st == 0; i++) st = p_params_add(params, kv[2*i], kv[2*i+1]);
	if (st == 0) st = p_create_backend(a, plugin, params, out);
	p_destroy_params(params);
	return st;
}

// kx_plugins joins the available plugin names with '\n' into a malloc'd string.
static kx_st kx_plugins(kx_h a, char **out) {
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
static kx_st kx_reg(kx_h a, int mem, const uint64_t *t, size_t n, int reg) {
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

static kx_st kx_prep(kx_h a, const char *peer, int mem, const uint64_t *t, size_t n, kx_h *out) {
	kx_h d = NULL;
	kx_st st = kx_dlist(mem, t, n, &d);
	if (st != 0) return st;
	st = p_prep_xfer_dlist(a, peer, d, out, NULL);
	p_destroy_xfer_dlist(d);
	return st;
}
static kx_st kx_release_list(kx_h a, kx_h h) { return p_release_xfer_dlist_handle(a, h); }

// kx_notif_args returns opt args carrying a notification, or NULL for none.
static kx_h kx_notif_args(const void *msg, size_t len, bool has) {
	kx_h o = NULL;
	if (!has || p_create_opt_args(&o) != 0) return NULL;
	p_opt_args_set_notif_msg(o, len ? msg : NULL, len);
	p_opt_args_set_has_notif(o, true);
	return o;
}

static kx_st kx_make(kx_h a, int op, kx_h l, const int *li, kx_h r, const int *ri, size_t n,
		const void *msg, size_t mlen, bool has, kx_h *out) {
	kx_h o = kx_notif_args(msg, mlen, has);
	kx_st st = p_make_xfer_req(a, op, l, li, n, r, ri, n, out, o);
	if (o) p_destroy_opt_args(o);
	return st;
}

static kx_st kx_create(kx_h a, int op, int lmem, const uint64_t *lt, int rmem, const uint64_t *rt, size_t n,
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

static kx_st kx_post(kx_h a, kx_h x) { return p_post_xfer_req(a, x, NULL); }
static kx_st kx_status(kx_h a, kx_h x) { return p_get_xfer_status(a, x); }

// kx_release releases a request and frees its wrapper; a failed release keeps it.
static kx_st kx_release(kx_h a, kx_h x) {
	kx_st st = p_release_xfer_req(a, x);
	if (st == 0) p_destroy_xfer_req(x);
	return st;
}

static kx_st kx_local_md(kx_h a, void **data, size_t *len) { return p_get_local_md(a, data, len); }
static kx_st kx_load_md(kx_h a, const void *d, size_t n, char **name) { return p_load_remote_md(a, d, n, name); }
static kx_st kx_invalidate(kx_h a, const char *peer) { return p_invalidate_remote_md(a, peer); }
static kx_st kx_check_md(kx_h a, const char *peer) { return p_check_remote_md(a, peer, NULL); }
static kx_st kx_gen_notif(kx_h a, const char *peer, const void *m, size_t n) { return p_gen_notif(a, peer, m, n, NULL); }
static kx_st kx_new_notif_map(kx_h *m) { return p_create_notif_map(m); }
static kx_st kx_free_notif_map(kx_h m) { return p_destroy_notif_map(m); }

// kx_drain fetches notifications into map m and flattens them into one malloc'd
// buffer of records: u32 name length, name, u32 message length, message.
static kx_st kx_drain(kx_h a, kx_h m, char **out, size_t *outlen) {
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
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/kvxfer/kvxfer/nixl"
)

// Statuses are handled as NIXL's own nixl_status_t values. The C API's codes
// are translated by nx; the raw post/status entry points return them as is.
const (
	stSuccess    = 0   // NIXL_SUCCESS
	stInProg     = 1   // NIXL_IN_PROG
	stInvalid    = -2  // NIXL_ERR_INVALID_PARAM
	stBackend    = -3  // NIXL_ERR_BACKEND
	stNotFound   = -4  // NIXL_ERR_NOT_FOUND
	stRepost     = -7  // NIXL_ERR_REPOST_ACTIVE
	stUnknown    = -8  // NIXL_ERR_UNKNOWN
	stDisconnect = -10 // NIXL_ERR_REMOTE_DISCONNECT
)

// nx translates a nixl_capi_status_t. The wheel's C API (NIXL 1.5) keeps
// INVALID_PARAM (-1) and NOT_FOUND (-6) apart and reports every other error as
// BACKEND (-2); -3 is its INVALID_STATE, -4 a caught exception.
func nx(st C.kx_st) int {
	switch st {
	case 0, 1:
		return int(st)
	case -1:
		return stInvalid
	case -6:
		return stNotFound
	case -2:
		return stBackend
	}
	return stUnknown
}

// rawStatus is set when load found nixlAgent's own post/status functions and
// $KVXFER_LIBNIXL_STATUS is not "capi".
var rawStatus bool

// handle is an opaque libnixl_capi pointer (C memory; Go may keep it).
type handle = C.kx_h

var (
	loadMu   sync.Mutex
	loadOnce sync.Once
	loadErr  error
	loadPath string
)

// ensureLoaded finds and loads the library unless one is loaded already (a
// process holds one libnixl; Find runs a Python interpreter, so only once).
func ensureLoaded(path string) error {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loadPath != "" {
		return nil
	}
	p, err := Find(path)
	if err != nil {
		return err
	}
	if err := load(p); err != nil {
		return fmt.Errorf("libnixl: load %s: %v", p, err)
	}
	return nil
}

// load dlopens path once per process. A process can only hold one libnixl: a
// second call with another path reports the first one's outcome.
func load(path string) error {
	loadOnce.Do(func() {
		cp := C.CString(path)
		defer C.free(unsafe.Pointer(cp))
		if msg := C.kx_open(cp); msg != nil {
			loadErr = errors.New(C.GoString(msg))
			return
		}
		loadPath = path
		rawStatus = C.kx_has_raw() != 0 && os.Getenv("KVXFER_LIBNIXL_STATUS") != "capi"
	})
	return loadErr
}

func cstr(s string) *C.char { return C.CString(s) }

func cfree(p *C.char) { C.free(unsafe.Pointer(p)) }

// triples flattens descriptors to (addr, len, dev) for the batching trampolines.
func triples(ds []nixl.Desc) []uint64 {
	t := make([]uint64, 0, 3*len(ds))
	for _, d := range ds {
		t = append(t, uint64(d.Addr), d.Len, d.DevID)
	}
	return t
}

func u64p(t []uint64) *C.uint64_t {
	if len(t) == 0 {
		return nil
	}
	return (*C.uint64_t)(unsafe.Pointer(&t[0]))
}

func bytesp(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func capiCreateAgent(name string, prog bool, sync int) (handle, int) {
	cn := cstr(name)
	defer cfree(cn)
	var a handle
	st := C.kx_create_agent(cn, C.bool(prog), C.int(sync), &a)
	return a, nx(st)
}

func capiDestroyAgent(a handle) int { return nx(C.kx_destroy_agent(a)) }

func capiPlugins(a handle) ([]string, int) {
	var out *C.char
	if st := C.kx_plugins(a, &out); st != 0 {
		return nil, nx(st)
	}
	defer cfree(out)
	return strings.Fields(C.GoString(out)), 0
}

func capiCreateBackend(a handle, plugin string, params map[string]string) int {
	cp := cstr(plugin)
	defer cfree(cp)
	kv := C.malloc(C.size_t(unsafe.Sizeof(uintptr(0))) * C.size_t(2*len(params)+1))
	defer C.free(kv)
	arr := unsafe.Slice((**C.char)(kv), 2*len(params)+1)
	i := 0
	for k, v := range params {
		arr[2*i], arr[2*i+1] = cstr(k), cstr(v)
		i++
	}
	defer func() {
		for j := range 2 * i {
			cfree(arr[j])
		}
	}()
	var b handle
	return nx(C.kx_create_backend(a, cp, (**C.char)(kv), C.size_t(i), &b))
}

func capiReg(a handle, kind nixl.MemKind, ds []nixl.Desc, reg bool) int {
	t := triples(ds)
	r := 0
	if reg {
		r = 1
	}
	return nx(C.kx_reg(a, C.int(kind), u64p(t), C.size_t(len(ds)), C.int(r)))
}

func capiLocalMD(a handle) ([]byte, int) {
	var p unsafe.Pointer
	var n C.size_t
	if st := C.kx_local_md(a, &p, &n); st != 0 {
		return nil, nx(st)
	}
	defer C.free(p)
	return C.GoBytes(p, C.int(n)), 0
}

func capiLoadMD(a handle, md []byte) (string, int) {
	var name *C.char
	st := C.kx_load_md(a, bytesp(md), C.size_t(len(md)), &name)
	if st != 0 {
		return "", nx(st)
	}
	defer cfree(name)
	return C.GoString(name), 0
}

func capiInvalidate(a handle, peer string) int {
	cp := cstr(peer)
	defer cfree(cp)
	return nx(C.kx_invalidate(a, cp))
}

func capiCheckMD(a handle, peer string) int {
	cp := cstr(peer)
	defer cfree(cp)
	return nx(C.kx_check_md(a, cp))
}

func capiPrep(a handle, peer string, kind nixl.MemKind, ds []nixl.Desc) (handle, int) {
	cp := cstr(peer)
	defer cfree(cp)
	t := triples(ds)
	var h handle
	st := C.kx_prep(a, cp, C.int(kind), u64p(t), C.size_t(len(ds)), &h)
	return h, nx(st)
}

func capiReleaseList(a, h handle) int { return nx(C.kx_release_list(a, h)) }

func capiOp(op nixl.Op) C.int {
	if op == nixl.Write {
		return 1 // NIXL_CAPI_XFER_OP_WRITE
	}
	return 0
}

func capiMake(a handle, op nixl.Op, l handle, li []int32, r handle, ri []int32, notif []byte) (handle, int) {
	var x handle
	st := C.kx_make(a, capiOp(op), l, (*C.int)(unsafe.Pointer(&li[0])), r, (*C.int)(unsafe.Pointer(&ri[0])),
		C.size_t(len(li)), bytesp(notif), C.size_t(len(notif)), C.bool(notif != nil), &x)
	return x, nx(st)
}

func capiCreate(a handle, op nixl.Op, lk nixl.MemKind, l []nixl.Desc, peer string, rk nixl.MemKind, r []nixl.Desc, notif []byte) (handle, int) {
	cp := cstr(peer)
	defer cfree(cp)
	lt, rt := triples(l), triples(r)
	var x handle
	st := C.kx_create(a, capiOp(op), C.int(lk), u64p(lt), C.int(rk), u64p(rt), C.size_t(len(l)), cp,
		bytesp(notif), C.size_t(len(notif)), C.bool(notif != nil), &x)
	return x, nx(st)
}

func capiPost(a, x handle) int {
	if rawStatus {
		return int(C.kx_raw_post(a, x))
	}
	return nx(C.kx_post(a, x))
}

func capiStatus(a, x handle) int {
	if rawStatus {
		return int(C.kx_raw_status(a, x))
	}
	return nx(C.kx_status(a, x))
}
func capiRelease(a, x handle) int { return nx(C.kx_release(a, x)) }

func capiGenNotif(a handle, peer string, msg []byte) int {
	cp := cstr(peer)
	defer cfree(cp)
	return nx(C.kx_gen_notif(a, cp, bytesp(msg), C.size_t(len(msg))))
}

func capiNewNotifMap() (handle, int) {
	var m handle
	st := C.kx_new_notif_map(&m)
	return m, nx(st)
}

func capiFreeNotifMap(m handle) { C.kx_free_notif_map(m) }

// capiDrain appends every pending notification to dst.
func capiDrain(a, m handle, dst []nixl.Notif) ([]nixl.Notif, int) {
	var buf *C.char
	var n C.size_t
	if st := C.kx_drain(a, m, &buf, &n); st != 0 {
		return dst, nx(st)
	}
	if buf == nil {
		return dst, 0
	}
	defer cfree(buf)
	b := C.GoBytes(unsafe.Pointer(buf), C.int(n))
	for len(b) >= 8 {
		nl := binary.LittleEndian.Uint32(b)
		name := string(b[4 : 4+nl])
		b = b[4+nl:]
		ml := binary.LittleEndian.Uint32(b)
		dst = append(dst, nixl.Notif{Peer: name, Msg: string(b[4 : 4+ml])})
		b = b[4+ml:]
	}
	return dst, 0
}
