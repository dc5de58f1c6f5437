package room

import "testing"

// BenchmarkStepLifecycle is the cost of the rules for one whole room: Open, two
// transfer infos, Init, two chunks, their four completions, Poll, Clear.
func BenchmarkStepLifecycle(b *testing.B) {
	cfg := DefaultConfig()
	tiA := ti("a", epA, pages(1, 2, 3, 4), 2)
	tiB := ti("b", epB, pages(5, 6, 7, 8), 2)
	s1, s2 := Send{Pages: pages(1, 2)}, Send{Pages: pages(3, 4)}
	msgs := []Msg{Open{}, tiA, tiB, Init{NumPages: 4}, s1, s2,
		XferDone{Seq: 0}, XferDone{Seq: 1}, XferDone{Seq: 2}, XferDone{Seq: 3}, Poll{}, Clear{}}
	b.ReportAllocs()
	for b.Loop() {
		m := New(&cfg, 1)
		for _, msg := range msgs {
			m.Step(msg)
		}
		if !m.Retired() {
			b.Fatal("room did not retire")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/step")
}

// BenchmarkStepPoll is the cheapest, most frequent message.
func BenchmarkStepPoll(b *testing.B) {
	cfg := DefaultConfig()
	m := New(&cfg, 1)
	m.Step(Open{})
	b.ReportAllocs()
	for b.Loop() {
		m.Step(Poll{})
	}
}
