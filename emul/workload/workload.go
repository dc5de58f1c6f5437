package workload

import (
	"flag"
	"fmt"
	"time"
)

// Plan is one room, as both sides see it.
type Plan struct {
	Index int
	Room  uint64 // RoomID(seed, Index)
	// Pages is the number of KV pages prefill sends for the room: sender.init's
	// page count, and the length of decode's destination page list. Page j of
	// the request is filled with kvmem FillPageAt(room, slot, j).
	Pages int
	// Chunks are the page counts of the scheduler's sender.send calls, in
	// order; they sum to Pages. A full decode prefix hit is the single empty
	// chunk [0] (prefill then sends aux_nokv).
	Chunks []int
	// PrefixPages is decode's radix-cache hit in pages: decode_prefix_len is
	// PrefixPages × page_size tokens. PrefixPages > 0 with Pages == 0 is a full hit.
	PrefixPages int
	// Dummy: a second decode rank sends a dummy (empty) transfer info for the
	// room, and both ranks send required_dst_info_num = 2.
	Dummy bool
	// Agents is how many decode ranks send a real transfer info for the room:
	// 1 under the emulators' rule (plus the dummy rank, if any), 1 or 2 (a
	// replicated decode) in the bench generator.
	Agents int
	Abort  AbortKind
	// AbortDelay is how long after the transfer info decode aborts
	// (AbortDecodeAfterInfo only).
	AbortDelay time.Duration
	// Arrival is the room's offset from the start of an open-loop run (the
	// bench generator with a Rate); 0 otherwise.
	Arrival time.Duration
}

// fullPrefixHit reports whether decode already holds every page.
func (p Plan) fullPrefixHit() bool { return p.Pages == 0 && p.PrefixPages > 0 }

// Config holds the knobs of the rule. Both emulators must be given the same
// values (RegisterFlags gives them the same flag names and defaults).
type Config struct {
	Seed          uint64
	MaxPages      int           // pages per room: 1..MaxPages (default 8)
	MaxChunks     int           // chunks per room: 1..MaxChunks (default 3)
	AbortShare    float64       // share of rooms with an abort plan (default 0.1)
	DummyShare    float64       // share of rooms with a dummy second decode rank (default 0.1)
	PrefixShare   float64       // share of rooms with a decode prefix hit (default 0.1), half of them full hits
	MaxAbortDelay time.Duration // AbortDecodeAfterInfo delay: [0, MaxAbortDelay) (default 20 ms)
}

// Default is the rule with every default and the given seed.
func Default(seed uint64) Config {
	return Config{Seed: seed, MaxPages: 8, MaxChunks: 3, AbortShare: 0.1, DummyShare: 0.1, PrefixShare: 0.1,
		MaxAbortDelay: 20 * time.Millisecond}
}

// RegisterFlags defines -seed, -max-pages, -max-chunks, -abort-share,
// -dummy-share, -prefix-share and -max-abort-delay on fs, with c's current
// values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "workload seed (both emulators must use the same)")
	fs.IntVar(&c.MaxPages, "max-pages", c.MaxPages, "pages per room: 1..n")
	fs.IntVar(&c.MaxChunks, "max-chunks", c.MaxChunks, "prefill chunks per room: 1..n")
	fs.Float64Var(&c.AbortShare, "abort-share", c.AbortShare, "share of rooms with an abort plan")
	fs.Float64Var(&c.DummyShare, "dummy-share", c.DummyShare, "share of rooms with a dummy transfer info from a second decode rank")
	fs.Float64Var(&c.PrefixShare, "prefix-share", c.PrefixShare, "share of rooms with a decode prefix hit (half of them full hits)")
	fs.DurationVar(&c.MaxAbortDelay, "max-abort-delay", c.MaxAbortDelay, "decode abort after the transfer info: delay in [0, d)")
}

// Validate rejects values the rule cannot use.
func (c Config) Validate() error {
	switch {
	case c.MaxPages < 1, c.MaxChunks < 1:
		return fmt.Errorf("workload: max-pages and max-chunks must be ≥ 1")
	case c.AbortShare < 0 || c.AbortShare > 1, c.DummyShare < 0 || c.DummyShare > 1, c.PrefixShare < 0 || c.PrefixShare > 1:
		return fmt.Errorf("workload: shares must be in [0, 1]")
	case c.MaxAbortDelay < 0:
		return fmt.Errorf("workload: negative max-abort-delay")
	}
	return nil
}

