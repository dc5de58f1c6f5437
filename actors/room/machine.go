package room

import "github.com/kvxfer/kvxfer/kv"

// The transition table. Rows are phases, columns are messages; "·" means the
// shared handler named in the legend, "abs" means absorbed (Effects.Ignored).
//
//	phase        deadline   Open     Init/Send  TransferInfo  Abort/DecodeAbort/PeerLost/Fail  XferDone        Deadline           Clear
//	collecting   bootstrap  open     hold       add           fail                             abs             fail(bootstrap)    fail(client)+clear
//	waiting      waiting    abs      post       abs (dup)     fail                             abs             fail(waiting)      fail(client)+clear
//	transferring transfer   abs      post       abs (dup)     fail                             done/progress   fail(transfer)     fail(client)+clear
//	draining     drain      abs      abs        tell later    ack later (DecodeAbort)          drain           conclude(expired)  clear
//	concluded    linger     abs      abs        tell now      ack now (DecodeAbort)            abs             retire             retire
//	retired      none       revive   abs        tell now      ack now (DecodeAbort)            abs             abs                abs
//
// "tell" sends a failed room's status to a decode whose transfer info came too
// late, so it frees the pages it allocated. "ack" echoes the ABORT's generation;
// a room whose drain deadline expired sends no ACK at all (a write may still
// land, so decode must fall back to its own release timeout). Success emits one
// Completion per non-dummy agent in the step that publishes it, carrying the
// notifications held back from the last chunk's writes: decode hears that a room
// succeeded only if the scheduler does (invariant 10). Poll is answered in every phase. The phase of a live room is derived from its
// data by advance: collecting until the sender exists and every required
// transfer info arrived; then transferring while any write is in flight,
// waiting while the scheduler owes chunks, and Success once the last chunk's
// writes all completed. A failure moves the room to draining while writes are in
// flight, else straight to its conclusion. Every phase but retired has exactly
// one armed deadline, so no room can wait forever.

type phase uint8

const (
	collecting phase = iota
	waiting
	transferring
	draining
	concluded
	retired
)

var phaseNames = [...]string{"collecting", "waiting", "transferring", "draining", "concluded", "retired"}

func (p phase) String() string { return phaseNames[p] }

var phaseDeadline = [...]DeadlineKind{
	collecting:   BootstrapDeadline,
	waiting:      WaitingDeadline,
	transferring: TransferDeadline,
	draining:     DrainDeadline,
	concluded:    LingerDeadline,
	retired:      NoDeadline,
}

// ackTarget is one decode endpoint waiting for ABORT_ACK; the latest ABORT's
// generation per endpoint wins, as in SGLang 0.5.22+.
type ackTarget struct {
	to     kv.Endpoint
	gen    uint64
	hasGen bool
}

// heldSignal is one agent's last-chunk transfer and, once it completed, the
// notifications the pool held back from it.
type heldSignal struct {
	agent  string
	seq    uint32
	signal [][]byte
}

type chunk struct {
	id    int
	start int // index of the chunk's first page among all pages the room sends
	pages []int32
	state [][]int32
	last  bool
}

// Machine is one room's rules and state. It is not safe for concurrent use; the
// actor that owns it is the only caller.
type Machine struct {
	cfg  *Config
	room uint64

	// Small fields together (no padding between them: a live room's
	// machine is most of its heap).
	phase        phase
	status       kv.Status
	reason       kv.Reason
	opened       bool
	cleared      bool
	inited       bool // scheduler side: Init came
	lastSent     bool // scheduler side: the last chunk came
	drainExpired bool
	armKind      DeadlineKind
	armGen       uint32
	nextSeq      uint32 // writes in flight are numbered from it

	// Decode side.
	infos     []TransferInfo
	required  int
	prefixLen int

	// Scheduler side.
	numPages  int
	auxIndex  int
	sentPages int
	chunks    int
	held      []chunk

	// Writes in flight, by sequence number.
	inflight []uint32

	// The abort path's lists (nil until a room needs one: most rooms never
	// do, and a live room's machine stays in a smaller size class).
	ab *abortLists

	// Completion notifications the pool held back, by agent.
	signals []heldSignal
}

