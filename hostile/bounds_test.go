package hostile

import "time"

// The bounds every attack is judged against. The reference figures (TestBaseline:
// kvxferd with the honest workload of 300 rooms, no attack) are in
// docs/hostile.md; the bounds leave room for the attacks' own legitimate
// state (a few links, capped tables) but not for growth with the attack's size.
// gcFloorMiB is kvxferd's default -gc-floor-mib: the GC lets garbage grow the
// heap to it before a cycle (internal/gcfloor), so a flood of requests that
// keeps nothing still grows RSS up to about the floor, once, whatever its size.
const gcFloorMiB = 64

var bounds = struct {
	steady     procBounds // any test: the daemon's peak while attacked
	f2         procBounds // 3,300 return addresses
	f4         procBounds // 300,000 unknown rooms and 4 huge frames
	f8         procBounds // a client polling 2^20 rooms in a loop (each request 9 MiB)
	f7RSSMiB   float64    // RSS growth from 50,000 fake rank tuples, beyond kvxferd's GC heap floor
	f7Accepted int        // fake rank tuples accepted (the rank table's cap: bootstrap.DefaultMaxRanks)

	f2bThreads, f2bFDs, f2bMaps int // growth over all decode restarts

	f3Exit      time.Duration // SIGTERM to exit with 10,000 notices owed (drain 3 s + 5 s + slack)
	f5LogBytes  int64         // log growth from 200,000 ABORTs to an unreachable decode
	f8P99       time.Duration // a small poll's p99 while another client polls 2^20 rooms
	f6ProbeWait time.Duration // each /health and /healthz probe under 2,000 stalled connections
}{
	steady:      procBounds{rssMiB: 256, threads: 64, fds: 256},
	f2:          procBounds{rssMiB: 256, threads: 64, fds: 256},
	f4:          procBounds{rssMiB: 512, threads: 64, fds: 256},
	f8:          procBounds{rssMiB: 512, threads: 64, fds: 256},
	f7RSSMiB:    16 + gcFloorMiB,
	f7Accepted:  4096,
	f2bThreads:  4,
	f2bFDs:      8,
	f2bMaps:     4,
	f3Exit:      10 * time.Second,
	f5LogBytes:  256 << 10,
	f8P99:       100 * time.Millisecond, // measured 18 ms (413 ms before); room for a loaded CI box
	f6ProbeWait: 3 * time.Second,
}
