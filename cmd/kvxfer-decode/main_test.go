package main

import (
	"strings"
	"testing"
)

func TestFlagErrors(t *testing.T) {
	env := func(string) string { return "" }
	var out strings.Builder
	if err := run([]string{"-decode-protocol", "nope"}, env, &out); err == nil || !strings.Contains(err.Error(), "decode-protocol") {
		t.Fatalf("bad protocol accepted: %v", err)
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