// stepping is one Step in progress: the machine and the effects the step builds.
// The effects live on Step's stack, not in the Machine, so a live room's
// machine stays in a smaller size class (192 B instead of 288).
type stepping struct {
	*Machine
	fx Effects
}

// abortLists: decode endpoints that sent ABORT and wait for ABORT_ACK after
// the drain (ackTo), and those of transfer infos that came while draining
// (lateTo).
type abortLists struct {
	ackTo  []ackTarget
	lateTo []kv.Endpoint
}

// aborts returns the room's abort lists, made on first use.
func (m *Machine) aborts() *abortLists {
	if m.ab == nil {
		m.ab = &abortLists{}
	}
	return m.ab
}

// acks is the ABORT_ACK list (nil when none).
func (m *Machine) acks() []ackTarget {
	if m.ab == nil {
		return nil
	}
	return m.ab.ackTo
}

// New returns the machine of a room that has just been named by its first
// message. The caller steps that message next.
func New(cfg *Config, room uint64) *Machine {
	return &Machine{cfg: cfg, room: room, status: kv.StatusBootstrapping}
}

// Room returns the room id.
func (m *Machine) Room() uint64 { return m.room }

// Status returns the published status and the failure reason.
func (m *Machine) Status() (kv.Status, kv.Reason) { return m.status, m.reason }

// Retired reports whether only a tombstone is left of the room.
func (m *Machine) Retired() bool { return m.phase == retired }

// Armed returns the deadline the room waits under (NoDeadline once retired).
func (m *Machine) Armed() (DeadlineKind, uint32) { return m.armKind, m.armGen }

// Inflight returns the number of posted writes not yet reported done.
func (m *Machine) Inflight() int { return len(m.inflight) }

// Phase names the internal phase, for debugging dumps.
func (m *Machine) Phase() string { return m.phase.String() }

// Agents returns the decode agents of the room's transfer infos.
func (m *Machine) Agents() []string {
	out := make([]string, len(m.infos))
	for i := range m.infos {
		out[i] = m.infos[i].Agent
	}
	return out
}

// Step applies one message and returns what the wrapper must do. The returned
// Effects (and its slices) are valid until the next Step.
func (m *Machine) Step(msg Msg) Effects {
	s := stepping{Machine: m}
	before := m.status
	if m.phase != retired {
		switch msg := msg.(type) {
		case TransferInfo:
			s.fx.Info = InfoSeen{Seen: true, Agent: msg.Agent, Required: msg.Required}
		case XferDone:
			s.fx.Done = DoneSeen{Seen: true, Seq: msg.Seq, Fail: msg.Fail}
		}
	}
	switch {
	case isPoll(msg):
		s.onPoll()
	case m.phase == collecting:
		s.stepCollecting(msg)
	case m.phase == waiting, m.phase == transferring:
		s.stepReady(msg)
	case m.phase == draining:
		s.stepDraining(msg)
	case m.phase == concluded:
		s.stepConcluded(msg)
	default:
		s.stepRetired(msg)
	}
	if m.phase != retired && m.armKind == NoDeadline {
		s.arm(phaseDeadline[m.phase]) // a fresh room's first message did not arm one
	}
	if m.status != before {
		s.fx.Published, s.fx.Status, s.fx.Reason = true, m.status, m.reason
	}
	if s.fx.Retire {
		s.fx.Tomb = m.Tombstone()
	}
	s.fx.View = m.Reply()
	return s.fx
}

