package decode

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transport/bootstrap"
)

// TestTopologyWaitsWhileNotRegistered: decode retries GET /route while the
// server answers 503, then reads the topology once the rank registered.
func TestTopologyWaitsWhileNotRegistered(t *testing.T) {
	boot := bootstrap.NewBootstrapServer(bootstrap.BootstrapConfig{})
	var gets atomic.Int64
	h := boot.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/route" {
			if gets.Add(1) == 3 {
				// Register while decode is retrying.
				_ = bootstrap.RegisterRank(context.Background(), "http://"+r.Host, bootstrap.RankRegistration{
					AttnTPSize: 1, AttnCPSize: 1, AttnDPSize: 1, PPSize: 1, SystemDPSize: 1,
					RankIP: "127.0.0.1", RankPort: 5555, PageSize: 32, KVCacheDtype: "fp8_e4m3",
				}, bootstrap.RegisterOptions{Attempts: 1})
			}
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	bc := newBootstrapClient(srv.URL, srv.Client())
	si, err := bc.waitTopology(context.Background(), 10, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if gets.Load() < 3 || *si.PageSize != 32 || *si.KVCacheDtype != "fp8_e4m3" || si.AttnTPSize != 1 {
		t.Fatalf("gets %d info %+v", gets.Load(), si)
	}
	ip, port, err := bc.rankEndpoint(context.Background(), 0, 0, 0, 0)
	if err != nil || ip != "127.0.0.1" || port != 5555 {
		t.Fatalf("endpoint %s:%d %v", ip, port, err)
	}
	if _, _, err := bc.rankEndpoint(context.Background(), 0, 0, 1, 0); err == nil {
		t.Fatal("unknown rank resolved")
	}
}

// TestTopologyUnknownKeyRejected: an extra key would crash SGLang's
// PrefillServerInfo(**data); the emulator refuses it too.
func TestTopologyUnknownKeyRejected(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"attn_tp_size":1,"attn_cp_size":1,"dp_size":1,"pp_size":1,"page_size":1,"kv_cache_dtype":"auto","follow_bootstrap_room":true,"surprise":1}`))
	}))
	defer srv.Close()
	_, err := newBootstrapClient(srv.URL, srv.Client()).topology(context.Background())
	if err == nil || !strings.Contains(err.Error(), "surprise") {
		t.Fatalf("err %v", err)
	}
}

func TestStartChecksPageSize(t *testing.T) {
	p := newPrefill(t, prefillOpts{})
	cfg := DefaultConfig()
	cfg.Bootstrap, cfg.Shape, cfg.PageSize = p.http.URL, testShape(), 64
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "page_size") {
		t.Fatalf("page size mismatch not refused: %v", err)
	}
}
