package daemon

import (
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/peer"
)

// BenchmarkDecodeRegistration: one decode's registration, from the frame on
// the wire to the agent loaded and counted (NIXL metadata load, pool,
// link, probe watch), through a real kvxferd; between iterations the agent
// is dropped (not timed).
//
//	go test -run - -bench DecodeRegistration -count 5 ./daemon/
func BenchmarkDecodeRegistration(b *testing.B) {
	d := startDaemonWith(b, func(c *Config) {})
	newScheduler(b, d)
	dec := newDecode(b, d)
	agent := dec.reg.AgentName
	want := int64(1)
	waitCount := func(n int64) {
		deadline := time.Now().Add(20 * time.Second)
		for d.Counters()["registrations"] != n {
			if time.Now().After(deadline) {
				b.Fatalf("registration %d never counted", n)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	waitCount(want)
	for b.Loop() {
		b.StopTimer()
		d.peers.actors.Send(agent, peer.Drop{Why: "benchmark"})
		for deadline := time.Now().Add(20 * time.Second); peerState(b, d, agent).State != "gone"; {
			if time.Now().After(deadline) {
				b.Fatal("never dropped")
			}
		}
		b.StartTimer()
		dec.send(b, dec.reg.Encode())
		want++
		waitCount(want)
	}
}