// stepCollecting: the sender or some transfer infos are missing.
func (m *stepping) stepCollecting(msg Msg) {
	switch msg := msg.(type) {
	case Open:
		if m.opened {
			m.fx.Ignored = true
			return
		}
		m.opened = true
		m.advance()
	case Init:
		m.onInit(msg)
	case Send:
		m.onSend(msg)
	case TransferInfo:
		m.onTransferInfo(msg)
	case Deadline:
		m.onDeadline(msg, kv.ReasonBootstrapTimeout)
	default:
		m.stepCommon(msg)
	}
}

// stepReady: the sender and all transfer infos are here; chunks are posted as
// they come (waiting: nothing in flight; transferring: writes in flight).
func (m *stepping) stepReady(msg Msg) {
	switch msg := msg.(type) {
	case Init:
		m.onInit(msg)
	case Send:
		m.onSend(msg)
	case XferDone:
		m.onXferDone(msg)
	case Deadline:
		if m.phase == waiting {
			m.onDeadline(msg, kv.ReasonWaitingTimeout)
		} else {
			m.onDeadline(msg, kv.ReasonTransferTimeout)
		}
	default:
		m.stepCommon(msg)
	}
}

// stepCommon handles what every live, non-failed phase does alike.
func (m *stepping) stepCommon(msg Msg) {
	switch msg := msg.(type) {
	case Abort:
		m.fail(kv.ReasonClientAbort)
	case DecodeAbort:
		a := m.aborts()
		a.ackTo = appendAck(a.ackTo, msg)
		m.fail(kv.ReasonDecodeAbort)
	case PeerLost:
		if !m.hasAgent(msg.Agent) {
			m.fx.Ignored = true
			return
		}
		m.fail(kv.ReasonPeerLost)
	case Fail:
		m.fail(msg.Reason)
	case Clear:
		// A clear before the room concluded is the scheduler giving up on it.
		m.cleared = true
		m.fail(kv.ReasonClientAbort)
	default: // duplicate Open, late TransferInfo, unknown XferDone
		m.fx.Ignored = true
	}
}

// stepDraining: failed, waiting for posted writes before decode may reuse pages.
func (m *stepping) stepDraining(msg Msg) {
	switch msg := msg.(type) {
	case XferDone:
		if !m.removeInflight(msg.Seq) {
			m.fx.Ignored = true
			return
		}
		if len(m.inflight) == 0 {
			m.conclude()
		}
	case DecodeAbort:
		a := m.aborts()
		a.ackTo = appendAck(a.ackTo, msg)
	case TransferInfo:
		// Too late to be used, but decode has allocated pages for it: it
		// hears the failure with the others once the drain is over.
		a := m.aborts()
		a.lateTo = appendEndpoint(a.lateTo, msg.From)
		m.fx.Ignored = true
	case Clear:
		m.cleared = true
	case Deadline:
		if msg.Gen != m.armGen {
			m.fx.Ignored = true
			return
		}
		// The writes never completed; the pool quarantines their requests.
		m.drainExpired = true
		m.inflight = m.inflight[:0]
		m.conclude()
	default:
		m.fx.Ignored = true
	}
}

// stepConcluded: terminal and drained; waiting for the scheduler's Clear.
func (m *stepping) stepConcluded(msg Msg) {
	switch msg := msg.(type) {
	case Clear:
		m.retire()
	case DecodeAbort:
		m.ackNow(msg)
	case TransferInfo:
		m.onLateInfo(msg)
	case Deadline:
		if msg.Gen != m.armGen {
			m.fx.Ignored = true
			return
		}
		m.retire()
	default:
		m.fx.Ignored = true
	}
}

