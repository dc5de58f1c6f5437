package telemetry

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// Scrape fetches a Prometheus text exposition and returns its samples keyed
// by series as printed (name{label="value",...}, labels sorted).
func Scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

type fakeSource struct{}

func (fakeSource) PoolStats() xfer.Stats {
	return xfer.Stats{Posted: 7, Requests: 21, Failed: 1, InFlight: 3, Quarantined: 2, Withdrawn: 1}
}
func (fakeSource) Counters() map[string]int64 {
	return map[string]int64{"bad_frames": 5, "registrations": 2, "notices_dropped": 0, "duplicate_registrations": 0,
		"bad_registrations": 0, "staging_frames_dropped": 0, "peers_lost": 0, "peers_dropped": 0, "abort_endpoints_refused": 0,
		"links_evicted": 0, "notices_send_failed": 0, "log_lines_suppressed": 0, "lost_rooms": 2,
		"shm_sessions": 1, "shm_sessions_attached": 3, "shm_records": 40, "shm_doorbell_sleeps": 6, "shm_doorbell_wakes": 5,
		"shm_missed_wakes": 0, "shm_full_waits": 2, "shm_clients_lost_process_exit": 1, "shm_clients_lost_bad_record": 1,
		"shm_rooms_lost": 4, "shm_invalid_records": 0, "shm_traced_opens": 7, "shm_ignored_traceparents": 0}
}
func (fakeSource) DecodePeers() map[string]int64 {
	return map[string]int64{"0.5.18": 1, "0.5.20": 0, "0.5.22": 0, "0.5.23": 2, "rejected": 0}
}

// The Prometheus endpoint over HTTP: names, types and values move with the
// workload, and the oldest-non-terminal age is bounded once stuck rooms are
// aborted.
func TestMetricsEndpoint(t *testing.T) {
	clk := clock.NewFake(epoch)
	tel, err := Setup(t.Context(), Options{BytesPerPage: 4096, Clock: clk, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if tel.TracerProvider != nil || !strings.Contains(tel.Tracing, "off") {
		t.Fatalf("tracing without an endpoint: %s", tel.Tracing)
	}
	tel.Observer.Attach(fakeSource{})
	srv := httptest.NewServer(tel.Metrics)
	defer srv.Close()
	eng, err := actors.New(actors.Config{Clock: clk, Transfers: &manualXfers{auto: true}, Observer: tel.Observer, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		eng.Close(t.Context())
		tel.Shutdown(t.Context())
	}()
	m := Scrape(t, srv.URL)
	if m[`kvxfer_rooms_created_total`] != 0 || m[`kvxfer_oldest_nonterminal_room_age_seconds`] != 0 {
		t.Fatalf("fresh: %v", m)
	}
	for k, v := range map[string]float64{
		`kvxfer_bad_frames_total`: 5, `kvxfer_registrations_total`: 2, `kvxfer_pool_inflight`: 3,
		`kvxfer_pool_quarantined_total`: 2, `kvxfer_pool_withdrawn_total`: 1, `kvxfer_rooms{status="Bootstrapping"}`: 0,
		`kvxfer_shm_sessions`: 1, `kvxfer_shm_records_total`: 40, `kvxfer_shm_full_waits_total`: 2,
		`kvxfer_shm_clients_lost_total{cause="process_exit"}`: 1, `kvxfer_shm_clients_lost_total{cause="bad_record"}`: 1,
	} {
		if got, ok := m[k]; !ok || got != v {
			t.Fatalf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}

	// One successful room of two chunks.
	eng.Open(1)
	eng.TransferInfo(1, info("a", 4, 1))
	eng.Init(1, 4, 0)
	eng.Send(1, []int32{1, 2}, nil)
	eng.Send(1, []int32{3, 4}, nil)
	waitStatus(t, eng, 1, kv.StatusSuccess)
	// Five rooms stuck in Bootstrapping (no transfer info) for 100 s.
	stuck := []uint64{11, 12, 13, 14, 15}
	for _, id := range stuck {
		eng.Open(id)
	}
	eng.PollSync(stuck, nil)
	clk.Advance(100 * time.Second)
	m = Scrape(t, srv.URL)
	for k, v := range map[string]float64{
		`kvxfer_rooms_created_total`:                                        6,
		`kvxfer_rooms{status="Bootstrapping"}`:                              5,
		`kvxfer_rooms{status="Success"}`:                                    1, // concluded, waiting for Clear
		`kvxfer_transfers_posted_total`:                                     2,
		`kvxfer_transfers_completed_total{outcome="ok"}`:                    2,
		`kvxfer_transfer_bytes_total{outcome="ok"}`:                         4 * 4096,
		`kvxfer_nonterminal_rooms`:                                          5,
		`kvxfer_oldest_nonterminal_room_age_seconds`:                        100,
		`kvxfer_room_status_duration_seconds_count{status="Bootstrapping"}`: 1,
	} {
		if got := m[k]; got != v {
			t.Fatalf("%s = %v, want %v", k, got, v)
		}
	}
	// Abort the stuck rooms: the silent-pin gauge falls back.
	for _, id := range stuck {
		eng.Abort(id)
	}
	eng.PollSync(stuck, nil)
	eng.Clear(1)
	eng.PollSync([]uint64{1}, nil)
	eng.Fail(99, kv.ReasonInvalidRequest) // a frame that named an unknown room
	eng.Init(98, 1, 0)                    // for no room: absorbed
	eng.PollSync([]uint64{99}, nil)
	m = Scrape(t, srv.URL)
	for k, v := range map[string]float64{
		`kvxfer_oldest_nonterminal_room_age_seconds`:                                   0,
		`kvxfer_nonterminal_rooms`:                                                     0,
		`kvxfer_room_failures_total{reason="client_abort"}`:                            5,
		`kvxfer_room_failures_total{reason="invalid_request"}`:                         1,
		`kvxfer_rooms{status="Failed"}`:                                                5, // concluded, waiting for Clear
		`kvxfer_rooms_retired_total{status="Success"}`:                                 1,
		`kvxfer_rooms_retired_total{status="Failed"}`:                                  1,
		`kvxfer_messages_absorbed_total{msg="init",room="retired"}`:                    1,
		`kvxfer_room_status_duration_seconds_bucket{status="Bootstrapping",le="+Inf"}`: 7, // 1, the 5 stuck, 99
	} {
		if got := m[k]; got != v {
			t.Fatalf("%s = %v, want %v", k, got, v)
		}
	}
}

func waitStatus(t *testing.T, eng *actors.Engine, id uint64, want kv.Status) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for eng.PollSync([]uint64{id}, nil)[0].Status != want {
		if time.Now().After(deadline) {
			t.Fatalf("room %d never %v", id, want)
		}
		time.Sleep(20 * time.Microsecond)
	}
}
