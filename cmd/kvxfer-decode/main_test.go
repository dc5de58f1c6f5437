package main

import (
	"strings"
	"testing"
)

func TestFlagErrors(t *testing.T) {
	env := func(string) string { return "" }
	var out strings.Builder
	for _, args := range [][]string{{"-sglang", "nope"}, {"-sglang", "0.5.19"}, {"-decode-protocol", "ack"}, {"-later-frames"}} {
		if err := run(args, env, &out); err == nil {
			t.Fatalf("%v accepted", args)
		}
	}
	for _, sh := range []string{"2/2", "x", "-1/3", "1/0"} {
		if err := run([]string{"-shard", sh}, env, &out); err == nil || !strings.Contains(err.Error(), "shard") {
			t.Fatalf("-shard %s accepted: %v", sh, err)
		}
	}
	if err := run([]string{"-nixl-backend", "rdma"}, env, &out); err == nil || !strings.Contains(err.Error(), "-nixl-backend") {
		t.Fatalf("-nixl-backend rdma accepted: %v", err)
	}
	if err := run([]string{"-abort-share", "2"}, env, &out); err == nil {
		t.Fatal("abort share 2 accepted")
	}
}

func TestEnvDefaults(t *testing.T) {
	env := map[string]string{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "2.5"}
	if d := envSeconds(func(k string) string { return env[k] }, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 0); d.Seconds() != 2.5 {
		t.Fatalf("waiting timeout %v", d)
	}
}
