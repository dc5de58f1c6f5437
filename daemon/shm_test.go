package daemon

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// TestDaemonShmStats: kvxferd's counters (its kvxfer_shm_* metrics) and
// /debug/shm show a shared-memory session's records, traced opens and the
// session itself; a detach with rooms open counts them lost.
func TestDaemonShmStats(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	c, err := control.Dial(d.ControlEndpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := control.AttachShm(c, control.ShmOptions{RingEntries: 16, Slots: 8, IndexWords: 64})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.OpenTraced(5, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"); err != nil {
		t.Fatal(err)
	}
	if err := s.Open(6); err != nil {
		t.Fatal(err)
	}
	if err := s.Barrier(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + d.DebugAddr() + "/debug/shm")
	if err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Stats    control.ShmStats     `json:"stats"`
		Sessions []control.ShmSession `json:"sessions"`
	}
	err = json.NewDecoder(resp.Body).Decode(&dump)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if dump.Stats.Records != 2 || dump.Stats.TracedOpens != 1 || len(dump.Sessions) != 1 ||
		dump.Sessions[0].ID != s.Session() || dump.Sessions[0].Tail != 2 || dump.Sessions[0].Head != 2 || dump.Sessions[0].RingEntries != 16 {
		t.Fatalf("/debug/shm %+v", dump)
	}
	if m := d.Counters(); m["shm_sessions"] != 1 || m["shm_records"] != 2 || m["shm_traced_opens"] != 1 || m["shm_rooms_lost"] != 0 {
		t.Fatalf("counters %v", m)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if m := d.Counters(); m["shm_sessions"] != 0 || m["shm_sessions_attached"] != 1 || m["shm_rooms_lost"] != 2 {
		t.Fatalf("counters after detach %v", m)
	}
}
