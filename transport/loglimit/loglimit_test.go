package loglimit

import (
	"testing"
	"time"
)

func TestLogLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	l := New(time.Second, func() time.Time { return now })
	if ok, n := l.Allow(); !ok || n != 0 {
		t.Fatal("first line must pass")
	}
	for range 3 {
		if ok, _ := l.Allow(); ok {
			t.Fatal("must be suppressed")
		}
	}
	now = now.Add(time.Second)
	if ok, n := l.Allow(); !ok || n != 3 {
		t.Fatalf("ok=%v suppressed=%d", ok, n)
	}
}
