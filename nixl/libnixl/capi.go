package libnixl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "kx.h"
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

func capiCreateAgent(name string, prog bool, sync int, delayUs uint64) (handle, int) {
	cn := cstr(name)
	defer cfree(cn)
	var a handle
	st := C.kx_create_agent(cn, C.bool(prog), C.int(sync), C.uint64_t(delayUs), &a)
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
