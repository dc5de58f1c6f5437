package decode

import (
	"reflect"
	"testing"
)

func TestResolveMapping(t *testing.T) {
	cases := []struct {
		name               string
		ptp, pp, dtp, rank int
		mla                bool
		tp                 []int
		pps                []int
		dstInfo, responses int
		dummies            []int
	}{
		{"equal", 2, 1, 2, 1, false, []int{1}, []int{0}, 1, 1, nil},
		{"decode wider", 2, 1, 4, 3, false, []int{1}, []int{0}, 2, 1, nil},
		{"decode narrower MHA", 4, 1, 2, 1, false, []int{2, 3}, []int{0}, 1, 2, nil},
		{"decode narrower MLA", 4, 1, 2, 1, true, []int{2, 3}, []int{0}, 1, 1, []int{3}},
		{"prefill pp", 1, 2, 1, 0, false, []int{0}, []int{0, 1}, 1, 2, nil},
	}
	for _, c := range cases {
		m, err := ResolveMapping(&ServerInfo{AttnTPSize: c.ptp, PPSize: c.pp, AttnCPSize: 1, DPSize: 1}, c.dtp, c.rank, 1, c.mla)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var dummies []int
		for _, r := range m.TPRanks {
			if m.DummyTP[r] {
				dummies = append(dummies, r)
			}
		}
		if !reflect.DeepEqual(m.TPRanks, c.tp) || !reflect.DeepEqual(m.PPRanks, c.pps) || m.RequiredDstInfoNum != c.dstInfo ||
			m.RequiredPrefillResponses != c.responses || !reflect.DeepEqual(dummies, c.dummies) {
			t.Errorf("%s: got %+v", c.name, m)
		}
	}
	if _, err := ResolveMapping(&ServerInfo{AttnTPSize: 3, PPSize: 1}, 2, 0, 1, false); err == nil {
		t.Error("tp 3 vs 2 accepted")
	}
}

func TestDPRank(t *testing.T) {
	if d, _ := DPRank(&ServerInfo{DPSize: 4, FollowBootstrapRoom: true}, 10); d != 2 {
		t.Errorf("dp rank %d", d)
	}
	if _, err := DPRank(&ServerInfo{DPSize: 4}, 10); err == nil {
		t.Error("dp without follow_bootstrap_room accepted")
	}
}
