package bootstrap

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

type httpResult struct {
	code int
	body string
	ct   string
}

func do(t *testing.T, h http.Handler, method, target, body string, hdr ...string) httpResult {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return httpResult{rec.Code, string(b), rec.Header().Get("Content-Type")}
}

func (r httpResult) is(t *testing.T, code int, body string) {
	t.Helper()
	if r.code != code || r.body != body {
		t.Fatalf("got %d %q; want %d %q", r.code, r.body, code, body)
	}
}

const topoQuery = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"

func rankReg(tp int, port int) RankRegistration {
	return RankRegistration{
		AttnTPSize: 2, AttnTPRank: tp, AttnCPSize: 1, AttnDPSize: 1, PPSize: 1, SystemDPSize: 1,
		RankIP: "10.0.0.1", RankPort: port, PageSize: 16, KVCacheDtype: "auto",
		LoadBalanceMethod: "round_robin", PrefillHTTPPort: 30000,
	}
}

func TestBootstrapHealthAndUnknownRoutes(t *testing.T) {
	h := NewBootstrapServer(BootstrapConfig{}).Handler()
	r := do(t, h, "GET", "/health", "")
	r.is(t, 200, "OK")
	if r.ct != "text/plain; charset=utf-8" {
		t.Fatalf("content type %q", r.ct)
	}
	do(t, h, "POST", "/health", "").is(t, 405, "405: Method Not Allowed")
	do(t, h, "GET", "/nope", "").is(t, 404, "404: Not Found")
	do(t, h, "GET", "/register_dp_rank", "").is(t, 405, "405: Method Not Allowed")
	r = do(t, h, "DELETE", "/route", "")
	r.is(t, 405, "Method not allowed")
	if r.ct != "application/json; charset=utf-8" {
		t.Fatalf("405 content type %q", r.ct)
	}
}

// The exact key set of PrefillServerInfo (common/conn.py), in dataclass order.
var serverInfoKeys = []string{
	"attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size", "kv_cache_dtype",
	"follow_bootstrap_room", "enable_dsa_cache_layer_split", "prefill_http_port",
	"target_tp_rank", "target_tp_ranks", "target_cp_ranks", "target_pp_ranks",
	"required_dst_info_num", "required_prefill_response_num",
}

