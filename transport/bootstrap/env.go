package bootstrap

import (
	"fmt"
	"strconv"
	"time"
)

// Environment variables SGLang uses for the parts this package implements.
const (
	EnvBootstrapAuthToken       = "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"
	EnvBootstrapCleanupInterval = "SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL"
	EnvHostIP                   = "SGLANG_HOST_IP"
	EnvHostIPLegacy             = "HOST_IP"
)

// BootstrapConfigFromEnv reads the bootstrap server settings SGLang reads. getenv is
// os.Getenv in production and a map lookup in tests. A set auth token turns auth on; an
// unset one leaves the baseline (no auth) behaviour.
func BootstrapConfigFromEnv(getenv func(string) string) (BootstrapConfig, error) {
	var cfg BootstrapConfig
	if tok := getenv(EnvBootstrapAuthToken); tok != "" {
		cfg.RequireAuth, cfg.AuthToken = true, tok
	}
	if v := getenv(EnvBootstrapCleanupInterval); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs <= 0 {
			return cfg, fmt.Errorf("%s=%q: want a positive number of seconds", EnvBootstrapCleanupInterval, v)
		}
		cfg.EntryCleanupInterval = time.Duration(secs * float64(time.Second))
	}
	return cfg, nil
}

// HostIPFromEnv returns SGLANG_HOST_IP, else HOST_IP, else "" (the caller auto-detects),
// the rank IP rule of upstream's NixlKVManager.
func HostIPFromEnv(getenv func(string) string) string {
	if v := getenv(EnvHostIP); v != "" {
		return v
	}
	return getenv(EnvHostIPLegacy)
}
