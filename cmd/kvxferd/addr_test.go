package main

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

// TestAddressRefusals: kvxferd refuses, before it binds anything, an
// advertised address remote decodes could not use (docs/kvxferd.md).
func TestAddressRefusals(t *testing.T) {
	none := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-host", "0.0.0.0", "-advertise-host", "127.0.0.1"}, nil, "loopback while decodes can be remote"},
		{[]string{"-host", "0.0.0.0", "-advertise-host", "0.0.0.0", "-single-host"}, nil, "unspecified"},
		{[]string{"-host", "::"}, map[string]string{"SGLANG_HOST_IP": "::"}, "unspecified"},
		{[]string{"-host", "0.0.0.0"}, map[string]string{"HOST_IP": "127.0.0.1"}, "loopback while decodes can be remote"},
		{[]string{"-host", "127.0.0.1", "-advertise-host", "192.0.2.1"}, nil, "nothing would answer"},
	} {
		getenv := none
		if tc.env != nil {
			getenv = func(k string) string { return tc.env[k] }
		}
		err := run(append([]string{"-nixl-backend", "loopback"}, tc.args...), getenv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("run(%q, %v) = %v, want an error containing %q", tc.args, tc.env, err, tc.want)
		}
	}
}

// TestHelpExplainsBothAddresses: -h says what -host and -advertise-host are.
func TestHelpExplainsBothAddresses(t *testing.T) {
	var buf bytes.Buffer
	err := runWithOutput([]string{"-h"}, func(string) string { return "" }, &buf)
	if err != flag.ErrHelp {
		t.Fatalf("-h: %v", err)
	}
	out := buf.String()
	for _, want := range []string{"-host", "LISTEN host", "-advertise-host", "ADVERTISED address", "SGLANG_HOST_IP", "get_local_ip_auto", "-single-host"} {
		if !strings.Contains(out, want) {
			t.Errorf("-h output lacks %q", want)
		}
	}
}
