package room

import (
	"fmt"
	"time"
)

// DeadlineKind names the one deadline a phase waits under.
type DeadlineKind uint8

const (
	NoDeadline DeadlineKind = iota
	BootstrapDeadline
	WaitingDeadline
	TransferDeadline
	DrainDeadline
	LingerDeadline
)

func (k DeadlineKind) String() string {
	return [...]string{"none", "bootstrap", "waiting", "transfer", "drain", "linger"}[k]
}

// Config holds the deadlines. Zero values are not allowed; use DefaultConfig.
type Config struct {
	// Bootstrap bounds the time until the sender exists and every required
	// transfer info arrived (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300 s).
	Bootstrap time.Duration
	// Waiting bounds each wait for the scheduler's next chunk once the room is
	// ready (KVXFER_WAITING_TIMEOUT, 300 s: decode gives up after its own 300 s).
	Waiting time.Duration
	// Transfer bounds the time without any transfer completing while transfers
	// are in flight (KVXFER_TRANSFER_TIMEOUT, 60 s).
	Transfer time.Duration
	// Drain bounds how long a failed room waits for posted writes before it tells
	// decode anyway (KVXFER_DRAIN_TIMEOUT, 10 s).
	Drain time.Duration
	// Linger bounds how long a concluded room waits for the scheduler's Clear
	// before it retires to a tombstone, which still answers polls
	// (KVXFER_LINGER_TIMEOUT, 300 s).
	Linger time.Duration

	// HoldCompletion posts the last chunk's writes without their NIXL
	// notifications and sends those (or a success KV_STATUS) only once every
	// write of the room completed while the room was live, so decode never
	// completes a room the scheduler was told failed (invariant 10). Off, the
	// notifications ride on the writes as in SGLang.
	HoldCompletion bool
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Bootstrap: 300 * time.Second,
		Waiting:   300 * time.Second,
		Transfer:  60 * time.Second,
		Drain:     10 * time.Second,
		Linger:    300 * time.Second,
	}
}

func (c *Config) duration(k DeadlineKind) time.Duration {
	switch k {
	case BootstrapDeadline:
		return c.Bootstrap
	case WaitingDeadline:
		return c.Waiting
	case TransferDeadline:
		return c.Transfer
	case DrainDeadline:
		return c.Drain
	case LingerDeadline:
		return c.Linger
	}
	return 0
}

// Validate rejects non-positive deadlines: a zero deadline would fire at once and
// a negative one would mean "never", which the design forbids.
func (c *Config) Validate() error {
	for k := BootstrapDeadline; k <= LingerDeadline; k++ {
		if c.duration(k) <= 0 {
			return fmt.Errorf("room: %s deadline must be positive, got %v", k, c.duration(k))
		}
	}
	return nil
}
