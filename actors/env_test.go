package actors

import (
	"testing"
	"time"
)

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		EnvBootstrapTimeout: "12.5",
		EnvDrainTimeout:     "3",
		EnvTombstoneCap:     "99",
	}
	c, err := ConfigFromEnv(Config{}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Room.Bootstrap != 12500*time.Millisecond || c.Room.Drain != 3*time.Second || c.TombstoneCap != 99 {
		t.Fatalf("overlay not applied: %+v", c)
	}
	if c.Room.Transfer != 60*time.Second || c.TombstoneTTL != 600*time.Second {
		t.Fatalf("defaults lost: %+v", c)
	}
	for k, v := range map[string]string{EnvTransferTimeout: "soon", EnvLingerTimeout: "-1", EnvShards: "0"} {
		if _, err := ConfigFromEnv(Config{Transfers: &transfersDouble{}}, func(x string) string {
			if x == k {
				return v
			}
			return ""
		}); err == nil {
			t.Fatalf("%s=%q accepted", k, v)
		}
	}
}
