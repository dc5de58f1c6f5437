package decode

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvxfer/kvxfer/emul/workload"
)

// Summary is the end-of-run report (printed, and written as JSON with -json).
type Summary struct {
	// Release is the SGLang release played; Shard "k/n" when the workload
	// was split between processes.
	Release Release `json:"sglang"`
	Shard   string  `json:"shard,omitempty"`
	Rooms   int     `json:"rooms"`
	// Outcomes counts rooms by decode-side outcome (Outcome.String keys).
	Outcomes map[string]int `json:"outcomes"`
	// FailedReasons counts failure KV_STATUS reasons.
	FailedReasons map[string]int `json:"failed_kv_status_reasons,omitempty"`
	// ByPlan counts outcomes per planned abort kind (workload.AbortKind.String).
	ByPlan map[string]map[string]int `json:"by_plan"`
	// CompletedBy counts successful rooms by completion signal (notifs, kv_status).
	CompletedBy map[string]int `json:"completed_by"`
	// Unexpected: rooms planned without any abort that did not succeed.
	Unexpected int `json:"unexpected"`
	// Errors lists up to 10 distinct OutcomeError reasons.
	Errors []string `json:"errors,omitempty"`

	BytesVerified int64 `json:"bytes_verified"`
	WrongBytes    int64 `json:"wrong_bytes"`
	AuxErrors     int   `json:"aux_errors"`
	PagesHeld     int   `json:"pages_held"`
	AuxHeld       int   `json:"aux_slots_held"`

	// Releases counts rooms by how their pages were freed (ReleaseKind.String);
	// PagesByAck / PagesByTimeout are the KV pages of the held ones.
	Releases        map[string]int `json:"releases"`
	PagesByAck      int            `json:"pages_released_by_ack"`
	PagesByTimeout  int            `json:"pages_released_by_timeout"`
	ReleaseTimeouts int            `json:"release_timeouts"`
	// UnsafeReleases: rooms whose pages were freed while a write for them
	// may still have been in flight (0.5.18 / 0.5.20 free at once after an
	// ABORT; release timeouts). Those pages are reused last.
	UnsafeReleases int64 `json:"unsafe_releases"`
	// ABORT_ACKs: counted toward a release, and ignored: generation-less
	// (0.5.22+), another generation (0.5.22+), or for a room that holds
	// nothing (0.5.20 never arms; an unarmed abort).
	Generations int64 `json:"abort_generations"`
	AcksCounted int64 `json:"acks_counted"`
	AcksNoGen   int64 `json:"acks_ignored_no_generation"`
	AcksStale   int64 `json:"acks_ignored_stale_generation"`
	AcksUnarmed int64 `json:"acks_ignored_unarmed"`

	LatencyP50 time.Duration `json:"latency_p50_ns"`
	LatencyP99 time.Duration `json:"latency_p99_ns"`
	Wall       time.Duration `json:"wall_ns"`

	// PullMessages counts what reached the primary rank's PULL socket, by
	// kind; DummyPullMessages the dummy rank's. Queued is what a release
	// without a listener (0.5.18) left unread there, both ranks together.
	PullMessages      map[string]int64 `json:"pull_messages,omitempty"`
	DummyPullMessages map[string]int64 `json:"dummy_pull_messages,omitempty"`
	Queued            int64            `json:"queued_unread"`

	Registrations   int64 `json:"registrations"`
	HeartbeatLosses int64 `json:"heartbeat_losses"`
	LateNotices     int64 `json:"late_notices"`
	BadOutbound     int64 `json:"bad_outbound_messages"`
	OtherStatus     int64 `json:"other_kv_status"`
	ForeignRanks    int64 `json:"foreign_prefill_ranks"`
	BadNotifs       int64 `json:"bad_notifs"`
	DummyNotifs     int64 `json:"dummy_rank_notifs"`
	UnreadNotifs    int64 `json:"unread_notifs"`
	PushErrors      int64 `json:"push_errors"`

	results []Result
}

