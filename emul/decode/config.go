package decode

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
)

// Config configures an Emulator. DefaultConfig fills every field; Bootstrap
// is the only one without a usable default.
type Config struct {
	// Bootstrap is the prefill bootstrap server, "host:port" or "http://host:port".
	Bootstrap string
	// Host is the IP decode binds its PULL socket to and advertises in its
	// frames (SGLang's local_ip).
	Host string
	// PageSize and KVCacheDtype are decode's own settings; the topology reply
	// must match them, as decode raises on a mismatch. 0 / "" skip the check.
	PageSize     int
	KVCacheDtype string
	// TPSize, TPRank are decode's attn_tp_size and engine_rank; PPSize its
	// pipeline size (1: pull from every prefill stage). MLA selects the MLA
	// fan-in rule (dummy transfer infos) when decode TP < prefill TP.
	TPSize, TPRank, PPSize int
	MLA                    bool
	GPU                    int
	// Shape is decode's memory. State selects hybrid-model state indices
	// (Shape.StateSlots must be > 0; the prefill must send state too).
	Shape kvmem.Shape
	State bool
	// StagingBytes > 0 gives the rank a staging ring of that size (VRAM on
	// GPU), announced in registration frames [14] and [15] as SGLang's decode
	// does with SGLANG_DISAGG_STAGING_BUFFER=1. A prefill with staging off
	// (kvxferd, SGLang's by default) ignores it and writes head slices into
	// the pages; a STAGING_REQ reaching the rank is counted (PullMessages).
	// The staged path itself is checked by StagingRing and StagingView.
	StagingBytes int64

	Workload    workload.Config
	Rooms       int     // rooms Run plays
	Concurrency int     // rooms in flight at once
	Rate        float64 // rooms started per second; 0: as fast as Concurrency allows

	// WaitingTimeout is SGLANG_DISAGGREGATION_WAITING_TIMEOUT: time after the
	// transfer info before decode gives up and sends ABORT.
	WaitingTimeout time.Duration
	// HeartbeatInterval / HeartbeatMaxFailure / HeartbeatTimeout: GET /health
	// cadence, consecutive failures that declare the prefill lost, per-try limit.
	HeartbeatInterval   time.Duration
	HeartbeatMaxFailure int
	HeartbeatTimeout    time.Duration

	// Release is the SGLang release decode plays (frames, completion rule,
	// what it reads on its PULL socket, deferred page release, ABORT
	// generations). ReleaseTimeout is
	// SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT: how long
	// 0.5.21+ hold a room's pages without every ABORT_ACK.
	Release        Release
	ReleaseTimeout time.Duration

	// Shard and Shards split the workload between decode processes: Run plays
	// the rooms i < Rooms with i % Shards == Shard (Shards 0 or 1: all).
	Shard, Shards int

	// TopologyAttempts / TopologyRetry: GET /route topology retries while 503
	// (upstream 15 × ≥1 s). 0 attempts: retry until the context ends.
	TopologyAttempts int
	TopologyRetry    time.Duration

	// Name prefixes the NIXL agent names (made unique per emulator).
	Name string
	// LoopbackDir is where the loopback agents keep their shared memory ("": /dev/shm).
	LoopbackDir string
	// NewAgent, when set, creates each rank's NIXL agent (the real library,
	// for a decode on another host than the prefill); nil: loopback agents.
	NewAgent func(name string) (kvmem.Allocator, error)

	Clock      clock.Clock  // timers: waiting, abort delay, release, heartbeat
	HTTPClient *http.Client // nil: a default client
	Logger     *slog.Logger // nil: discard
	// Progress, when set, gets a line every second while Run runs.
	Progress io.Writer
}

// DefaultConfig returns SGLang's defaults (300 s waiting timeout, 5 s
// heartbeat, 2 failures) with a small demo-sized memory and the default
// workload rule.
func DefaultConfig() Config {
	sh := kvmem.DefaultShape()
	sh.Slots, sh.Item, sh.AuxSlots = 2048, 1024, 512
	return Config{
		Host: "127.0.0.1", TPSize: 1, PPSize: 1, Shape: sh,
		Workload: workload.Default(1), Rooms: 1000, Concurrency: 32,
		WaitingTimeout: 300 * time.Second, HeartbeatInterval: 5 * time.Second, HeartbeatMaxFailure: 2,
		HeartbeatTimeout: 3 * time.Second, Release: Release0523, ReleaseTimeout: 30 * time.Second,
		TopologyAttempts: 15, TopologyRetry: time.Second, Name: "kvxfer-decode",
	}
}

func (c *Config) validate() error {
	switch {
	case c.Bootstrap == "":
		return errors.New("decode: no bootstrap address")
	case c.Concurrency < 1:
		return errors.New("decode: concurrency must be ≥ 1")
	case c.WaitingTimeout <= 0, c.HeartbeatInterval <= 0, c.ReleaseTimeout <= 0, c.HeartbeatTimeout <= 0:
		return errors.New("decode: timeouts and intervals must be > 0")
	case c.StagingBytes < 0:
		return errors.New("decode: negative staging size")
	case c.State && c.Shape.StateSlots == 0:
		return errors.New("decode: state needs Shape.StateSlots > 0")
	case c.Shape.Slots < c.Workload.MaxPages:
		return errors.New("decode: fewer KV pages than one room needs")
	case c.Release == 0 || c.Release >= numReleases:
		return errors.New("decode: no SGLang release")
	case c.Shards > 1 && (c.Shard < 0 || c.Shard >= c.Shards), c.Shards < 0:
		return fmt.Errorf("decode: shard %d of %d", c.Shard, c.Shards)
	}
	if c.HeartbeatMaxFailure < 1 {
		c.HeartbeatMaxFailure = 1
	}
	return c.Workload.Validate()
}
