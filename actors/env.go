package actors

import (
	"fmt"
	"strconv"
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
)

// ConfigFromEnv overlays the environment onto cfg (zero fields take their
// defaults first). getenv is os.Getenv in production. Values are seconds
// (fractions allowed) or counts; a malformed value is an error, not a silent
// default.
func ConfigFromEnv(cfg Config, getenv func(string) string) (Config, error) {
	c := cfg.defaulted()
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
	}{{EnvTombstoneCap, &c.TombstoneCap}, {EnvShards, &c.Shards}}
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
	return c, c.Room.Validate()
}
