package actors

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Environment variables that configure the engine. SGLang's names are used
// where SGLang has the setting; the rest are kvxfer's own.
const (
	EnvBootstrapTimeout = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" // seconds, 300
	EnvWaitingTimeout   = "KVXFER_WAITING_TIMEOUT"                  // seconds, 300
	EnvTransferTimeout  = "KVXFER_TRANSFER_TIMEOUT"                 // seconds, 60
	EnvDrainTimeout     = "KVXFER_DRAIN_TIMEOUT"                    // seconds, 10
	EnvLingerTimeout    = "KVXFER_LINGER_TIMEOUT"                   // seconds, 300
	EnvTombstoneTTL     = "KVXFER_TOMBSTONE_TTL"                    // seconds, 600
	EnvTombstoneCap     = "KVXFER_TOMBSTONE_CAP"                    // count, 262144
	EnvShards           = "KVXFER_DIRECTORY_SHARDS"                 // count, 4×GOMAXPROCS
	EnvRoomCap          = "KVXFER_ROOM_CAP"                         // count, DefaultRoomCap(MemoryLimit())
	EnvPeerRoomCap      = "KVXFER_PEER_ROOM_CAP"                    // count, room cap / 2
	EnvPollTimeout      = "KVXFER_POLL_TIMEOUT"                     // seconds, 10
)

// The default live-room cap: a quarter of the memory kvxferd may use, at
// RoomBudget bytes a room, between MinRoomCap and MaxRoomCap. A live room
// costs about 1.5 KB of heap with one transfer info of a few pages (actor,
// mailbox, machine; docs/engine.md), but 11–16 KiB of RSS each as measured
// while a flood of transfer infos for unknown rooms held 16,384–65,536 of them
// (the runtime's spare heap and the infos' page lists come with them);
// RoomBudget of 32 KiB leaves room for long page lists, the observer's record
// and the tombstone each room leaves. The
// ceiling is far above any scheduler's queue of rooms (thousands: SGLang's
// running and bootstrapping requests) and bounds what a flood of transfer
// infos can hold: measured against a real kvxferd (make test-hostile,
// TestF4UnknownRoomsAndHugeFrames), 300,000 infos for unknown rooms took RSS
// from 31 to 1,146 MiB uncapped, to 754 MiB with a ceiling of 131,072 and
// to 284 MiB with this one (16,384 rooms held: one decode's share).
const (
	RoomBudget = 32 << 10
	MinRoomCap = 1 << 14
	MaxRoomCap = 1 << 15
)

// DefaultRoomCap sizes the live-room cap from a memory limit in bytes (0:
// unknown, which gets MaxRoomCap / 2).
func DefaultRoomCap(memLimit int64) int {
	if memLimit <= 0 {
		return MaxRoomCap / 2
	}
	return int(min(max(memLimit/4/RoomBudget, MinRoomCap), MaxRoomCap))
}

func defaultPeerRoomCap(roomCap int) int { return max(roomCap/2, 1) }

// MemoryLimit is the least of the limits that apply to this process, in bytes:
// the cgroup's (v2 memory.max, v1 memory.limit_in_bytes), GOMEMLIMIT when set,
// and the machine's memory (MemTotal); 0 when none can be read.
func MemoryLimit() int64 {
	lim := int64(math.MaxInt64)
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if b, err := os.ReadFile(f); err == nil {
			if v, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil && v > 0 {
				lim = min(lim, v) // "max" (no limit) does not parse
			}
		}
	}
	if v := debug.SetMemoryLimit(-1); v > 0 {
		lim = min(lim, v)
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64); err == nil && kb > 0 {
					lim = min(lim, kb<<10)
				}
				break
			}
		}
		_ = f.Close()
	}
	if lim == math.MaxInt64 {
		return 0
	}
	return lim
}

// ConfigFromEnv overlays the environment onto cfg (zero fields take their
// defaults first). getenv is os.Getenv in production. Values are seconds
// (fractions allowed) or counts; a malformed value is an error, not a silent
// default.
func ConfigFromEnv(cfg Config, getenv func(string) string) (Config, error) {
	c := cfg.defaulted()
	peerSet := cfg.PeerRoomCap > 0 || getenv(EnvPeerRoomCap) != ""
	durations := []struct {
		name string
		dst  *time.Duration
	}{
		{EnvBootstrapTimeout, &c.Room.Bootstrap},
		{EnvWaitingTimeout, &c.Room.Waiting},
		{EnvTransferTimeout, &c.Room.Transfer},
		{EnvDrainTimeout, &c.Room.Drain},
		{EnvLingerTimeout, &c.Room.Linger},
		{EnvTombstoneTTL, &c.TombstoneTTL},
		{EnvPollTimeout, &c.PollTimeout},
	}
	for _, d := range durations {
		v := getenv(d.name)
		if v == "" {
			continue
		}
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs <= 0 {
			return cfg, fmt.Errorf("actors: %s=%q: want a positive number of seconds", d.name, v)
		}
		*d.dst = time.Duration(secs * float64(time.Second))
	}
	counts := []struct {
		name string
		dst  *int
	}{{EnvTombstoneCap, &c.TombstoneCap}, {EnvShards, &c.Shards}, {EnvRoomCap, &c.RoomCap}, {EnvPeerRoomCap, &c.PeerRoomCap}}
	for _, n := range counts {
		v := getenv(n.name)
		if v == "" {
			continue
		}
		k, err := strconv.Atoi(v)
		if err != nil || k <= 0 {
			return cfg, fmt.Errorf("actors: %s=%q: want a positive integer", n.name, v)
		}
		*n.dst = k
	}
	if !peerSet {
		c.PeerRoomCap = defaultPeerRoomCap(c.RoomCap) // follows KVXFER_ROOM_CAP
	}
	return c, c.Room.Validate()
}
