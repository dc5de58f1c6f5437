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

func TestRoomCapFromEnvAndMemory(t *testing.T) {
	get := func(env map[string]string) func(string) string { return func(k string) string { return env[k] } }
	c, err := ConfigFromEnv(Config{}, get(map[string]string{EnvRoomCap: "1000"}))
	if err != nil || c.RoomCap != 1000 || c.PeerRoomCap != 500 {
		t.Fatalf("KVXFER_ROOM_CAP=1000: %d/%d %v (the share follows the cap)", c.RoomCap, c.PeerRoomCap, err)
	}
	c, err = ConfigFromEnv(Config{}, get(map[string]string{EnvRoomCap: "1000", EnvPeerRoomCap: "900"}))
	if err != nil || c.RoomCap != 1000 || c.PeerRoomCap != 900 {
		t.Fatalf("both set: %d/%d %v", c.RoomCap, c.PeerRoomCap, err)
	}
	if _, err := ConfigFromEnv(Config{}, get(map[string]string{EnvRoomCap: "lots"})); err == nil {
		t.Fatal("KVXFER_ROOM_CAP=lots accepted")
	}
	if c, _ := ConfigFromEnv(Config{}, get(nil)); c.RoomCap != DefaultRoomCap(MemoryLimit()) || c.PeerRoomCap != c.RoomCap/2 {
		t.Fatalf("defaults: %d/%d", c.RoomCap, c.PeerRoomCap)
	}
	for _, tc := range []struct {
		mem  int64
		want int
	}{
		{0, MaxRoomCap / 2},                 // unknown
		{512 << 20, MinRoomCap},             // a small cgroup: the floor
		{3 << 30, 3 << 30 / 4 / RoomBudget}, // a quarter of 3 GiB at 32 KiB a room
		{1 << 40, MaxRoomCap},               // a large host: the ceiling
	} {
		if got := DefaultRoomCap(tc.mem); got != tc.want {
			t.Errorf("DefaultRoomCap(%d) = %d, want %d", tc.mem, got, tc.want)
		}
	}
}
