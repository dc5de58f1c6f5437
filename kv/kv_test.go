package kv

import "testing"

func TestReasonNames(t *testing.T) {
	for _, r := range Reasons() {
		got, err := ParseReason(r.String())
		if err != nil || got != r {
			t.Fatalf("ParseReason(%q) = %v, %v", r.String(), got, err)
		}
	}
	if _, err := ParseReason("nope"); err == nil {
		t.Fatal("ParseReason accepted an unknown name")
	}
}

// The numeric values are SGLang's KVPoll, on the wire and all-reduced with MIN.
func TestStatusValues(t *testing.T) {
	for st, want := range map[Status]uint8{StatusFailed: 0, StatusBootstrapping: 1, StatusWaitingForInput: 2, StatusTransferring: 3, StatusSuccess: 4} {
		if uint8(st) != want {
			t.Errorf("%v = %d, want %d", st, st, want)
		}
	}
	for _, st := range []Status{StatusFailed, StatusSuccess} {
		if !st.Terminal() {
			t.Errorf("%v not terminal", st)
		}
	}
	for _, st := range []Status{StatusBootstrapping, StatusWaitingForInput, StatusTransferring} {
		if st.Terminal() {
			t.Errorf("%v terminal", st)
		}
	}
}
