package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{{"-suite", "huge"}, {"-only", "nothing"}, {"-bogus"}} {
		if err := run(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestRacesOnly runs the cheapest part end to end and checks the files.
func TestRacesOnly(t *testing.T) {
	dir := t.TempDir()
	if err := run([]string{"-only", "races", "-q", "-out", dir}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| abort-before-sender |") || !strings.Contains(string(md), "kvxfer-bench -only races") {
		t.Fatalf("report:\n%s", md)
	}
	if _, err := os.Stat(filepath.Join(dir, "results.json")); err != nil {
		t.Fatal(err)
	}
	again := t.TempDir()
	if err := run([]string{"-render", filepath.Join(dir, "results.json"), "-out", again}); err != nil {
		t.Fatal(err)
	}
	md2, err := os.ReadFile(filepath.Join(again, "report.md"))
	if err != nil || string(md2) != string(md) {
		t.Fatalf("re-rendered report differs (%v)", err)
	}
}
