package bootstrap

import (
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"reflect"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// cpythonScript builds frames and JSON bodies the way the SGLang decode/prefill code does
// (struct, json.dumps, the pack_int_lists definition of §4.3e), with CPython's own
// semantics. numpy is not assumed: int32 indices use struct "<ni", which is what
// ndarray(int32).tobytes() produces on little-endian hosts.
const cpythonScript = `
import json, struct, sys
def plb(bufs):
    if not bufs: return b""
    return struct.pack(f"<{len(bufs)+1}I", len(bufs), *(len(b) for b in bufs)) + b"".join(bufs)
def pil(lists, fmt): return plb([struct.pack(f"<{len(a)}{fmt}", *a) for a in lists])
G = b"NixlMsgGuard"
kv = [0x7f0000001000, 0x7f0000002000]
reg = [G, b"None", b"10.0.0.7", str(41235).encode("ascii"), b"agent-1", b"\x00md",
       b"".join(struct.pack("Q", p) for p in kv), b"".join(struct.pack("Q", p) for p in [0x5000]),
       pil([[0x1000], []], "Q"), b"3", b"2", b"1", str(4096).encode("ascii"),
       pil([[64, 128]], "I"), pil([], "I"), b"", b"", b"1000", ",".join(["VRAM", "DRAM"]).encode("ascii"),
       b"".join(struct.pack("Q", l) for l in [4096, 8192]),
       pil([[5]], "I"), b"".join(struct.pack("I", l) for l in [0, 1]), b"2", b"1"]
ti = [G, str(2**63 - 1).encode("ascii"), b"10.0.0.7", b"41235", b"agent-1",
      struct.pack("<3i", 7, 8, -9), b"5", b"1", pil([[3], [-1]], "i"), str(0).encode("ascii"), b"0"]
ab = [b"ABORT", b"42", b"10.0.0.7", b"41235"]
st = [b"KV_STATUS", b"42", str(int(0)).encode("ascii"), b"3", "caf\u00e9".encode("utf-8")]
put = json.dumps({"attn_tp_size": 2, "attn_tp_rank": 1, "attn_cp_size": 1, "attn_cp_rank": 0,
    "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1,
    "system_dp_rank": 0, "rank_ip": "10.0.0.1", "rank_port": 5001, "page_size": 16,
    "kv_cache_dtype": "auto", "load_balance_method": "round_robin",
    "enable_dsa_cache_layer_split": False, "prefill_http_port": 30000})
info = json.dumps(dict(attn_tp_size=2, attn_cp_size=1, dp_size=1, pp_size=1, page_size=16,
    kv_cache_dtype="auto", follow_bootstrap_room=False, enable_dsa_cache_layer_split=False,
    prefill_http_port=30000, target_tp_rank=None, target_tp_ranks=None, target_cp_ranks=None,
    target_pp_ranks=None, required_dst_info_num=None, required_prefill_response_num=None))
hx = lambda fs: [f.hex() for f in fs]
json.dump({"reg": hx(reg), "ti": hx(ti), "abort": hx(ab), "status": hx(st), "put": put, "info": info}, sys.stdout)
`

// TestCPythonInterop cross-checks the codecs against frames and JSON produced by CPython
// itself (skipped when python3 is not installed).
func TestCPythonInterop(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not available")
	}
	out, err := exec.Command(py, "-c", cpythonScript).Output()
	if err != nil {
		t.Skipf("python3 failed: %v", err)
	}
	var res struct {
		Reg, TI, Abort, Status []string
		Put, Info              string
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	unhex := func(hs []string) [][]byte {
		f := make([][]byte, len(hs))
		for i, h := range hs {
			f[i], _ = hex.DecodeString(h)
		}
		return f
	}
	for name, frames := range map[string][][]byte{"reg": unhex(res.Reg), "ti": unhex(res.TI), "abort": unhex(res.Abort)} {
		m, err := wire.DecodeInbound(frames)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if enc := m.Encode(); !reflect.DeepEqual(enc, frames) {
			t.Fatalf("%s: Go encoding differs from CPython:\n%q\n%q", name, enc, frames)
		}
	}
	reg, _ := wire.DecodeInbound(unhex(res.Reg))
	if r := reg.(*wire.Registration); !r.HasLayerInfo || r.KVItemLens[1] != 8192 || r.KVMemKinds[1] != wire.MemDRAM || r.DCPSize != 2 {
		t.Fatalf("registration %+v", r)
	}
	ti, _ := wire.DecodeInbound(unhex(res.TI))
	if x := ti.(*wire.TransferInfo); x.Room != 1<<63-1 || x.DstKVIndices[2] != -9 || x.IsDummy() {
		t.Fatalf("transfer info %+v", x)
	}
	st, err := wire.DecodeOutbound(unhex(res.Status))
	if err != nil || st.(*wire.KVStatus).Reason != "caf\u00e9" {
		t.Fatalf("status %+v %v", st, err)
	}
	if got := (&wire.KVStatus{Room: 42, Status: kv.StatusFailed, PrefillRank: 3, Reason: "caf\u00e9"}).Encode(); !reflect.DeepEqual(got, unhex(res.Status)) {
		t.Fatalf("KV_STATUS differs from CPython: %q", got)
	}
	if got := string(rankReg(1, 5001).JSON()); got != res.Put {
		t.Fatalf("PUT body differs from CPython json.dumps:\n%s\n%s", got, res.Put)
	}
	s := NewBootstrapServer(BootstrapConfig{})
	do(t, s.Handler(), "PUT", "/route", string(rankReg(0, 5000).JSON())).is(t, 200, "OK")
	do(t, s.Handler(), "PUT", "/route", string(rankReg(1, 5001).JSON())).is(t, 200, "OK")
	do(t, s.Handler(), "GET", topoQuery, "").is(t, 200, res.Info)
}
