package sgltest

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/daemon"
)

// TestPluginTopologyArgs: the SGLang plug-in passes the rank's place in the
// model to its kvxferd (python/kvxfer topology_args): KV head counts for MHA,
// the PP stage's first layer, the pool's layer ids, as SGLang's KVArgs hold
// them; and kvxferd reads the layer ids back.
func TestPluginTopologyArgs(t *testing.T) {
	v := needVenv(t, Versions()[0])
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..")
	code := `
import json, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
import kvx_sglang_shim; kvx_sglang_shim.install()
from types import SimpleNamespace as N
from kvxfer.sglang_prefill import topology_args
print(json.dumps([
    topology_args(N(kv_head_num=4, total_kv_head_num=8, prefill_start_layer=2, kv_layer_ids=[2, 3, 2, 3]), False),
    topology_args(N(kv_head_num=1, total_kv_head_num=None, prefill_start_layer=0, kv_layer_ids=[]), True),
]))`
	out, err := exec.Command(v.Python, "-c", code, filepath.Join(root, "python"), filepath.Join(root, "tests", "sglang", "stubs")).Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got [][]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := []string{"-kv-head-num", "4", "-total-kv-heads", "8", "-prefill-start-layer", "2", "-kv-layer-ids", "2,3,2,3"}
	if !slices.Equal(got[0], want) || len(got[1]) != 0 {
		t.Fatalf("topology_args: %q and %q, want %q and nothing for MLA stage 0", got[0], got[1], want)
	}
	ids, err := daemon.ParseLayerIDs(got[0][7])
	if err != nil || !slices.Equal(ids, []int{2, 3, 2, 3}) {
		t.Fatalf("kvxferd reads %q as %v, %v", got[0][7], ids, err)
	}
}