// stepRetired: a tombstone. Late messages change nothing, with two exceptions:
// an ABORT still gets its ACK (nothing is outstanding), and an Open revives the
// room — as Failed if the room concluded before its sender existed (the
// abort-before-sender race), or as a new incarnation if the old one was opened.
func (m *stepping) stepRetired(msg Msg) {
	switch msg := msg.(type) {
	case DecodeAbort:
		m.ackNow(msg)
	case TransferInfo:
		m.onLateInfo(msg)
	case Open:
		if m.opened {
			*m.Machine = Machine{cfg: m.cfg, room: m.room, status: kv.StatusBootstrapping}
			m.opened = true
			m.fx.Revived = true
			m.arm(BootstrapDeadline)
			m.phase = collecting
			return
		}
		m.opened = true
		m.fx.Revived = true
		m.enter(concluded)
	default:
		m.fx.Ignored = true
	}
}

func isPoll(msg Msg) bool { _, ok := msg.(Poll); return ok }

func (m *stepping) onPoll() {
	r := m.Reply()
	m.fx.Reply = &r
}

// Reply is what a Poll would answer now.
func (m *Machine) Reply() kv.Reply {
	return kv.Reply{Status: m.status, Reason: m.reason, PrefixLen: m.prefixLen}
}

func (m *stepping) onInit(msg Init) {
	if !m.opened || m.inited || msg.NumPages < 0 || msg.AuxIndex < 0 {
		m.fail(kv.ReasonInvalidRequest)
		return
	}
	m.inited, m.numPages, m.auxIndex = true, msg.NumPages, msg.AuxIndex
}

// onSend applies SGLang's chunk accounting: a chunk id counts only chunks that
// are sent, and the chunk that brings the pages sent to Init's count is last.
func (m *stepping) onSend(msg Send) {
	if !m.opened || !m.inited || m.lastSent || m.sentPages+len(msg.Pages) > m.numPages {
		m.fail(kv.ReasonInvalidRequest)
		return
	}
	last := m.sentPages+len(msg.Pages) == m.numPages
	if len(msg.Pages) == 0 && !last {
		m.fx.Ignored = true // should_send_kv_chunk is false: not a chunk
		return
	}
	c := chunk{id: m.chunks, start: m.sentPages, pages: msg.Pages, last: last}
	if last {
		c.state = msg.State
	}
	m.chunks++
	m.sentPages += len(msg.Pages)
	m.lastSent = last
	m.held = append(m.held, c)
	m.advance()
}

func (m *stepping) onTransferInfo(msg TransferInfo) {
	if msg.Refused != kv.ReasonNone {
		m.infos = append(m.infos, msg)
		m.fail(msg.Refused)
		return
	}
	if msg.Required <= 0 || (m.required != 0 && msg.Required != m.required) {
		m.fail(kv.ReasonInvalidRequest)
		return
	}
	m.required = msg.Required
	if m.prefixLen == 0 {
		m.prefixLen = msg.PrefixLen
	}
	for i := range m.infos {
		if m.infos[i].Agent == msg.Agent { // a later duplicate overwrites, as upstream
			m.infos[i] = msg
			m.advance()
			return
		}
	}
	m.infos = append(m.infos, msg)
	m.advance()
}

// onLateInfo absorbs a transfer info for a room that already concluded. If
// the room failed, decode is told at once so it frees the pages it allocated
// for it (upstream leaks them until decode's own timeout).
func (m *stepping) onLateInfo(msg TransferInfo) {
	m.fx.Ignored = true
	if m.status == kv.StatusFailed {
		m.notify(FailureStatus, msg.From)
	}
}

func (m *stepping) onXferDone(msg XferDone) {
	if !m.removeInflight(msg.Seq) {
		m.fx.Ignored = true
		return
	}
	if msg.Fail != kv.ReasonNone {
		m.fail(msg.Fail)
		return
	}
	if len(msg.Signal) > 0 {
		m.holdSignal(msg)
	}
	m.arm(TransferDeadline) // progress restarts the no-progress deadline
	m.advance()
}

func (m *stepping) onDeadline(msg Deadline, why kv.Reason) {
	if msg.Gen != m.armGen {
		m.fx.Ignored = true
		return
	}
	m.fail(why)
}

