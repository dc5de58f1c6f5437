package workload

import (
	"encoding/json"
	"testing"
)

// TestAbortKindPacksPhaseAndSource: every phase and source round-trips through
// AbortKind, the emulators' kinds are the phases their docs name, and names
// survive JSON.
func TestAbortKindPacksPhaseAndSource(t *testing.T) {
	seen := map[AbortKind]bool{}
	for p := NoAbort; p < numPhases; p++ {
		for _, s := range []Source{Decode, Client} {
			k := Abort(p, s)
			if p == NoAbort {
				if k != AbortNone || k.byDecode() || k.ByPrefill() {
					t.Fatalf("Abort(none, %v) = %v", s, k)
				}
				continue
			}
			if k.Phase() != p || k.From() != s || k.byDecode() != (s == Decode) || k.ByPrefill() != (s == Client) {
				t.Fatalf("Abort(%v, %v) = %v: phase %v from %v", p, s, k, k.Phase(), k.From())
			}
			if seen[k] {
				t.Fatalf("Abort(%v, %v) collides", p, s)
			}
			seen[k] = true
		}
	}
	for k, want := range map[AbortKind]AbortKind{
		AbortDecodeBeforeInfo: Abort(BeforeSender, Decode), AbortDecodeAfterInfo: Abort(AfterInfo, Decode),
		AbortPrefillClient: Abort(AfterInit, Client), AbortPrefillMidTransfer: Abort(InChunk, Client),
	} {
		if k != want {
			t.Errorf("%v is %v/%v", k, k.Phase(), k.From())
		}
	}
	if AbortPrefillMidTransfer.String() != "prefill-mid-transfer" || Abort(InChunk, Decode).String() != "in-chunk/decode" ||
		Phase(99).String() != "phase(99)" || AbortNone.String() != "none" {
		t.Fatal("names")
	}
	if len(AbortKinds()) != 5 || AbortKinds()[0] != AbortNone {
		t.Fatalf("AbortKinds %v", AbortKinds())
	}
	b, err := json.Marshal(struct {
		P []Phase
		S []Source
	}{[]Phase{BeforeSender, AfterInit, AfterSuccess}, []Source{Decode, Client}})
	if err != nil || string(b) != `{"P":["before-sender","after-init","after-success"],"S":["decode","client"]}` {
		t.Fatalf("JSON %s %v", b, err)
	}
	var back struct {
		P []Phase
		S []Source
	}
	if err := json.Unmarshal(b, &back); err != nil || back.P[1] != AfterInit || back.S[1] != Client {
		t.Fatalf("round trip %+v %v", back, err)
	}
	var p Phase
	if p.UnmarshalText([]byte("later")) == nil {
		t.Fatal("unknown phase accepted")
	}
}
