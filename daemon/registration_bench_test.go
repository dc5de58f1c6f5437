package daemon

import (
	"testing"
	"time"
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
		d.dropAgent(agent, "benchmark", false)
		b.StartTimer()
		dec.send(b, dec.reg.Encode())
		want++
		waitCount(want)
	}
}