func jsonKeys(t *testing.T, body string) []string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("bad JSON %q: %v", body, err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sorted(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}

func TestBootstrapTopology(t *testing.T) {
	s := NewBootstrapServer(BootstrapConfig{})
	h := s.Handler()
	do(t, h, "GET", topoQuery, "").is(t, 503, "Prefill server not fully registered yet (0 workers registered).")
	do(t, h, "PUT", "/route", string(rankReg(0, 5000).JSON())).is(t, 200, "OK")
	do(t, h, "GET", topoQuery, "").is(t, 503, "Prefill server not fully registered yet (1 workers registered).")
	do(t, h, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "").
		is(t, 503, "Prefill server not fully registered yet (1 workers registered).")
	do(t, h, "PUT", "/route", string(rankReg(1, 5001).JSON())).is(t, 200, "OK")
	if !s.ready() || s.registeredCount() != 2 {
		t.Fatalf("ready=%v count=%d", s.ready(), s.registeredCount())
	}
	r := do(t, h, "GET", topoQuery, "")
	// json.dumps(dataclasses.asdict(PrefillServerInfo(...))), written by hand.
	r.is(t, 200, `{"attn_tp_size": 2, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 16, `+
		`"kv_cache_dtype": "auto", "follow_bootstrap_room": false, "enable_dsa_cache_layer_split": false, `+
		`"prefill_http_port": 30000, "target_tp_rank": null, "target_tp_ranks": null, "target_cp_ranks": null, `+
		`"target_pp_ranks": null, "required_dst_info_num": null, "required_prefill_response_num": null}`)
	if r.ct != "application/json; charset=utf-8" {
		t.Fatalf("content type %q", r.ct)
	}
	if got := jsonKeys(t, r.body); !reflect.DeepEqual(got, sorted(serverInfoKeys)) {
		t.Fatalf("keys %v", got)
	}
	do(t, h, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0", "").
		is(t, 200, `{"rank_ip": "10.0.0.1", "rank_port": 5001}`)
	do(t, h, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=+1&target_pp_rank=0", "").
		is(t, 200, `{"rank_ip": "10.0.0.1", "rank_port": 5001}`)
	do(t, h, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=2&target_pp_rank=0", "").
		is(t, 404, "Bootstrap info not found for dp_rank=0 cp_rank=0 tp_rank=2 pp_rank=0")
	do(t, h, "GET", "/route?prefill_dp_rank=-1&prefill_cp_rank=0&target_tp_rank=-1&target_pp_rank=-1", "").
		is(t, 404, "Bootstrap info not found for dp_rank=-1 cp_rank=0 tp_rank=-1 pp_rank=-1")
	for _, q := range []string{"/route", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0",
		"/route?prefill_dp_rank=&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"} {
		do(t, h, "GET", q, "").is(t, 400, "Missing inputs for bootstrap server.")
	}
	if r := do(t, h, "GET", "/route?prefill_dp_rank=x&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", ""); r.code != 400 {
		t.Fatalf("non-integer rank: %d", r.code)
	}
}

func TestBootstrapLegacyServerInfo(t *testing.T) {
	s := NewBootstrapServer(BootstrapConfig{LegacyServerInfo: true})
	reg := rankReg(0, 5000)
	reg.AttnTPSize = 1
	do(t, s.Handler(), "PUT", "/route", string(reg.JSON())).is(t, 200, "OK")
	r := do(t, s.Handler(), "GET", topoQuery, "")
	want := sorted(serverInfoKeys)
	want = append(want[:0:0], want...)
	var legacy []string
	for _, k := range want {
		if k != "enable_dsa_cache_layer_split" && k != "prefill_http_port" {
			legacy = append(legacy, k)
		}
	}
	if got := jsonKeys(t, r.body); !reflect.DeepEqual(got, legacy) {
		t.Fatalf("legacy keys %v", got)
	}
}

func TestBootstrapRegistrationSemantics(t *testing.T) {
	s := NewBootstrapServer(BootstrapConfig{})
	h := s.Handler()
	// system_dp_size > 1: the dp group is system_dp_rank and dp_size is system_dp_size.
	body := `{"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1,
		"attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 2, "system_dp_rank": 1,
		"rank_ip": "10.0.0.9", "rank_port": "6001", "page_size": 32, "kv_cache_dtype": null}`
	do(t, h, "PUT", "/route", body).is(t, 200, "OK")
	if ep, ok := s.rank(1, 0, 0, 0); !ok || ep != (RankEndpoint{"10.0.0.9", 6001}) {
		t.Fatalf("rank = %+v %v", ep, ok)
	}
	// Duplicates count towards readiness, as upstream (registered_count += 1 on every PUT).
	do(t, h, "PUT", "/route", strings.Replace(body, `"page_size": 32`, `"page_size": 64`, 1)).is(t, 200, "OK")
	r := do(t, h, "GET", topoQuery, "")
	var info map[string]any
	if err := json.Unmarshal([]byte(r.body), &info); err != nil || r.code != 200 {
		t.Fatalf("%d %q", r.code, r.body)
	}
	// First registration wins; absent load_balance_method means follow_bootstrap_room;
	// null dtype and absent http port stay null.
	if info["dp_size"] != 2.0 || info["page_size"] != 32.0 || info["follow_bootstrap_room"] != true ||
		info["kv_cache_dtype"] != nil || info["prefill_http_port"] != nil {
		t.Fatalf("info = %v", info)
	}
	for _, bad := range []string{`not json`, `[]`, `{}`, strings.Replace(body, `"rank_ip": "10.0.0.9",`, ``, 1),
		strings.Replace(body, `"rank_port": "6001"`, `"rank_port": "x"`, 1)} {
		if r := do(t, h, "PUT", "/route", bad); r.code != 400 {
			t.Fatalf("bad body %q: %d %q", bad, r.code, r.body)
		}
	}
	if s.registeredCount() != 2 {
		t.Fatalf("bad bodies must not count: %d", s.registeredCount())
	}
}

func TestBootstrapDPRanksAndCleanup(t *testing.T) {
	now := time.Unix(1000, 0)
	s := NewBootstrapServer(BootstrapConfig{Now: func() time.Time { return now }, EntryCleanupInterval: 120 * time.Second})
	h := s.Handler()
	do(t, h, "POST", "/register_dp_rank", `{"bootstrap_room": 7, "dp_rank": 1}`).is(t, 200, "OK")
	do(t, h, "POST", "/register_dp_rank", `{"bootstrap_room": "8", "dp_rank": 0}`).is(t, 200, "OK")
	do(t, h, "POST", "/query_dp_ranks", `{"bootstrap_rooms": [7, 9, "8", 7]}`).is(t, 200, `{"7": 1, "8": 0}`)
	do(t, h, "POST", "/query_dp_ranks", `{"bootstrap_rooms": []}`).is(t, 200, `{}`)
	for _, bad := range []string{`{}`, `{"bootstrap_rooms": 7}`, `{"bootstrap_rooms": ["x"]}`} {
		if r := do(t, h, "POST", "/query_dp_ranks", bad); r.code != 400 {
			t.Fatalf("%q: %d", bad, r.code)
		}
	}
	if r := do(t, h, "POST", "/register_dp_rank", `{"bootstrap_room": 7}`); r.code != 400 {
		t.Fatalf("missing dp_rank: %d", r.code)
	}
	now = now.Add(60 * time.Second)
	do(t, h, "POST", "/register_dp_rank", `{"bootstrap_room": 9, "dp_rank": 3}`).is(t, 200, "OK")
	now = now.Add(60 * time.Second) // rooms 7, 8 are exactly 120 s old: kept (strictly older only)
	if n := s.SweepExpired(); n != 0 {
		t.Fatalf("swept %d at 120 s", n)
	}
	now = now.Add(time.Second)
	if n := s.SweepExpired(); n != 2 {
		t.Fatalf("swept %d at 121 s", n)
	}
	do(t, h, "POST", "/query_dp_ranks", `{"bootstrap_rooms": [7, 8, 9]}`).is(t, 200, `{"9": 3}`)
	if dp, ok := s.dpRank(9); !ok || dp != 3 {
		t.Fatalf("DPRank(9) = %d %v", dp, ok)
	}
}

func TestBootstrapAuth(t *testing.T) {
	s := NewBootstrapServer(BootstrapConfig{RequireAuth: true, AuthToken: "s3cret"})
	h := s.Handler()
	body := string(rankReg(0, 5000).JSON())
	do(t, h, "PUT", "/route", body).is(t, 401, "Unauthorized")
	for _, hdr := range []string{"Bearer wrong", "Basic s3cret", "Bearer  s3cret", "Bearers3cret", "s3cret"} {
		do(t, h, "PUT", "/route", body, "Authorization", hdr).is(t, 401, "Unauthorized")
	}
	do(t, h, "POST", "/register_dp_rank", `{"bootstrap_room": 1, "dp_rank": 0}`).is(t, 401, "Unauthorized")
	if s.registeredCount() != 0 {
		t.Fatal("unauthorized PUT registered")
	}
	do(t, h, "GET", topoQuery, "").is(t, 503, "Prefill server not fully registered yet (0 workers registered).")
	do(t, h, "PUT", "/route", body, "Authorization", "Bearer s3cret").is(t, 200, "OK")
	do(t, h, "PUT", "/route", string(rankReg(1, 5001).JSON()), "Authorization", "bearer s3cret").is(t, 200, "OK")
	do(t, h, "POST", "/register_dp_rank", `{"bootstrap_room": 1, "dp_rank": 0}`, "Authorization", "Bearer s3cret").is(t, 200, "OK")
	// Reads never need the token.
	if r := do(t, h, "GET", topoQuery, ""); r.code != 200 {
		t.Fatalf("topology: %d", r.code)
	}
	do(t, h, "POST", "/query_dp_ranks", `{"bootstrap_rooms": [1]}`).is(t, 200, `{"1": 0}`)
	do(t, h, "GET", "/health", "").is(t, 200, "OK")

	// Fail closed: auth required but no token configured.
	closed := NewBootstrapServer(BootstrapConfig{RequireAuth: true}).Handler()
	do(t, closed, "PUT", "/route", body, "Authorization", "Bearer ").is(t, 401, "Unauthorized")
}

func TestBootstrapConfigFromEnv(t *testing.T) {
	env := map[string]string{EnvBootstrapAuthToken: "tok", EnvBootstrapCleanupInterval: "2.5"}
	cfg, err := BootstrapConfigFromEnv(func(k string) string { return env[k] })
	if err != nil || !cfg.RequireAuth || cfg.AuthToken != "tok" || cfg.EntryCleanupInterval != 2500*time.Millisecond {
		t.Fatalf("%+v %v", cfg, err)
	}
	cfg, err = BootstrapConfigFromEnv(func(string) string { return "" })
	if err != nil || cfg.RequireAuth || cfg.EntryCleanupInterval != 0 {
		t.Fatalf("%+v %v", cfg, err)
	}
	env[EnvBootstrapCleanupInterval] = "soon"
	if _, err := BootstrapConfigFromEnv(func(k string) string { return env[k] }); err == nil {
		t.Fatal("want error")
	}
	if ip := HostIPFromEnv(func(k string) string { return map[string]string{EnvHostIPLegacy: "1.2.3.4"}[k] }); ip != "1.2.3.4" {
		t.Fatal(ip)
	}
}

func TestPyJSONString(t *testing.T) {
	// Expected bytes from CPython 3.11: json.dumps("\x7f\x01é😀\"\\\n\b\f/").
	got := string(appendPyString(nil, "\x7f\x01\u00e9\U0001F600\"\\\n\b\f/"))
	want := `"\u007f\u0001\u00e9\ud83d\ude00\"\\\n\b\f/"`
	if got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}

// Every SGLang decode from 0.5.18 to 0.5.23 builds PrefillServerInfo(**json)
// from the topology reply, so a key the oldest one does not know is a
// TypeError there. Keys later releases added must never appear, even when a
// newer prefill's PUT /route carries them.
func TestBootstrapTopologyReadableByEveryRelease(t *testing.T) {
	later := []string{"dsv41_spec_layout", "decode_allocation_policy", "kv_layout", "enable_kv_cache_sharding"}
	s := NewBootstrapServer(BootstrapConfig{})
	h := s.Handler()
	for tp := range 2 {
		body := strings.TrimSuffix(string(rankReg(tp, 5000+tp).JSON()), "}") +
			`, "dsv41_spec_layout": null, "decode_allocation_policy": "early", "kv_layout": "NHD", "enable_kv_cache_sharding": false}`
		do(t, h, "PUT", "/route", body).is(t, 200, "OK")
	}
	got := jsonKeys(t, do(t, h, "GET", topoQuery, "").body)
	if !reflect.DeepEqual(got, sorted(serverInfoKeys)) {
		t.Fatalf("topology keys %v, want exactly 0.5.18's PrefillServerInfo fields %v", got, sorted(serverInfoKeys))
	}
	for _, k := range later {
		if slices.Contains(got, k) {
			t.Fatalf("topology reply carries %q, which SGLang 0.5.18-0.5.22 decodes reject", k)
		}
	}
}

// ownerServer is a kvxferd-hosted server: it serves tp rank 0 of a tp-2
// instance itself, page 16, dtype "auto".
func ownerServer(t *testing.T, cfg BootstrapConfig) (*BootstrapServer, http.Handler) {
	t.Helper()
	own := rankReg(0, 0)
	own.LoadBalanceMethod, own.PrefillHTTPPort = "", 0
	cfg.Owner = &own
	s := NewBootstrapServer(cfg)
	if s.OwnerKey() == "" {
		t.Fatal("no owner key drawn")
	}
	return s, s.Handler()
}

// F7 hijack: a PUT for the rank kvxferd serves, from anyone but kvxferd, is
// refused (403), with or without the shared bearer token; the owner's own PUT
// (owner key) works, and re-registers.
func TestBootstrapOwnerRankCannotBeHijacked(t *testing.T) {
	s, h := ownerServer(t, BootstrapConfig{RequireAuth: true, AuthToken: "tok"})
	auth := []string{"Authorization", "Bearer tok"}
	own := string(rankReg(0, 5000).JSON())
	do(t, h, "PUT", "/route", own, auth...).is(t, 403, "Forbidden: this rank is served by the bootstrap server's own process")
	do(t, h, "PUT", "/route", own, "Authorization", "Bearer tok", OwnerKeyHeader, "wrong").
		is(t, 403, "Forbidden: this rank is served by the bootstrap server's own process")
	do(t, h, "PUT", "/route", own, OwnerKeyHeader, s.OwnerKey()).is(t, 401, "Unauthorized") // auth still applies
	do(t, h, "PUT", "/route", own, "Authorization", "Bearer tok", OwnerKeyHeader, s.OwnerKey()).is(t, 200, "OK")
	// The other rank is the token holder's to set, as upstream.
	do(t, h, "PUT", "/route", string(rankReg(1, 5001).JSON()), auth...).is(t, 200, "OK")
	hijack := rankReg(0, 6666)
	hijack.RankIP = "10.6.6.6"
	do(t, h, "PUT", "/route", string(hijack.JSON()), auth...).is(t, 403, "Forbidden: this rank is served by the bootstrap server's own process")
	if ep, _ := s.rank(0, 0, 0, 0); ep != (RankEndpoint{"10.0.0.1", 5000}) {
		t.Fatalf("owner rank = %+v", ep)
	}
	do(t, h, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "").
		is(t, 200, `{"rank_ip": "10.0.0.1", "rank_port": 5000}`)
	// The owner re-registers (a new port).
	do(t, h, "PUT", "/route", string(rankReg(0, 5002).JSON()), "Authorization", "Bearer tok", OwnerKeyHeader, s.OwnerKey()).is(t, 200, "OK")
	if ep, _ := s.rank(0, 0, 0, 0); ep.RankPort != 5002 {
		t.Fatalf("owner re-registration: %+v", ep)
	}
	if st := s.refused(); st.OwnerRefused != 3 || st.Unauthorized != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Without auth configured the owner key is still required for the owner's rank.
	s2, h2 := ownerServer(t, BootstrapConfig{})
	do(t, h2, "PUT", "/route", string(hijack.JSON())).is(t, 403, "Forbidden: this rank is served by the bootstrap server's own process")
	do(t, h2, "PUT", "/route", own, OwnerKeyHeader, s2.OwnerKey()).is(t, 200, "OK")
	if s2.OwnerKey() == s.OwnerKey() {
		t.Fatal("owner keys must differ per server")
	}
}

// F7 pre-emption: the owner's page size and dtype (and sizes) are fixed at
// server start; a PUT that arrives first with other values is refused (409)
// and the topology decodes read is the owner's.
func TestBootstrapOwnerValuesCannotBePreempted(t *testing.T) {
	s, h := ownerServer(t, BootstrapConfig{})
	for _, mut := range []func(*RankRegistration){
		func(r *RankRegistration) { r.PageSize = 64 },
		func(r *RankRegistration) { r.KVCacheDtype = "fp8_e5m2" },
		func(r *RankRegistration) { r.AttnTPSize = 4 },
		func(r *RankRegistration) { r.PPSize, r.SystemDPSize = 1, 2 },
	} {
		reg := rankReg(1, 5001)
		mut(&reg)
		if r := do(t, h, "PUT", "/route", string(reg.JSON())); r.code != 409 || !strings.HasPrefix(r.body, "Conflict: ") {
			t.Fatalf("pre-emptive PUT %+v: %d %q", reg, r.code, r.body)
		}
	}
	// A null dtype does not conflict (no check, as upstream); a different
	// load_balance_method or http port cannot replace the owner's.
	reg := rankReg(1, 5001)
	reg.KVCacheDtype = ""
	do(t, h, "PUT", "/route", string(reg.JSON())).is(t, 200, "OK")
	do(t, h, "PUT", "/route", string(rankReg(0, 5000).JSON()), OwnerKeyHeader, s.OwnerKey()).is(t, 200, "OK")
	var info map[string]any
	if err := json.Unmarshal([]byte(do(t, h, "GET", topoQuery, "").body), &info); err != nil {
		t.Fatal(err)
	}
	if info["page_size"] != 16.0 || info["kv_cache_dtype"] != "auto" || info["attn_tp_size"] != 2.0 ||
		info["follow_bootstrap_room"] != true || info["dp_size"] != 1.0 {
		t.Fatalf("topology %v", info)
	}
	if st := s.refused(); st.Conflicts != 4 {
		t.Fatalf("stats %+v", st)
	}
}

// F7 caps: ranks outside the topology, topologies over MaxRanks, new ranks
// over MaxRanks and new rooms over MaxDPEntries are refused, so 50,000 fake
// rank tuples or rooms leave the tables at their caps.
func TestBootstrapTablesAreCapped(t *testing.T) {
	s, h := ownerServer(t, BootstrapConfig{})
	for i := range 50_000 {
		reg := rankReg(2+i%1000, 7000)
		reg.AttnDPRank, reg.PPRank = i/1000, 0
		if r := do(t, h, "PUT", "/route", string(reg.JSON())); r.code != 400 {
			t.Fatalf("fake tuple %d: %d %q", i, r.code, r.body)
		}
	}
	if n := len(s.ranks); n != 0 || s.registeredCount() != 0 {
		t.Fatalf("%d fake ranks stored, %d counted", n, s.registeredCount())
	}
	if st := s.refused(); st.OutOfTopology != 50_000 {
		t.Fatalf("stats %+v", st)
	}
	// Without an owner: the first PUT's topology is the grid; one over MaxRanks is refused.
	g := NewBootstrapServer(BootstrapConfig{MaxRanks: 8, MaxDPEntries: 3})
	gh := g.Handler()
	big := rankReg(0, 5000)
	big.AttnTPSize = 9
	do(t, gh, "PUT", "/route", string(big.JSON())).is(t, 400, "Bad request: topology dp*cp*tp*pp is larger than 8 ranks")
	huge := rankReg(0, 5000)
	huge.AttnTPSize, huge.PPSize, huge.SystemDPSize = 1<<40, 1<<40, 1<<40
	do(t, gh, "PUT", "/route", string(huge.JSON())).is(t, 400, "Bad request: topology dp*cp*tp*pp is larger than 8 ranks")
	out := rankReg(2, 5000) // tp rank 2 of tp size 2
	if r := do(t, gh, "PUT", "/route", string(out.JSON())); r.code != 400 {
		t.Fatalf("rank outside its own topology: %d %q", r.code, r.body)
	}
	do(t, gh, "PUT", "/route", string(rankReg(0, 5000).JSON())).is(t, 200, "OK")
	four := rankReg(3, 5000)
	four.AttnTPSize = 4 // ignored (first PUT wins), and tp 3 is outside tp size 2
	if r := do(t, gh, "PUT", "/route", string(four.JSON())); r.code != 400 {
		t.Fatalf("rank outside the instance topology: %d %q", r.code, r.body)
	}
	for room := range 3 {
		do(t, gh, "POST", "/register_dp_rank", fmt.Sprintf(`{"bootstrap_room": %d, "dp_rank": 0}`, room)).is(t, 200, "OK")
	}
	do(t, gh, "POST", "/register_dp_rank", `{"bootstrap_room": 99, "dp_rank": 0}`).is(t, 429, "Too many room -> dp_rank entries (3)")
	do(t, gh, "POST", "/register_dp_rank", `{"bootstrap_room": 1, "dp_rank": 0}`).is(t, 200, "OK") // known room: updated
	long := rankReg(1, 5000)
	long.RankIP = strings.Repeat("a", 256)
	if r := do(t, gh, "PUT", "/route", string(long.JSON())); r.code != 400 {
		t.Fatalf("256-byte rank_ip: %d", r.code)
	}
	// The rank table holds at most the grid, which is at most MaxRanks.
	if st := g.refused(); st.TableFull != 1 || st.OutOfTopology != 4 || len(g.ranks) != 1 {
		t.Fatalf("stats %+v", st)
	}
}
