package suite

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/bench"
	"github.com/kvxfer/kvxfer/bench/dict"
	"github.com/kvxfer/kvxfer/bench/large"
	"github.com/kvxfer/kvxfer/bench/stats"
	"github.com/kvxfer/kvxfer/bench/workload"
	wl "github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/internal/gcfloor"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// runner holds what every scenario of a suite shares: the loopback fabric
// (built once) and the progress display.
type runner struct {
	cfg    Config
	fabric *workload.Fabric
	direct *dict.Direct // the dict engines' writes: upstream's busy-wait on NIXL handles
	label  atomic.Pointer[string]
	prog   atomic.Pointer[workload.Progress]
	total  atomic.Int64
	pace   time.Duration // of the runs in progress
}

// Run runs every scenario of cfg and returns the results. progress gets a
// line per second (nil: none).
func Run(cfg Config, command string, progress io.Writer) (*Results, error) {
	res := &Results{Suite: cfg.Name, Command: command, Started: time.Now().UTC(), GoVersion: runtime.Version(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(), GCFloorMiB: cfg.GCFloorMiB, WarmUp: cfg.WarmUp}
	// Every engine runs in this process under kvxferd's GC policy: a heap
	// floor (internal/gcfloor), or GOGC alone where cfg turns it off.
	tu := gcfloor.Start(uint64(max(cfg.GCFloorMiB, 0)) << 20)
	defer tu.Stop()
	if tu == nil {
		res.GCFloorMiB = 0
	}
	for _, k := range cfg.Engines {
		res.Engines = append(res.Engines, string(k))
	}
	res.LoadAvg[0] = loadavg()
	f, err := workload.NewFabric()
	if err != nil {
		return nil, fmt.Errorf("suite: building the loopback fabric: %w", err)
	}
	defer f.Close()
	r := &runner{cfg: cfg, fabric: f}
	if r.direct, err = dict.NewDirect(f.Prefill.Agent, &f.Prefill.Geo, []sglang.PeerGeometry{f.Decode[0].Peer(), f.Decode[1].Peer()}, 4); err != nil {
		return nil, fmt.Errorf("suite: preparing the dict engines' direct NIXL path: %w", err)
	}
	defer r.direct.Close()
	stop := r.display(progress, res.Started)
	defer stop()

	res.WarmUpRuns = r.warmUp()
	for _, p := range cfg.Throughput {
		for _, st := range cfg.Settings {
			spec := st.spec(workload.Spec{Rooms: p.Rooms, Concurrency: p.Concurrency, TwoAgents: 0.3, Seed: cfg.Seed})
			res.Throughput = append(res.Throughput, r.runSet(fmt.Sprintf("c=%d %s", p.Concurrency, st.Name), st, spec, p.Reps))
		}
	}
	for _, p := range cfg.Paced {
		st := rdmaSetting(cfg.Settings)
		spec := st.spec(workload.Spec{Rooms: p.Rooms, Concurrency: p.Concurrency, TwoAgents: 0.3, Seed: cfg.Seed})
		r.pace = cfg.Pace
		res.Paced = append(res.Paced, r.runSet(fmt.Sprintf("paced %v c=%d %s", cfg.Pace, p.Concurrency, st.Name), st, spec, p.Reps))
		r.pace = 0
	}
	for _, p := range cfg.Overhead {
		spec := workload.Spec{Rooms: p.Rooms, Concurrency: p.Concurrency, TwoAgents: 0.3, Seed: cfg.Seed}
		res.Overhead = append(res.Overhead, r.runSet(fmt.Sprintf("c=%d instant", p.Concurrency), Setting{Name: "instant"}, spec, p.Reps))
	}
	if cfg.Storm.Rooms > 0 {
		s := r.runSet(fmt.Sprintf("abort storm %.0f%%", 100*cfg.StormShare), stormSetting, cfg.stormSpec(cfg.Storm, cfg.StormShare), cfg.Storm.Reps)
		res.Storm = &s
		for _, st := range cfg.StormSettings {
			spec := cfg.stormSpec(cfg.Storm, cfg.StormShare)
			spec.Latency, spec.SlowShare, spec.Slow = st.Latency, st.SlowShare, st.Slow
			res.StormBySetting = append(res.StormBySetting,
				r.runSet(fmt.Sprintf("abort storm %.0f%% %s", 100*cfg.StormShare, st.Name), st, spec, max(cfg.StormSettingReps, 1)))
		}
	}
	for _, share := range cfg.PinShares {
		res.Pins = append(res.Pins, r.runSet(fmt.Sprintf("pins at %.0f%% aborts", 100*share), stormSetting, cfg.stormSpec(cfg.PinPoint, share), cfg.PinPoint.Reps))
	}
	if cfg.OpenLoopRate > 0 {
		spec := cfg.stormSpec(Point{Rooms: cfg.OpenLoopRooms}, cfg.StormShare)
		spec.Rate = cfg.OpenLoopRate
		s := r.runSet(fmt.Sprintf("open loop %.0f rooms/s", cfg.OpenLoopRate), stormSetting, spec, max(cfg.OpenLoopReps, 1))
		res.OpenLoop = &s
	}
	for _, n := range cfg.Memory {
		r.setLabel(fmt.Sprintf("memory with %d live rooms", n), nil, 0)
		mp := MemoryPoint{Rooms: n}
		for _, k := range cfg.Engines {
			u, err := memory(k, n)
			if err != nil {
				return nil, err
			}
			mp.Engines = append(mp.Engines, u)
		}
		res.Memory = append(res.Memory, mp)
	}
	if cfg.PollRooms > 0 {
		r.setLabel(fmt.Sprintf("batched poll of %d rooms", cfg.PollRooms), nil, 0)
		for _, k := range cfg.Engines {
			p, err := pollLatency(k, cfg.PollRooms, cfg.PollRounds)
			if err != nil {
				return nil, err
			}
			res.Poll = append(res.Poll, p)
		}
	}
	if cfg.Races {
		r.setLabel("race scenarios", nil, 0)
		res.Races = races()
	}
	if cfg.Large != nil {
		r.setLabel("large rooms over real NIXL", nil, 0)
		if res.Large, err = large.Run(*cfg.Large, nil); err != nil {
			return nil, err
		}
	}
	res.Duration = time.Since(res.Started)
	res.LoadAvg[1] = loadavg()
	return res, nil
}

// warmUp runs every engine once at every transfer setting of the suite (the
// RDMA model where it has none), Config.WarmUp's rooms, discarding the
// results; it returns the runs made.
func (r *runner) warmUp() int {
	if r.cfg.WarmUp.Rooms <= 0 {
		return 0
	}
	sets := r.cfg.Settings
	if len(sets) == 0 {
		sets = []Setting{rdmaSetting(nil)}
	}
	for _, st := range sets {
		spec := st.spec(workload.Spec{Rooms: r.cfg.WarmUp.Rooms, Concurrency: r.cfg.WarmUp.Concurrency, TwoAgents: 0.3, Seed: r.cfg.Seed + 1})
		r.runSet("warm-up "+st.Name, st, spec, 1)
	}
	return len(sets) * len(r.cfg.Engines)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func (r *runner) setLabel(s string, p *workload.Progress, total int) {
	r.label.Store(&s)
	r.prog.Store(p)
	r.total.Store(int64(total))
}

// display prints a line per second: elapsed time, the scenario, and the
// rooms of the current run that reached a terminal answer.
func (r *runner) display(w io.Writer, start time.Time) (stop func()) {
	return wl.Progress(w, time.Second, func() string {
		label := ""
		if l := r.label.Load(); l != nil {
			label = *l
		}
		line := fmt.Sprintf("[%4.0fs] %s", time.Since(start).Seconds(), label)
		if p := r.prog.Load(); p != nil {
			line += fmt.Sprintf(": %d/%d rooms terminal, %d admitted", p.Terminal.Load(), r.total.Load(), p.Admitted.Load())
		}
		return line
	})
}

// runSet runs spec on every engine, reps times, rotating the engine order
// each repetition, and summarizes.
func (r *runner) runSet(name string, st Setting, spec workload.Spec, reps int) RunSet {
	loopback := st.Loopback
	reps = max(reps, 1)
	plans, err := workload.Generate(spec)
	if err != nil {
		panic(err) // the suite's own specs are valid
	}
	spec, _ = spec.Normalize()
	set := RunSet{Name: name, Setting: st.Name, Transfer: "instant", Spec: spec, Bandwidth: st.Bandwidth, Reps: reps, Pace: r.pace, RatioRate: map[string]float64{}}
	if loopback {
		set.Transfer = "loopback"
		r.setWire(spec.LatencyFunc(), st.Bandwidth)
	}
	type acc struct {
		runs       []RunSummary
		byPhase    map[string]*workload.PhaseA2T
		ttt, a2t   []time.Duration
		a2tIters   []int
		tttIters   []int
		polls      []time.Duration
		never      int
		pinned     int
		leaked     int
		rates, cpu []float64
		heap       []float64
		load       string
	}
	accs := map[bench.Kind]*acc{}
	ratios := map[string][]float64{}
	for rep := range reps {
		order := slices.Clone(r.cfg.Engines)
		for range rep % len(order) {
			order = append(order[1:], order[0])
		}
		rate := map[bench.Kind]float64{}
		for _, k := range order {
			p := &workload.Progress{}
			r.setLabel(fmt.Sprintf("%s, rep %d/%d, %s", name, rep+1, reps, k), p, len(plans))
			res, heap, err := r.one(k, loopback, plans, spec, p)
			if err != nil {
				panic(err)
			}
			load := loadavg()
			a := accs[k]
			if a == nil {
				a = &acc{}
				accs[k] = a
			}
			s := summarize(&res)
			a.runs = append(a.runs, s)
			a.ttt = append(a.ttt, res.TTT...)
			a.a2t = append(a.a2t, res.A2T...)
			a.a2tIters = append(a.a2tIters, res.A2TIters...)
			a.tttIters = append(a.tttIters, res.TTTIters...)
			a.polls = append(a.polls, res.Polls...)
			a.never += res.AbortsNever
			for k, ph := range res.ByPhase {
				if a.byPhase == nil {
					a.byPhase = map[string]*workload.PhaseA2T{}
				}
				if a.byPhase[k] == nil {
					a.byPhase[k] = &workload.PhaseA2T{}
				}
				a.byPhase[k].A2T = append(a.byPhase[k].A2T, ph.A2T...)
				a.byPhase[k].Never += ph.Never
			}
			a.pinned += res.Pinned()
			a.leaked = max(a.leaked, res.Leaked)
			a.rates = append(a.rates, res.RoomsPerSec)
			a.cpu = append(a.cpu, res.CPUPer1k())
			if heap != 0 {
				a.heap = append(a.heap, heap)
			}
			a.load = load
			rate[k] = res.RoomsPerSec
			runtime.GC()
		}
		for _, base := range []bench.Kind{bench.Upstream, bench.Fixed} {
			if rate[base] > 0 && rate[bench.Actors] > 0 {
				key := string(bench.Actors) + "/" + string(base)
				ratios[key] = append(ratios[key], rate[bench.Actors]/rate[base])
			}
		}
	}
	for _, k := range r.cfg.Engines {
		a := accs[k]
		sorted := stats.Sorted(a.a2t, a.never)
		var byPhase map[string]stats.Summary
		for k, ph := range a.byPhase {
			if byPhase == nil {
				byPhase = map[string]stats.Summary{}
			}
			byPhase[k] = stats.Summarize(ph.A2T, ph.Never)
		}
		set.Engines = append(set.Engines, EngineRuns{
			Engine: string(k), Runs: a.runs, RoomsPerSec: stats.Median(a.rates), CPUPer1k: stats.Median(a.cpu),
			TTT: stats.Summarize(a.ttt, 0), A2T: stats.Summarize(a.a2t, a.never), A2TCDF: stats.CDF(sorted, 200), A2TByPhase: byPhase,
			A2TIters: stats.SummarizeCounts(a.a2tIters), TTTIters: stats.SummarizeCounts(a.tttIters), Poll: stats.Summarize(a.polls, 0),
			Pinned: a.pinned, Leaked: a.leaked, HeapPerRoom: stats.Median(a.heap), LoadAvg: a.load,
		})
	}
	set.RatioRange = map[string][2]float64{}
	for key, rs := range ratios {
		set.RatioRate[key] = stats.Median(rs)
		set.RatioRange[key] = [2]float64{slices.Min(rs), slices.Max(rs)}
	}
	return set
}

// one runs plans once on a fresh engine of kind k. heap is the live heap
// per live room, measured once mid-run (see heapProbe).
func (r *runner) one(k bench.Kind, loopback bool, plans []wl.Plan, spec workload.Spec, p *workload.Progress) (workload.Result, float64, error) {
	var tr actors.Transfers = workload.Instant{}
	o := workload.Options{Concurrency: spec.Concurrency, Rate: spec.Rate, Progress: p, Quiet: r.cfg.Quiet, Pace: r.pace}
	if loopback {
		tr = r.fabric.Pool
		if k != bench.Actors {
			tr = r.direct // SGLang's worker: post, then busy-wait on the handles
		}
		o.Agents = [2]string{r.fabric.Agent(0), r.fabric.Agent(1)}
		o.Slots, o.AuxSlots = r.fabric.Shape.Slots, r.fabric.Shape.AuxSlots
	}
	rig, err := workload.NewRig(k, tr)
	if err != nil {
		return workload.Result{}, 0, err
	}
	probe := startHeapProbe(p, len(plans))
	res := workload.Run(rig, plans, o)
	heap := probe.stop()
	return res, heap, rig.Close()
}

// setWire sets the loopback fabric's per-request latency and bandwidth
// towards both decode ranks (no timers: see nixl/loopback).
func (r *runner) setWire(lat func() time.Duration, bandwidth float64) {
	for _, d := range r.fabric.Decode {
		r.fabric.Prefill.Agent.SetFault(d.Agent.Name(), loopback.Fault{Latency: lat, Bandwidth: bandwidth})
	}
}

// stormSetting is the transfer layer of the storm, the pin sweep and the open
// loop: loopback copies with the scenario's own latency range.
var stormSetting = Setting{Name: "storm", Loopback: true}

// rdmaSetting is the RDMA model among sets (the paced runs use it), or the
// default one.
func rdmaSetting(sets []Setting) Setting {
	for _, s := range sets {
		if s.Name == "rdma" {
			return s
		}
	}
	return Settings()[2]
}

// spec applies the setting's latency model to a throughput spec.
func (s Setting) spec(sp workload.Spec) workload.Spec {
	sp.Latency, sp.SlowShare, sp.Slow = s.Latency, s.SlowShare, s.Slow
	return sp
}

// heapProbe measures the live heap per live room once in a run without
// touching it: once half of the rooms are terminal, it waits for the next GC
// cycle the run makes itself and takes the live heap that cycle found
// (/gc/heap/live:bytes) and the rooms admitted and not yet terminal; after
// the run (every room terminal, the engine still up) a forced GC gives the
// baseline. (mid − after) ÷ live rooms includes the driver's per-room state
// (the same for every engine). A forced GC mid-run stopped a timed run for
// milliseconds: the rooms in flight then were the time-to-terminal tail. A
// run that makes no cycle after its midpoint (a short run under the heap
// floor) is not measured.
type heapProbe struct {
	quit chan struct{}
	done chan [2]float64 // heap, live rooms
}

var gcMetrics = []string{"/gc/cycles/total:gc-cycles", "/gc/heap/live:bytes"}

// readGC returns the GC cycles completed and the live heap the last one found.
func readGC(s []metrics.Sample) (cycles, live uint64) {
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

func gcSamples() []metrics.Sample {
	s := make([]metrics.Sample, len(gcMetrics))
	for i, n := range gcMetrics {
		s[i].Name = n
	}
	return s
}

func startHeapProbe(p *workload.Progress, n int) *heapProbe {
	h := &heapProbe{quit: make(chan struct{}), done: make(chan [2]float64, 1)}
	go func() {
		s := gcSamples()
		mid := false
		var cycles uint64
		for {
			select {
			case <-h.quit:
				h.done <- [2]float64{}
				return
			default:
			}
			term, adm := p.Terminal.Load(), p.Admitted.Load()
			switch c, live := readGC(s); {
			case !mid && term >= int64(n/2) && adm > term:
				mid, cycles = true, c
			case mid && c > cycles:
				rooms := p.Admitted.Load() - p.Terminal.Load()
				if rooms <= 0 {
					rooms = adm - term
				}
				h.done <- [2]float64{float64(live), float64(rooms)}
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return h
}

// stop returns the heap per live room, 0 when the probe saw no mid-run
// cycle or one that cannot say (see heapPerRoom).
func (h *heapProbe) stop() float64 {
	close(h.quit)
	m := <-h.done
	if m[1] == 0 {
		return 0
	}
	runtime.GC()
	_, after := readGC(gcSamples())
	return heapPerRoom(m[0], float64(after), m[1])
}

// minProbeRooms is the fewest live rooms a heap probe divides by: below it
// (an open loop holds a handful) the rest of the heap's drift between the two
// GCs outweighs the rooms, and the quotient can even be negative.
const minProbeRooms = 100

// heapPerRoom is (mid − after) ÷ live, or 0 (not measured) when fewer than
// minProbeRooms were live or the heap did not shrink once they ended.
func heapPerRoom(mid, after, live float64) float64 {
	if live < minProbeRooms || mid <= after {
		return 0
	}
	return (mid - after) / live
}
