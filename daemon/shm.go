package daemon

import (
	"encoding/json"
	"net/http"

	"github.com/kvxfer/kvxfer/transport/control"
)

// shmCounters adds the shared-memory control path's counters to
// Counters' map, under the keys telemetry serves as kvxfer_shm_* metrics.
func shmCounters(m map[string]int64, st control.ShmStats) {
	m["shm_sessions"] = int64(st.Sessions)
	m["shm_sessions_attached"] = int64(st.Attached)
	m["shm_records"] = int64(st.Records)
	m["shm_doorbell_sleeps"] = int64(st.Sleeps)
	m["shm_doorbell_wakes"] = int64(st.Wakes)
	m["shm_missed_wakes"] = int64(st.MissedWakes)
	m["shm_full_waits"] = int64(st.FullWaits)
	m["shm_clients_lost_process_exit"] = int64(st.DroppedDead)
	m["shm_clients_lost_bad_record"] = int64(st.DroppedBad)
	m["shm_rooms_lost"] = int64(st.RoomsLost)
	m["shm_invalid_records"] = int64(st.InvalidSends)
	m["shm_traced_opens"] = int64(st.TracedOpens)
	m["shm_ignored_traceparents"] = int64(st.IgnoredTraceparents)
}

// serveShm is /debug/shm: the counters and every attached session.
func (d *Daemon) serveShm(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"stats": d.control.ShmStats(), "sessions": d.control.ShmSessions()})
}
