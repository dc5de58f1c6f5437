package daemon

import (
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// BenchmarkRoomConfirmWrites: one room of two chunks after another, from
// the scheduler's send to the room's terminal poll, through a real kvxferd
// (control API, ZMQ, loopback NIXL, real TCP probes on loopback), with
// KVXFER_PEER_CONFIRM_WRITES off and on. Compare with
//
//	go test -run - -bench RoomConfirmWrites -count 5 ./daemon/
func BenchmarkRoomConfirmWrites(b *testing.B) {
	for _, mode := range []struct {
		name    string
		confirm bool
	}{{"off", false}, {"on", true}} {
		b.Run(mode.name, func(b *testing.B) {
			d := startDaemonWith(b, func(c *Config) { c.Liveness.ConfirmWrites = mode.confirm })
			s := newScheduler(b, d)
			dec := newDecode(b, d)
			for b.Loop() {
				id := uint64(20000 + seq.Add(1))
				i := int(id)
				dec.send(b, dec.info(id, seqPages(i%60, 2), i%16, 1))
				s.start(b, roomSpec{id: id, src: seqPages(i%60, 2), chunks: []int{1, 1}, aux: i % 16})
				if rep := s.waitTerminal(b, id); rep.Status != kv.StatusSuccess {
					b.Fatalf("room %d: %v/%v", id, rep.Status, rep.Reason)
				}
			}
		})
	}
}