// advance derives the phase of a live, non-failed room from its data and posts
// what can be posted.
func (m *stepping) advance() {
	if len(m.infos) < m.required || m.required == 0 {
		m.enter(collecting)
		return
	}
	if m.status < kv.StatusWaitingForInput {
		m.status = kv.StatusWaitingForInput // as upstream, even before the sender exists
	}
	if !m.opened {
		m.enter(collecting)
		return
	}
	for len(m.held) > 0 {
		c := m.held[0]
		m.held = m.held[1:]
		if !m.post(&c) {
			return
		}
	}
	m.held = nil
	switch {
	case len(m.inflight) > 0:
		m.enter(transferring)
	case m.lastSent:
		m.status = kv.StatusSuccess
		m.complete()
		m.conclude()
	default:
		m.enter(waiting)
	}
}

// post fans one chunk out to every non-dummy agent. It checks the whole chunk
// against every agent before emitting anything, so a chunk that cannot be sent
// fails the room without a single write leaving (nothing is posted for a failed
// room), and returns false.
func (m *stepping) post(c *chunk) bool {
	end := c.start + len(c.pages)
	for i := range m.infos {
		in := &m.infos[i]
		if in.Dummy {
			continue
		}
		// Decode waits for a state notification it was promised; a prefill
		// without matching state could never satisfy it.
		badState := c.last && len(in.DstState) > 0 && len(c.state) != len(in.DstState)
		if end > len(in.DstPages) || badState {
			m.fail(kv.ReasonInvalidRequest)
			return false
		}
	}
	for i := range m.infos {
		in := &m.infos[i]
		if in.Dummy {
			continue
		}
		t := kv.Transfer{
			Room: m.room, Seq: m.nextSeq, Agent: in.Agent, Chunk: c.id, Last: c.last,
			SrcPages: c.pages, DstPages: in.DstPages[c.start:end:end], PageStart: c.start,
		}
		if c.last {
			if m.cfg.HoldCompletion {
				t.HoldSignal = true
				m.signals = append(m.signals, heldSignal{agent: in.Agent, seq: t.Seq})
			}
			t.SrcAux, t.DstAux = m.auxIndex, in.DstAux
			if len(in.DstState) > 0 {
				t.SrcState, t.DstState = c.state, in.DstState
			}
		}
		m.nextSeq++
		m.inflight = append(m.inflight, t.Seq)
		m.fx.Posts = append(m.fx.Posts, t)
	}
	if m.status < kv.StatusTransferring {
		m.status = kv.StatusTransferring
	}
	return true
}

// fail makes the room Failed (once: terminal statuses are absorbing) and either
// drains its posted writes or concludes it.
func (m *stepping) fail(why kv.Reason) {
	if m.status.Terminal() {
		return
	}
	m.status, m.reason = kv.StatusFailed, why
	m.held = nil
	if len(m.inflight) > 0 {
		m.fx.Withdraw = true
		m.enter(draining)
		return
	}
	m.conclude()
}

// conclude runs once the room is terminal and nothing it posted is in flight:
// decode may now reuse its pages, so this is when decode is told.
func (m *stepping) conclude() {
	if m.status == kv.StatusFailed {
		for i := range m.infos {
			// A decode that sent the ABORT knows; it hears the ACK instead.
			if !m.aborted(m.infos[i].From) {
				m.notifyOnce(FailureStatus, m.infos[i].From)
			}
		}
	}
	var late []kv.Endpoint
	if m.ab != nil {
		late = m.ab.lateTo
	}
	for _, to := range late {
		m.notifyOnce(FailureStatus, to)
	}
	if !m.drainExpired {
		// After an expired drain a write may still land in decode's pages:
		// no ACK, so decode keeps them until its own release timeout.
		for _, a := range m.acks() {
			m.ack(a)
		}
	}
	m.ab, m.signals = nil, nil
	if m.cleared || !m.opened {
		// Nobody will poll an unopened room; its tombstone remembers the
		// outcome for the sender that may still come.
		m.retire()
		return
	}
	m.enter(concluded)
}

