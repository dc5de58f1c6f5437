package decode

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/kvxfer/kvxfer/emul/workload"
)

// Summary is the end-of-run report (printed, and written as JSON with -json).
type Summary struct {
	Rooms int `json:"rooms"`
	// Outcomes counts rooms by decode-side outcome (Outcome.String keys).
	Outcomes map[string]int `json:"outcomes"`
	// FailedReasons counts failure KV_STATUS reasons.
	FailedReasons map[string]int `json:"failed_kv_status_reasons,omitempty"`
	// ByPlan counts outcomes per planned abort kind (workload.AbortKind.String).
	ByPlan map[string]map[string]int `json:"by_plan"`
	// Unexpected: rooms planned without any abort that did not succeed.
	Unexpected int `json:"unexpected"`
	// Errors lists up to 10 distinct OutcomeError reasons.
	Errors []string `json:"errors,omitempty"`

	BytesVerified   int64 `json:"bytes_verified"`
	WrongBytes      int64 `json:"wrong_bytes"`
	AuxErrors       int   `json:"aux_errors"`
	PagesHeld       int   `json:"pages_held"`
	AuxHeld         int   `json:"aux_slots_held"`
	ReleaseTimeouts int   `json:"release_timeouts"`

	LatencyP50 time.Duration `json:"latency_p50_ns"`
	LatencyP99 time.Duration `json:"latency_p99_ns"`
	Wall       time.Duration `json:"wall_ns"`

	Registrations   int64 `json:"registrations"`
	HeartbeatLosses int64 `json:"heartbeat_losses"`
	LateNotices     int64 `json:"late_notices"`
	Unsolicited     int64 `json:"unsolicited_messages"`
	BadOutbound     int64 `json:"bad_outbound_messages"`
	SuccessStatus   int64 `json:"success_kv_status"`
	BadNotifs       int64 `json:"bad_notifs"`
	DummyNotifs     int64 `json:"dummy_rank_notifs"`
	PushErrors      int64 `json:"push_errors"`
}

func (e *Emulator) summarize(results []Result, wall time.Duration) *Summary {
	s := &Summary{Rooms: len(results), Outcomes: map[string]int{}, FailedReasons: map[string]int{},
		ByPlan: map[string]map[string]int{}, Wall: wall}
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
		if r.ReleaseTimedOut {
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
	s.Unsolicited, s.BadOutbound, s.SuccessStatus = c.unsolicited.Load(), c.badOutbound.Load(), c.successStatus.Load()
	s.BadNotifs, s.DummyNotifs, s.PushErrors = c.badNotifs.Load(), c.dummyNotifs.Load(), c.pushErrors.Load()
	return s
}

// Err is non-nil when the run must fail: wrong bytes, a wrong aux slot, or
// pages still held.
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
	return errors.Join(errs...)
}

// Print writes the human-readable summary.
func (s *Summary) Print(w io.Writer) {
	fmt.Fprintf(w, "\ndecode summary: %d rooms in %v (%.0f rooms/s)\n", s.Rooms, s.Wall.Round(time.Millisecond),
		float64(s.Rooms)/max(s.Wall.Seconds(), 1e-9))
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
	fmt.Fprintf(w, "bytes verified %d  wrong bytes %d  aux errors %d  pages held %d  aux slots held %d\n",
		s.BytesVerified, s.WrongBytes, s.AuxErrors, s.PagesHeld, s.AuxHeld)
	fmt.Fprintf(w, "transfer info → completion p50 %v p99 %v  unexpected outcomes %d  release timeouts %d\n",
		s.LatencyP50.Round(time.Microsecond), s.LatencyP99.Round(time.Microsecond), s.Unexpected, s.ReleaseTimeouts)
	fmt.Fprintf(w, "registrations %d  heartbeat losses %d  late notices %d  unsolicited %d  bad notifs %d  dummy-rank notifs %d  push errors %d\n",
		s.Registrations, s.HeartbeatLosses, s.LateNotices, s.Unsolicited, s.BadNotifs, s.DummyNotifs, s.PushErrors)
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