func (e *Emulator) summarize(results []Result, wall time.Duration) *Summary {
	s := &Summary{Release: e.cfg.Release, Rooms: len(results), Outcomes: map[string]int{}, FailedReasons: map[string]int{},
		ByPlan: map[string]map[string]int{}, CompletedBy: map[string]int{}, Releases: map[string]int{}, Wall: wall, results: results}
	if e.cfg.Shards > 1 {
		s.Shard = fmt.Sprintf("%d/%d", e.cfg.Shard, e.cfg.Shards)
	}
	var lat []time.Duration
	errs := map[string]bool{}
	for _, r := range results {
		s.Outcomes[r.Outcome.String()]++
		k := r.Plan.Abort.String()
		if s.ByPlan[k] == nil {
			s.ByPlan[k] = map[string]int{}
		}
		s.ByPlan[k][r.Outcome.String()]++
		if r.Plan.Abort == workload.AbortNone && r.Outcome != OutcomeSuccess {
			s.Unexpected++
		}
		switch r.Outcome {
		case OutcomeSuccess:
			lat = append(lat, r.Latency)
			s.CompletedBy[r.CompletedBy]++
		case OutcomeFailedStatus:
			s.FailedReasons[r.Reason]++
		case OutcomeError:
			if !errs[r.Reason] && len(errs) < 10 {
				errs[r.Reason] = true
				s.Errors = append(s.Errors, r.Reason)
			}
		}
		s.BytesVerified += r.BytesVerified
		s.WrongBytes += r.WrongBytes
		if r.AuxError != "" {
			s.AuxErrors++
		}
		if r.Release != ReleaseNone {
			s.Releases[r.Release.String()]++
		}
		switch r.Release {
		case ReleaseByAck:
			s.PagesByAck += r.Pages
		case ReleaseByTimeout:
			s.PagesByTimeout += r.Pages
			s.ReleaseTimeouts++
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	s.LatencyP50, s.LatencyP99 = pct(0.50), pct(0.99)
	s.PagesHeld, s.AuxHeld = e.Held()
	c := &e.c
	s.Registrations, s.HeartbeatLosses, s.LateNotices = c.registrations.Load(), c.heartbeatLosses.Load(), c.lateNotices.Load()
	s.BadOutbound, s.OtherStatus, s.ForeignRanks = c.badOutbound.Load(), c.otherStatus.Load(), c.foreignRanks.Load()
	s.BadNotifs, s.DummyNotifs, s.UnreadNotifs, s.PushErrors = c.badNotifs.Load(), c.dummyNotifs.Load(), c.unreadNotifs.Load(), c.pushErrors.Load()
	s.Generations, s.AcksCounted, s.AcksNoGen = c.generations.Load(), c.acksCounted.Load(), c.acksNoGen.Load()
	s.AcksStale, s.AcksUnarmed, s.UnsafeReleases = c.acksStale.Load(), c.acksUnarmed.Load(), c.unsafeReleases.Load()
	e.mu.Lock()
	s.PullMessages, s.DummyPullMessages = maps.Clone(c.pull), maps.Clone(c.dummyPull)
	e.mu.Unlock()
	if !e.cfg.Release.ReadsPull() {
		for _, m := range []map[string]int64{s.PullMessages, s.DummyPullMessages} {
			for _, n := range m {
				s.Queued += n
			}
		}
	}
	return s
}

// RoomOutcomes returns every room's decode-side outcome, by room id.
func (s *Summary) RoomOutcomes() map[uint64]Outcome {
	out := make(map[uint64]Outcome, len(s.results))
	for _, r := range s.results {
		out[r.Plan.Room] = r.Outcome
	}
	return out
}

// WriteRoomOutcomes writes RoomOutcomes as a JSON object: room id (decimal
// string) → outcome name.
func (s *Summary) WriteRoomOutcomes(path string) error {
	m := map[string]string{}
	for id, o := range s.RoomOutcomes() {
		m[strconv.FormatUint(id, 10)] = o.String()
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Err is non-nil when the run must fail: wrong bytes, a wrong aux slot,
// pages still held, or notifications sent to a release that never reads them.
func (s *Summary) Err() error {
	var errs []error
	if s.WrongBytes > 0 {
		errs = append(errs, fmt.Errorf("%d wrong bytes", s.WrongBytes))
	}
	if s.AuxErrors > 0 {
		errs = append(errs, fmt.Errorf("%d rooms with wrong aux bytes", s.AuxErrors))
	}
	if s.PagesHeld > 0 || s.AuxHeld > 0 {
		errs = append(errs, fmt.Errorf("%d pages and %d aux slots still held", s.PagesHeld, s.AuxHeld))
	}
	if s.UnreadNotifs > 0 {
		errs = append(errs, fmt.Errorf("%d NIXL notifications sent to a %s decode, which never reads them", s.UnreadNotifs, s.Release))
	}
	return errors.Join(errs...)
}

// Print writes the human-readable summary.
func (s *Summary) Print(w io.Writer) {
	shard := ""
	if s.Shard != "" {
		shard = ", shard " + s.Shard
	}
	fmt.Fprintf(w, "\ndecode summary (SGLang %s%s): %d rooms in %v (%.0f rooms/s)\n", s.Release, shard, s.Rooms,
		s.Wall.Round(time.Millisecond), float64(s.Rooms)/max(s.Wall.Seconds(), 1e-9))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "planned abort\toutcome\trooms")
	for _, k := range workload.AbortKinds() {
		m := s.ByPlan[k.String()]
		for _, o := range sortedKeys(m) {
			fmt.Fprintf(tw, "%s\t%s\t%d\n", k, o, m[o])
		}
	}
	tw.Flush()
	if len(s.FailedReasons) > 0 {
		fmt.Fprint(w, "failed by KV_STATUS:")
		for _, r := range sortedKeys(s.FailedReasons) {
			fmt.Fprintf(w, " %s=%d", r, s.FailedReasons[r])
		}
		fmt.Fprintln(w)
	}
	for _, e := range s.Errors {
		fmt.Fprintln(w, "error:", e)
	}
	fmt.Fprintf(w, "completed by:%s  releases:%s\n", pairs(s.CompletedBy), pairs(s.Releases))
	fmt.Fprintf(w, "pages released by ACK %d  by timeout %d  ABORT generations %d  ACKs counted %d  ignored: no generation %d, stale generation %d, unarmed %d\n",
		s.PagesByAck, s.PagesByTimeout, s.Generations, s.AcksCounted, s.AcksNoGen, s.AcksStale, s.AcksUnarmed)
	fmt.Fprintf(w, "bytes verified %d  wrong bytes %d  aux errors %d  pages held %d  aux slots held %d\n",
		s.BytesVerified, s.WrongBytes, s.AuxErrors, s.PagesHeld, s.AuxHeld)
	fmt.Fprintf(w, "transfer info → completion p50 %v p99 %v  unexpected outcomes %d  release timeouts %d  unsafe releases %d\n",
		s.LatencyP50.Round(time.Microsecond), s.LatencyP99.Round(time.Microsecond), s.Unexpected, s.ReleaseTimeouts, s.UnsafeReleases)
	fmt.Fprintf(w, "PULL socket:%s  dummy rank:%s  queued unread %d\n", kv64(s.PullMessages), kv64(s.DummyPullMessages), s.Queued)
	fmt.Fprintf(w, "registrations %d  heartbeat losses %d  late notices %d  foreign ranks %d  bad notifs %d  unread notifs %d  dummy-rank notifs %d  push errors %d\n",
		s.Registrations, s.HeartbeatLosses, s.LateNotices, s.ForeignRanks, s.BadNotifs, s.UnreadNotifs, s.DummyNotifs, s.PushErrors)
}

func pairs(m map[string]int) string {
	if len(m) == 0 {
		return " -"
	}
	var b strings.Builder
	for _, k := range sortedKeys(m) {
		fmt.Fprintf(&b, " %s=%d", k, m[k])
	}
	return b.String()
}

func kv64(m map[string]int64) string {
	if len(m) == 0 {
		return " -"
	}
	ks := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, " %s=%d", strings.ReplaceAll(k, " ", "_"), m[k])
	}
	return b.String()
}

// WriteJSON writes the summary to path.
func (s *Summary) WriteJSON(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