func (m *stepping) retire() {
	m.phase = retired
	m.armKind = NoDeadline
	m.fx.Retire = true
	m.fx.Arm = Arm{}
	// Drop what only a live room needs; the tombstone keeps the outcome.
	m.infos, m.held, m.inflight, m.ab, m.signals = nil, nil, nil, nil, nil
}

// complete tells every non-dummy agent that the room succeeded. It runs in the
// step that publishes Success, so nothing can fail the room in between.
func (m *stepping) complete() {
	for i := range m.infos {
		in := &m.infos[i]
		if in.Dummy {
			continue
		}
		n := Notice{Kind: Completion, To: in.From, Agent: in.Agent}
		for _, h := range m.signals {
			if h.agent == in.Agent {
				n.Signal = h.signal
			}
		}
		m.fx.Notices = append(m.fx.Notices, n)
	}
}

// holdSignal keeps a completed last-chunk transfer's notifications.
func (m *stepping) holdSignal(msg XferDone) {
	for i := range m.signals {
		if m.signals[i].seq == msg.Seq {
			m.signals[i].signal = msg.Signal
			return
		}
	}
}

// ackNow answers an ABORT for a room that has nothing in flight (concluded or
// retired), unless its drain expired.
func (m *stepping) ackNow(msg DecodeAbort) {
	if m.drainExpired {
		m.fx.Ignored = true
		return
	}
	m.ack(ackTarget{to: msg.From, gen: msg.Gen, hasGen: msg.HasGen})
}

func (m *stepping) ack(a ackTarget) {
	m.fx.Notices = append(m.fx.Notices, Notice{Kind: AbortAck, To: a.to, Reason: m.reason, Gen: a.gen, HasGen: a.hasGen})
}

func (m *stepping) notify(kind NoticeKind, to kv.Endpoint) {
	m.fx.Notices = append(m.fx.Notices, Notice{Kind: kind, To: to, Reason: m.reason, DrainExpired: m.drainExpired})
}

func (m *stepping) notifyOnce(kind NoticeKind, to kv.Endpoint) {
	for _, n := range m.fx.Notices {
		if n.Kind == kind && n.To == to {
			return
		}
	}
	m.notify(kind, to)
}

// enter moves to phase p, arming p's deadline when the phase changes.
func (m *stepping) enter(p phase) {
	if m.phase == p && m.armKind == phaseDeadline[p] {
		return
	}
	m.phase = p
	m.arm(phaseDeadline[p])
}

func (m *stepping) arm(k DeadlineKind) {
	m.armGen++
	m.armKind = k
	m.fx.Arm = Arm{Kind: k, Gen: m.armGen, After: m.cfg.duration(k)}
}

func (m *Machine) removeInflight(seq uint32) bool {
	for i, s := range m.inflight {
		if s == seq {
			m.inflight = append(m.inflight[:i], m.inflight[i+1:]...)
			return true
		}
	}
	return false
}

func (m *Machine) hasAgent(agent string) bool {
	for i := range m.infos {
		if m.infos[i].Agent == agent {
			return true
		}
	}
	return false
}

func (m *Machine) aborted(e kv.Endpoint) bool {
	for _, a := range m.acks() {
		if a.to == e {
			return true
		}
	}
	return false
}

func appendAck(list []ackTarget, a DecodeAbort) []ackTarget {
	t := ackTarget{to: a.From, gen: a.Gen, hasGen: a.HasGen} // the latest ABORT per endpoint wins
	for i := range list {
		if list[i].to == a.From {
			list[i] = t
			return list
		}
	}
	return append(list, t)
}

func appendEndpoint(list []kv.Endpoint, e kv.Endpoint) []kv.Endpoint {
	for _, x := range list {
		if x == e {
			return list
		}
	}
	return append(list, e)
}
