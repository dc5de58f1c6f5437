package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestRankRegistrationJSONGolden(t *testing.T) {
	// The payload dict of register_to_bootstrap, as requests(json=...) serialises it.
	want := `{"attn_tp_size": 2, "attn_tp_rank": 1, "attn_cp_size": 1, "attn_cp_rank": 0, ` +
		`"attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, ` +
		`"system_dp_rank": 0, "rank_ip": "10.0.0.1", "rank_port": 5001, "page_size": 16, ` +
		`"kv_cache_dtype": "auto", "load_balance_method": "round_robin", ` +
		`"enable_dsa_cache_layer_split": false, "prefill_http_port": 30000}`
	if got := string(rankReg(1, 5001).JSON()); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	min := RankRegistration{AttnTPSize: 1, AttnCPSize: 1, AttnDPSize: 1, PPSize: 1, SystemDPSize: 1, RankIP: "::1", RankPort: 1, PageSize: 1}
	wantMin := `{"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, ` +
		`"attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, ` +
		`"system_dp_rank": 0, "rank_ip": "::1", "rank_port": 1, "page_size": 1, ` +
		`"kv_cache_dtype": null, "enable_dsa_cache_layer_split": false, "prefill_http_port": null}`
	if got := string(min.JSON()); got != wantMin {
		t.Fatalf("got\n%s\nwant\n%s", got, wantMin)
	}
}

func TestBootstrapURL(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0": "http://127.0.0.1:8998", "::": "http://[::1]:8998",
		"10.1.2.3": "http://10.1.2.3:8998", "fe80::1": "http://[fe80::1]:8998",
	} {
		if got := bootstrapURL(in, 8998); got != want {
			t.Errorf("BootstrapURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRegisterRankAgainstServer(t *testing.T) {
	bs := NewBootstrapServer(BootstrapConfig{RequireAuth: true, AuthToken: "tok"})
	var lastBody atomic.Value
	var lastAuth atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		lastBody.Store(string(b))
		lastAuth.Store(r.Header.Get("Authorization"))
		r.Body = io.NopCloser(bytes.NewReader(b))
		bs.Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	ctx := context.Background()
	noWait := func(int) time.Duration { return 0 }
	for tp := range 2 {
		if err := RegisterRank(ctx, srv.URL, rankReg(tp, 5000+tp), RegisterOptions{Token: "tok", Backoff: noWait}); err != nil {
			t.Fatal(err)
		}
	}
	if !bs.ready() {
		t.Fatal("server not ready after two registrations")
	}
	if lastBody.Load() != string(rankReg(1, 5001).JSON()) || lastAuth.Load() != "Bearer tok" {
		t.Fatalf("body %v auth %v", lastBody.Load(), lastAuth.Load())
	}
	// Wrong token: every attempt is refused, and the error says so.
	err := RegisterRank(ctx, srv.URL, rankReg(0, 5000), RegisterOptions{Token: "bad", Attempts: 2, Backoff: noWait})
	if !errors.Is(err, ErrRegisterRejected) {
		t.Fatalf("err = %v", err)
	}
}

func TestRegisterRankRetries(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			http.Error(w, "busy", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	var waits []int
	err := RegisterRank(context.Background(), srv.URL, rankReg(0, 1), RegisterOptions{
		Backoff: func(a int) time.Duration { waits = append(waits, a); return 0 },
	})
	if err != nil || calls.Load() != 3 || len(waits) != 2 {
		t.Fatalf("err=%v calls=%d waits=%v", err, calls.Load(), waits)
	}
	// Cancelled context stops the retry loop.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls.Store(-100)
	if err := RegisterRank(ctx, srv.URL, rankReg(0, 1), RegisterOptions{Backoff: func(int) time.Duration { return time.Hour }}); err == nil {
		t.Fatal("want error")
	}
	for a := range 8 {
		if d := defaultBackoff(a); d < 750*time.Millisecond || d > 30*time.Second {
			t.Fatalf("defaultBackoff(%d) = %v", a, d)
		}
	}
}
