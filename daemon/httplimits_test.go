package daemon

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/transport/bootstrap"
	"github.com/kvxfer/kvxfer/transport/wire"
)

func httpDo(t *testing.T, method, url string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// F7 against the daemon: before kvxferd is live, a PUT cannot fix another
// page size or dtype, nor take its rank; once live, its own PUT (owner key)
// went through and a hijacking PUT does not replace it.
func TestDaemonBootstrapOwnRankAndValues(t *testing.T) {
	d := startDaemonWith(t, func(c *Config) { c.PageSize, c.KVCacheDtype, c.Rank.TPSize = 16, "bfloat16", 2 })
	base := "http://" + d.BootstrapAddr()
	// tp rank 1 is another process's: a PUT for it with other values is refused.
	evil := bootstrap.RankRegistration{AttnTPSize: 2, AttnTPRank: 1, AttnCPSize: 1, AttnDPSize: 1, PPSize: 1, SystemDPSize: 1,
		RankIP: "10.6.6.6", RankPort: 6666, PageSize: 1, KVCacheDtype: "fp8_e4m3"}
	if code, body := httpDo(t, "PUT", base+"/route", evil.JSON()); code != http.StatusConflict {
		t.Fatalf("pre-emptive PUT: %d %s", code, body)
	}
	evil.PageSize, evil.KVCacheDtype = 16, "bfloat16"
	if code, body := httpDo(t, "PUT", base+"/route", evil.JSON()); code != http.StatusOK {
		t.Fatalf("tp rank 1 with the instance's values: %d %s", code, body)
	}
	evil.AttnTPRank = 0 // kvxferd's own
	if code, body := httpDo(t, "PUT", base+"/route", evil.JSON()); code != http.StatusForbidden {
		t.Fatalf("PUT for kvxferd's own rank: %d %s", code, body)
	}
	newScheduler(t, d) // goes live: registers itself with the owner key
	if !d.Live() {
		t.Fatal("not live")
	}
	if code, body := httpDo(t, "PUT", base+"/route", evil.JSON()); code != http.StatusForbidden {
		t.Fatalf("hijack: %d %s", code, body)
	}
	code, body := httpDo(t, "GET", base+"/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1", nil)
	var info map[string]any
	if err := json.Unmarshal([]byte(body), &info); err != nil || code != 200 {
		t.Fatalf("topology: %d %s", code, body)
	}
	if info["page_size"] != 16.0 || info["kv_cache_dtype"] != "bfloat16" {
		t.Fatalf("topology %v", info)
	}
	_, body = httpDo(t, "GET", base+"/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", nil)
	if !strings.Contains(body, `"rank_ip": "127.0.0.1"`) {
		t.Fatalf("own route %s", body)
	}
}

// Both servers have read, write and idle timeouts, and pprof is on the debug
// listener when it is loopback.
func TestDaemonHTTPLimitsAndPprof(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	for name, s := range map[string]*http.Server{"bootstrap": d.bootSrv, "debug": d.debug} {
		if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 {
			t.Fatalf("%s server timeouts: %v %v %v %v", name, s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout)
		}
	}
	if code, body := httpDo(t, "GET", "http://"+d.DebugAddr()+"/debug/pprof/goroutine?debug=1", nil); code != 200 || !strings.Contains(body, "goroutine profile") {
		t.Fatalf("pprof: %d %.100s", code, body)
	}
	if isLoopback(fakeAddr("10.0.0.1")) || !isLoopback(fakeAddr("127.0.0.1")) || !isLoopback(fakeAddr("::1")) {
		t.Fatal("isLoopback")
	}
}

func fakeAddr(ip string) *net.TCPAddr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 1} }