// planFor is room i of the default rule for seed: Default(seed).Plan(i).
func planFor(seed uint64, i int) Plan { return Default(seed).Plan(i) }

// Draw keys: each decision reads its own independent value.
const (
	keyPages = iota + 1
	keyChunks
	keyAbortRoll
	keyAbortKind
	keyAbortDelay
	keyDummy
	keyPrefixRoll
	keyPrefixLen
	keyPrefixFull
)

// Plan is room i (i ≥ 0) under c.
func (c Config) Plan(i int) Plan {
	p := Plan{Index: i, Room: RoomID(c.Seed, i), Agents: 1}
	d := func(k uint64) uint64 { return Draw(c.Seed, i, k) }
	u := func(k uint64) float64 { return Unit(c.Seed, i, k) }
	maxPages, maxChunks := max(c.MaxPages, 1), max(c.MaxChunks, 1)
	p.Pages = 1 + int(d(keyPages)%uint64(maxPages))
	n := 1 + int(d(keyChunks)%uint64(maxChunks))
	if u(keyPrefixRoll) < c.PrefixShare {
		p.PrefixPages = 1 + int(d(keyPrefixLen)%4)
		if d(keyPrefixFull)%2 == 1 {
			p.Pages = 0
		}
	}
	p.Dummy = u(keyDummy) < c.DummyShare
	if u(keyAbortRoll) < c.AbortShare {
		p.Abort = ruleKinds[1+d(keyAbortKind)%uint64(len(ruleKinds)-1)]
		if p.Abort == AbortDecodeAfterInfo {
			p.AbortDelay = time.Duration(u(keyAbortDelay) * float64(c.MaxAbortDelay))
		}
		if p.Abort == AbortPrefillMidTransfer {
			if p.Pages < 2 {
				p.Abort = AbortPrefillClient // no chunk boundary to abort at
			} else {
				n = max(n, 2)
			}
		}
	}
	p.Chunks = split(p.Pages, n)
	return p
}

// split cuts pages into min(n, pages) non-empty chunks, the larger ones first
// ([0] when pages is 0).
func split(pages, n int) []int {
	if pages == 0 {
		return []int{0}
	}
	n = min(n, pages)
	out := make([]int, n)
	for k := range out {
		out[k] = pages / n
		if k < pages%n {
			out[k]++
		}
	}
	return out
}

const (
	golden = 0x9E3779B97F4A7C15
	mask62 = 1<<62 - 1
)

// mix is SplitMix64's output function.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// Draw is the k-th pseudo-random value of room i:
// mix(mix(seed + (i+1)·φ) + k·φ), φ = 0x9E3779B97F4A7C15, mix = SplitMix64's
// finalizer, all arithmetic mod 2^64.
func Draw(seed uint64, i int, k uint64) uint64 {
	return mix(mix(seed+(uint64(i)+1)*golden) + k*golden)
}

// Unit is Draw mapped to [0, 1): the top 53 bits over 2^53.
func Unit(seed uint64, i int, k uint64) float64 {
	return float64(Draw(seed, i, k)>>11) / (1 << 53)
}

// RoomID is the bootstrap_room of room i: a bijection of i on 62 bits, plus 1.
// Distinct i (for one seed) give distinct rooms; rooms are never 0 (decode reads
// a zero aux bootstrap_room as "not landed yet") and stay below 2^63 as SGLang
// requires. The bijection: x = (seed·φ + i) mod 2^62, then
// x ^= x>>31; x = x·0xBF58476D1CE4E5B9 mod 2^62; x ^= x>>29;
// x = x·0x94D049BB133111EB mod 2^62; x ^= x>>32 (xor-shifts and odd multipliers
// are invertible mod 2^62).
func RoomID(seed uint64, i int) uint64 {
	x := (seed*golden + uint64(i)) & mask62
	x ^= x >> 31
	x = (x * 0xBF58476D1CE4E5B9) & mask62
	x ^= x >> 29
	x = (x * 0x94D049BB133111EB) & mask62
	x ^= x >> 32
	return x + 1
}
