package workload

import "fmt"

// The abort vocabulary every workload driver speaks: the scheduler and decode
// emulators (emul/sched, emul/decode, and so the demo) and the bench driver
// (bench/workload). An abort is a Phase (where in the room's life it lands) and
// a Source (who aborts); AbortKind packs the two into one comparable value.

// Phase is where in a room's life an abort lands.
type Phase uint8

const (
	// NoAbort: the room runs to completion.
	NoAbort Phase = iota
	// BeforeSender: decode gives up before it sends its transfer info (an
	// ABORT with no info, SGLang receiver.abort() right after init()), so
	// the ABORT can reach prefill before the scheduler creates the sender;
	// a client abort lands right after open, before decode's infos.
	BeforeSender
	// AfterInfo: right after decode's transfer info (Plan.AbortDelay later,
	// in the emulators): an abort racing the transfer.
	AfterInfo
	// BeforeInit: every transfer info is in (the room polled
	// WaitingForInput), the scheduler has not called init yet.
	BeforeInit
	// AfterInit: the scheduler called init and has sent no chunk yet.
	AfterInit
	// InChunk: right after the first chunk of a room with two chunks or
	// more was sent, while its writes are in flight (the "RDMA window").
	InChunk
	// AfterSuccess: the room polled Success, before the scheduler clears it.
	AfterSuccess
	numPhases
)

var phaseNames = [numPhases]string{"none", "before-sender", "after-info", "before-init", "after-init", "in-chunk", "after-success"}

func (p Phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", p)
}

// MarshalText names the phase in JSON.
func (p Phase) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText is the inverse of MarshalText.
func (p *Phase) UnmarshalText(b []byte) error {
	for i, n := range phaseNames {
		if n == string(b) {
			*p = Phase(i)
			return nil
		}
	}
	return fmt.Errorf("workload: unknown phase %q", b)
}

// Source is who aborts.
type Source uint8

const (
	// Decode sends an ABORT frame (SGLang's receiver.abort()).
	Decode Source = iota
	// Client is the prefill scheduler's sender.abort().
	Client
)

func (s Source) String() string {
	if s == Client {
		return "client"
	}
	return "decode"
}

// MarshalText names the source in JSON.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText is the inverse of MarshalText.
func (s *Source) UnmarshalText(b []byte) error {
	switch string(b) {
	case "decode":
		*s = Decode
	case "client":
		*s = Client
	default:
		return fmt.Errorf("workload: unknown source %q", b)
	}
	return nil
}

// AbortKind is one room's abort: a Phase and a Source (AbortNone: none).
type AbortKind uint8

const sourceShift = 4

// Abort is the kind for an abort at phase p by s (AbortNone for NoAbort).
func Abort(p Phase, s Source) AbortKind {
	if p == NoAbort {
		return AbortNone
	}
	return AbortKind(p) | AbortKind(s)<<sourceShift
}

// Phase is where the abort lands (NoAbort for AbortNone).
func (k AbortKind) Phase() Phase { return Phase(k & (1<<sourceShift - 1)) }

// From is who aborts (meaningless for AbortNone).
func (k AbortKind) From() Source { return Source(k >> sourceShift) }

// The kinds the emulators' rule draws (Config.Plan).
const (
	// AbortNone: the room must succeed.
	AbortNone AbortKind = 0
	// AbortDecodeBeforeInfo: decode's client aborts after it knows its prefill
	// ranks but before it sends the transfer info.
	AbortDecodeBeforeInfo = AbortKind(BeforeSender) | AbortKind(Decode)<<sourceShift
	// AbortDecodeAfterInfo: decode aborts Plan.AbortDelay after sending the
	// transfer info (a client abort racing the transfer).
	AbortDecodeAfterInfo = AbortKind(AfterInfo) | AbortKind(Decode)<<sourceShift
	// AbortPrefillClient: the prefill scheduler calls sender.abort() after
	// init, before its first chunk.
	AbortPrefillClient = AbortKind(AfterInit) | AbortKind(Client)<<sourceShift
	// AbortPrefillMidTransfer: the prefill scheduler sends chunk 0, then calls
	// sender.abort() and sends nothing more. Such a plan always has ≥2 chunks.
	AbortPrefillMidTransfer = AbortKind(InChunk) | AbortKind(Client)<<sourceShift
)

// ruleKinds are the kinds Config.Plan draws, in the order of the rule's draw
// (docs/emulators.md), AbortNone first.
var ruleKinds = [...]AbortKind{AbortNone, AbortDecodeBeforeInfo, AbortDecodeAfterInfo, AbortPrefillClient, AbortPrefillMidTransfer}

// The emulators' names for their kinds (summaries, docs/emulators.md).
var ruleNames = map[AbortKind]string{
	AbortNone: "none", AbortDecodeBeforeInfo: "decode-before-info", AbortDecodeAfterInfo: "decode-after-info",
	AbortPrefillClient: "prefill-client", AbortPrefillMidTransfer: "prefill-mid-transfer",
}

// String is the emulators' name for their kinds, phase/source otherwise
// ("in-chunk/decode").
func (k AbortKind) String() string {
	if n, ok := ruleNames[k]; ok {
		return n
	}
	return k.Phase().String() + "/" + k.From().String()
}

// AbortKinds lists the kinds the emulators' rule draws, in order, for reports.
func AbortKinds() []AbortKind { return append([]AbortKind(nil), ruleKinds[:]...) }

// byDecode reports whether decode itself aborts the room.
func (k AbortKind) byDecode() bool { return k != AbortNone && k.From() == Decode }

// ByPrefill reports whether the prefill scheduler aborts the room.
func (k AbortKind) ByPrefill() bool { return k != AbortNone && k.From() == Client }
