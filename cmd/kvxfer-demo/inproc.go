// The in-process demo: a prefill rank (the actor engine and its NIXL transfer
// pool over the loopback backend) and two decode ranks with their own
// shared-memory KV pools, in one process, driven by a workload with chunked
// prefill and aborts at random phases from both sides. Decode frees its pages
// only when kvxfer tells it the room is finished with (success, or a failure
// status / ABORT_ACK after the drain) and reuses them at once, so a late write
// would corrupt another room's bytes, which decode verifies.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

type options struct {
	rooms, concurrency, maxChunks, maxPagesPerChunk int
	abortShare                                      float64
	seed                                            uint64
	grace                                           time.Duration
}

func inProcessMain(args []string) error {
	var o options
	fs := flag.NewFlagSet("kvxfer-demo -inprocess", flag.ContinueOnError)
	fs.IntVar(&o.rooms, "rooms", 20000, "rooms to run")
	fs.IntVar(&o.concurrency, "concurrency", 64, "rooms in flight at once")
	fs.IntVar(&o.maxChunks, "max-chunks", 4, "chunks per room (1..n)")
	fs.IntVar(&o.maxPagesPerChunk, "max-pages", 4, "pages per chunk (1..n)")
	fs.Float64Var(&o.abortShare, "abort-share", 0.2, "share of rooms aborted at a random phase")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed")
	fs.DurationVar(&o.grace, "grace", 30*time.Second, "how long after the workload a non-terminal room counts as pinned")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return run(o)
}

// abortPhase is where a room's abort lands.
type abortPhase int

const (
	noAbort abortPhase = iota
	decodeBeforeOpen
	clientAfterInfo
	decodeMidTransfer
	clientMidTransfer
	decodeAfterSuccess
	numPhases
)

var phaseNames = [numPhases]string{"none", "decode abort before the sender", "client abort after transfer info",
	"decode abort mid-transfer", "client abort mid-transfer", "decode abort after success"}

type result struct {
	phase   abortPhase
	status  room.Status
	reason  room.Reason
	elapsed time.Duration
	pinned  bool
}

type demo struct {
	o       options
	eng     *actors.Engine
	pool    *xfer.Pool
	pre     *kvmem.Node
	dec     [2]*decodeRank
	preFree *slots
	byteErr atomic.Int64
	checked atomic.Int64
	leaks   atomic.Int64
}

func run(o options) error {
	sh := kvmem.DefaultShape()
	sh.Slots, sh.Item, sh.AuxSlots = 2048, 1024, 512
	pre, err := kvmem.New(fmt.Sprintf("demo-prefill-%d", os.Getpid()), sh, 0, loopback.Options{})
	if err != nil {
		return err
	}
	defer pre.Close()
	pool, err := xfer.New(xfer.Config{Agent: pre.Agent, Local: &pre.Geo})
	if err != nil {
		return err
	}
	defer pool.Close()
	d := &demo{o: o, pre: pre, pool: pool, preFree: newSlots(sh.Slots)}
	for i := range d.dec {
		n, err := kvmem.New(fmt.Sprintf("demo-decode%d-%d", i, os.Getpid()), sh, 0, loopback.Options{})
		if err != nil {
			return err
		}
		defer n.Close()
		md, err := n.Agent.LocalMetadata()
		if err != nil {
			return err
		}
		if _, err := pre.Agent.LoadPeer(md); err != nil {
			return err
		}
		if err := pool.AddPeer(n.Peer()); err != nil {
			return err
		}
		d.dec[i] = newDecodeRank(i, n)
		go d.dec[i].drainNotifs()
		defer d.dec[i].stop()
	}
	cfg := actors.Config{Transfers: pool, Notifier: d, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	cfg.Room = room.DefaultConfig()
	cfg.Room.Bootstrap, cfg.Room.Waiting, cfg.Room.Transfer, cfg.Room.Drain, cfg.Room.Linger = 5*time.Second, 5*time.Second, 5*time.Second, 2*time.Second, 10*time.Second
	d.eng, err = actors.New(cfg)
	if err != nil {
		return err
	}

	fmt.Printf("kvxfer demo: %d rooms, %d in flight, up to %d chunks × %d pages, %.0f%% aborted, 2 decode ranks over loopback NIXL\n",
		o.rooms, o.concurrency, o.maxChunks, o.maxPagesPerChunk, 100*o.abortShare)
	results := make([]result, o.rooms)
	sem := make(chan struct{}, o.concurrency)
	var wg sync.WaitGroup
	var finished atomic.Int64
	start := time.Now()
	stopProgress := progress(&finished, o.rooms)
	rng := rand.New(rand.NewPCG(o.seed, 99))
	for i := range o.rooms {
		plan := d.plan(rng, uint64(i)*2654435761+1)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done(); finished.Add(1) }()
			results[i] = d.runRoom(plan)
		}()
	}
	wg.Wait()
	stopProgress()
	wall := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closeErr := d.eng.Close(ctx)
	return d.report(results, wall, closeErr)
}

// progress prints a line a second while the workload runs.
func progress(done *atomic.Int64, total int) func() {
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Printf("  … %d/%d rooms terminal\n", done.Load(), total)
			}
		}
	}()
	return func() { close(stop) }
}

func (d *demo) report(results []result, wall time.Duration, closeErr error) error {
	type key struct {
		phase  abortPhase
		status room.Status
		reason room.Reason
	}
	counts := map[key]int{}
	var lat []time.Duration
	pinned := 0
	for _, r := range results {
		if r.pinned {
			pinned++
			continue
		}
		counts[key{r.phase, r.status, r.reason}]++
		lat = append(lat, r.elapsed)
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if a.phase != b.phase {
			return int(a.phase) - int(b.phase)
		}
		return int(a.status)*100 + int(a.reason) - int(b.status)*100 - int(b.reason)
	})
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "abort phase\toutcome\treason\trooms")
	for _, k := range keys {
		reason := k.reason.String()
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\n", phaseNames[k.phase], k.status, reason, counts[k])
	}
	w.Flush()
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	st := d.pool.Stats()
	fmt.Printf("\nrooms %d  pinned %d  throughput %.0f rooms/s  time-to-terminal p50 %v p99 %v\n",
		len(results), pinned, float64(len(results))/wall.Seconds(), pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond))
	fmt.Printf("pages verified on decode %d  wrong bytes %d  decode pages never released %d  NIXL requests %d  quarantined %d\n",
		d.checked.Load(), d.byteErr.Load(), d.leaks.Load(), st.Requests, st.Quarantined)
	switch {
	case pinned > 0:
		return fmt.Errorf("%d rooms pinned", pinned)
	case d.byteErr.Load() > 0:
		return fmt.Errorf("%d rooms with wrong bytes on decode", d.byteErr.Load())
	case d.leaks.Load() > 0:
		return fmt.Errorf("%d rooms whose decode pages were never released", d.leaks.Load())
	case closeErr != nil:
		return closeErr
	}
	fmt.Println("OK: every room terminal, every successful room's bytes verified on decode")
	return nil
}

// Notify implements actors.Notifier: decode rank i listens on port i.
func (d *demo) Notify(id uint64, n room.Notice) {
	if n.To.Port >= 0 && n.To.Port < len(d.dec) {
		d.dec[n.To.Port].notice(id)
	}
}
