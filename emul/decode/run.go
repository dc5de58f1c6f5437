package decode

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/emul/workload"
)

// Indices returns the workload indices Run plays: 0..Rooms-1, or with
// Shards > 1 those with i % Shards == Shard.
func (c *Config) Indices() []int {
	var out []int
	for i := range c.Rooms {
		if c.Shards <= 1 || i%c.Shards == c.Shard {
			out = append(out, i)
		}
	}
	return out
}

// Run plays its share of cfg.Rooms rooms of the workload (Config.Indices):
// room i is Workload.Plan(i), started in index order at cfg.Rate rooms/s (0:
// as fast as cfg.Concurrency allows), at most cfg.Concurrency at once. It
// returns when every room is done on decode (or ctx ends: the rooms still
// running then end as errors).
func (e *Emulator) Run(ctx context.Context) *Summary {
	idx := e.cfg.Indices()
	results := make([]Result, len(idx))
	sem := make(chan struct{}, e.cfg.Concurrency)
	var wg sync.WaitGroup
	var done, ok atomic.Int64
	start := time.Now()
	stopProgress := e.progress(&done, &ok, len(idx))
	for n, i := range idx {
		if e.cfg.Rate > 0 {
			due := start.Add(time.Duration(float64(n) / e.cfg.Rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		p := e.cfg.Workload.Plan(i)
		if ctx.Err() != nil {
			results[n] = Result{Plan: p, Outcome: OutcomeError, Reason: ctx.Err().Error()}
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[n] = e.RunRoom(ctx, p)
			if results[n].Outcome == OutcomeSuccess {
				ok.Add(1)
			}
			done.Add(1)
		}()
	}
	wg.Wait()
	stopProgress()
	return e.summarize(results, time.Since(start))
}

// progress prints a line a second to cfg.Progress while rooms run.
func (e *Emulator) progress(done, ok *atomic.Int64, total int) func() {
	return workload.Progress(e.cfg.Progress, time.Second, func() string {
		pages, aux := e.Held()
		return fmt.Sprintf("  … %d/%d rooms done, %d succeeded, %d pages / %d aux slots held", done.Load(), total, ok.Load(), pages, aux)
	})
}
