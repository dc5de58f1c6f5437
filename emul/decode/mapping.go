package decode

import "fmt"

// Target is one prefill rank a decode rank pulls a room from.
type Target struct {
	DP, CP, TP, PP int
	// Dummy: MLA with decode TP < prefill TP; only the first TP rank sends
	// data, the others get empty transfer infos.
	Dummy bool
	IP    string
	Port  int
}

// Mapping is decode's rank mapping (_resolve_rank_mapping, spec §3): which
// prefill ranks one decode rank pulls from and how many answers it expects.
type Mapping struct {
	TPRanks, CPRanks, PPRanks []int
	// RequiredDstInfoNum is sent to prefill in every transfer info.
	RequiredDstInfoNum int
	// RequiredPrefillResponses is decode-local: distinct senders per room.
	RequiredPrefillResponses int
	// DummyTP marks the TP ranks that get dummy transfer infos.
	DummyTP map[int]bool
}

// ResolveMapping applies the §3 table for a decode rank with attention TP size
// decTP, engine rank decRank, pipeline size decPP against prefill si.
// CP: only CP rank 0 (the all-CP-ranks mode is not emulated).
func ResolveMapping(si *ServerInfo, decTP, decRank, decPP int, mla bool) (Mapping, error) {
	ptp := max(si.AttnTPSize, 1)
	dtp := max(decTP, 1)
	m := Mapping{CPRanks: []int{0}, RequiredDstInfoNum: 1, RequiredPrefillResponses: 1, DummyTP: map[int]bool{}}
	switch {
	case dtp == ptp:
		m.TPRanks = []int{decRank % ptp}
	case dtp > ptp:
		if dtp%ptp != 0 {
			return m, fmt.Errorf("decode tp %d is not a multiple of prefill tp %d", dtp, ptp)
		}
		ratio := dtp / ptp
		m.TPRanks = []int{(decRank % dtp) / ratio}
		m.RequiredDstInfoNum = ratio
	default:
		if ptp%dtp != 0 {
			return m, fmt.Errorf("prefill tp %d is not a multiple of decode tp %d", ptp, dtp)
		}
		ratio := ptp / dtp
		for k := range ratio {
			m.TPRanks = append(m.TPRanks, decRank*ratio+k)
		}
		if mla {
			for _, r := range m.TPRanks[1:] {
				m.DummyTP[r] = true
			}
		} else {
			m.RequiredPrefillResponses = ratio
		}
	}
	pp := max(si.PPSize, 1)
	switch {
	case decPP == pp && decPP > 1:
		return m, fmt.Errorf("decode pp > 1 is not emulated")
	case decPP <= 1:
		for p := range pp {
			m.PPRanks = append(m.PPRanks, p)
		}
		m.RequiredPrefillResponses *= pp
	default:
		return m, fmt.Errorf("decode pp %d must equal prefill pp %d or be 1", decPP, pp)
	}
	return m, nil
}

// DPRank is the prefill DP group of a room when the server follows
// bootstrap_room (or has one group). Other load-balance methods need
// POST /query_dp_ranks, which the emulator does not do.
func DPRank(si *ServerInfo, room uint64) (int, error) {
	if si.DPSize <= 1 {
		return 0, nil
	}
	if !si.FollowBootstrapRoom {
		return 0, fmt.Errorf("prefill dp %d without follow_bootstrap_room is not emulated", si.DPSize)
	}
	return int(room % uint64(si.DPSize)), nil
}

// UniqueRank is SGLang's _prefill_unique_rank() of this target, the
// prefill_rank its KV_STATUS and ABORT_ACK carry:
// attn_tp_rank·(pp_size·cp_size) + pp_rank·cp_size + cp_rank.
func (t Target) UniqueRank(ppSize, cpSize int) int {
	pp, cp := max(ppSize, 1), max(cpSize, 1)
	return t.TP*(pp*cp) + t.PP*cp + t.CP
}
