package bootstrap

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transport/loglimit"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// DefaultEntryCleanupInterval is SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL's
// default: room -> dp_rank entries older than this are purged, checked this often.
const DefaultEntryCleanupInterval = 120 * time.Second

// maxBootstrapBody bounds request bodies; real ones are a few hundred bytes.
const maxBootstrapBody = 1 << 20

// Caps on the state that writes create (upstream has none). See docs/kvxferd.md
// "Bootstrap integrity".
const (
	// DefaultMaxRanks caps the rank table, and the topology a PUT may declare
	// (dp*cp*tp*pp), when BootstrapConfig.MaxRanks is 0.
	DefaultMaxRanks = 4096
	// DefaultMaxDPEntries caps the room -> dp_rank table when
	// BootstrapConfig.MaxDPEntries is 0: about 2,000 rooms a second for the
	// default 120 s clean-up interval, some 30 MiB at most.
	DefaultMaxDPEntries = 1 << 18
	// maxBootstrapString bounds rank_ip and kv_cache_dtype.
	maxBootstrapString = 255
)

// OwnerKeyHeader carries the owner key of the rank a server's own process
// serves (BootstrapConfig.Owner). kvxferd sends it with its own PUT /route.
const OwnerKeyHeader = "X-Kvxfer-Owner-Key"

// BootstrapConfig configures a BootstrapServer. The zero value is the baseline upstream
// server: no auth, 120 s entry clean-up, the wall clock.
type BootstrapConfig struct {
	// RequireAuth turns on §9.1 write auth: PUT /route and POST /register_dp_rank need
	// "Authorization: Bearer <AuthToken>" (scheme case-insensitive), else 401. As upstream,
	// it fails closed: with RequireAuth and an empty AuthToken every write is refused.
	// Reads (GET /route, POST /query_dp_ranks, /health) never need a token.
	RequireAuth bool
	AuthToken   string
	// EntryCleanupInterval: 0 means DefaultEntryCleanupInterval.
	EntryCleanupInterval time.Duration
	// Now is the clock used for room -> dp_rank timestamps (tests inject a fake one).
	Now func() time.Time
	// LegacyServerInfo drops enable_dsa_cache_layer_split and prefill_http_port from the
	// topology reply, for decodes whose PrefillServerInfo predates them: decode builds
	// PrefillServerInfo(**json), so a key it does not know is a TypeError there.
	LegacyServerInfo bool
	Logger           *slog.Logger

	// Owner, when set, is the rank the server's own process serves (kvxferd's
	// rank), as it will register itself; its RankIP and RankPort are ignored.
	// Its instance-wide values (sizes, page_size, kv_cache_dtype,
	// load_balance_method, the DSA split) are fixed at server start, before
	// any PUT: a PUT that contradicts a size, the page size or the dtype is
	// refused with 409, and the other values of a PUT cannot replace them. A
	// PUT for Owner's own (dp, cp, tp, pp) tuple is refused with 403 unless it
	// carries OwnerKey in the X-Kvxfer-Owner-Key header; the bearer token does
	// not stand in for it. Upstream has none of this.
	Owner *RankRegistration
	// OwnerKey is the secret of Owner's PUT; empty: NewBootstrapServer draws
	// a random one (see BootstrapServer.OwnerKey).
	OwnerKey string
	// MaxRanks caps the rank table and the topology a PUT may declare
	// (0: DefaultMaxRanks). Every PUT's ranks must also lie inside the
	// instance topology once it is known.
	MaxRanks int
	// MaxDPEntries caps the room -> dp_rank table (0: DefaultMaxDPEntries); a
	// new room beyond it is refused with 429 until the clean-up frees room.
	MaxDPEntries int
}

// BootstrapStats counts the writes a server refused.
type BootstrapStats struct {
	Unauthorized  int64 // 401: no or wrong bearer token
	OwnerRefused  int64 // 403: a PUT for the owner's tuple without the owner key
	Conflicts     int64 // 409: a PUT contradicting the owner's fixed values
	OutOfTopology int64 // 400: a rank outside the topology, or a topology over MaxRanks
	TableFull     int64 // 429: a new rank or room beyond its table's cap
}

// BootstrapServer is a Go CommonKVBootstrapServer (§3): prefill ranks register their ZMQ
// endpoint with PUT /route, decode ranks look the topology and endpoints up with GET /route.
// Serve it with Handler(); it is safe for concurrent use.
type BootstrapServer struct {
	cfg      BootstrapConfig
	interval time.Duration
	now      func() time.Time
	log      *slog.Logger

	mu sync.Mutex
	// Instance-wide topology, fixed by the first registration (nil: not yet known).
	attnTPSize, attnCPSize, dpSize, ppSize *int64
	pageSize                               *int64
	kvCacheDtype                           *string
	followBootstrapRoom, enableDSASplit    *bool
	prefillHTTPPort                        *int64
	ranks                                  map[rankKey]RankEndpoint
	registered                             int64 // counts every PUT, duplicates included (as upstream)
	roomToDP                               map[int64]dpEntry
	owner                                  *rankKey // Owner's tuple (nil: no owner)
	ownerKey                               string
	maxRanks, maxDP                        int
	stats                                  BootstrapStats
	refusals                               loglimit.Limiter // guarded by mu
}

type rankKey struct{ dp, cp, tp, pp int64 }

// RankEndpoint is a prefill rank's ZMQ PULL endpoint as served by GET /route.
type RankEndpoint struct {
	RankIP   string
	RankPort int64
}

type dpEntry struct {
	dpRank int64
	at     time.Time
}

// NewBootstrapServer returns a server with an empty registry.
func NewBootstrapServer(cfg BootstrapConfig) *BootstrapServer {
	s := &BootstrapServer{cfg: cfg, interval: cfg.EntryCleanupInterval, now: cfg.Now, log: cfg.Logger,
		ranks: map[rankKey]RankEndpoint{}, roomToDP: map[int64]dpEntry{}}
	if s.interval <= 0 {
		s.interval = DefaultEntryCleanupInterval
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.maxRanks, s.maxDP = cfg.MaxRanks, cfg.MaxDPEntries
	if s.maxRanks <= 0 {
		s.maxRanks = DefaultMaxRanks
	}
	if s.maxDP <= 0 {
		s.maxDP = DefaultMaxDPEntries
	}
	s.refusals = loglimit.New(time.Second, nil)
	if cfg.Owner != nil {
		s.ownerKey = cfg.OwnerKey
		if s.ownerKey == "" {
			var b [16]byte
			_, _ = rand.Read(b[:])
			s.ownerKey = hex.EncodeToString(b[:])
		}
		if err := s.fixOwner(*cfg.Owner); err != nil {
			panic("transport: BootstrapConfig.Owner: " + err.Error())
		}
	}
	return s
}

// fixOwner sets the instance-wide values from the owner's registration, as its
// own first PUT would, without registering a rank.
func (s *BootstrapServer) fixOwner(reg RankRegistration) error {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(reg.JSON()))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return err
	}
	p, err := parseRoutePut(m)
	if err != nil {
		return err
	}
	if err := s.checkTopology(p); err != nil {
		return err
	}
	s.setInstanceLocked(p)
	k := p.key()
	s.owner = &k
	return nil
}

// OwnerKey is the secret the owner's own PUT /route must carry in the
// X-Kvxfer-Owner-Key header ("" without an Owner).
func (s *BootstrapServer) OwnerKey() string { return s.ownerKey }

// refused returns the refused-write counters.
func (s *BootstrapServer) refused() BootstrapStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// refuseLocked answers a refused write, counts it in *counter and logs at most
// one line a second (with the count of lines suppressed since the last).
func (s *BootstrapServer) refuseLocked(w http.ResponseWriter, counter *int64, code int, route, msg string, r *http.Request) {
	*counter++
	if ok, suppressed := s.refusals.Allow(); ok {
		s.log.Warn("bootstrap: write refused", "route", route, "status", code, "reason", msg,
			"remote", r.RemoteAddr, "suppressed", suppressed)
	}
	text(w, code, msg)
}

func (s *BootstrapServer) refuse(w http.ResponseWriter, counter *int64, code int, route, msg string, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuseLocked(w, counter, code, route, msg, r)
}

// Handler returns the HTTP handler with upstream's routes. Paths and methods are matched by
// hand (not http.ServeMux) so that 404/405 replies look like aiohttp's.
func (s *BootstrapServer) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

func (s *BootstrapServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/route":
		switch r.Method {
		case http.MethodPut:
			s.handleRoutePut(w, r)
		case http.MethodGet:
			s.handleRouteGet(w, r)
		default:
			// Upstream answers this one itself, with a JSON content type on a text body.
			reply(w, http.StatusMethodNotAllowed, "application/json; charset=utf-8", []byte("Method not allowed"))
		}
	case "/register_dp_rank":
		if allow(w, r, http.MethodPost) {
			s.handleRegisterDPRank(w, r)
		}
	case "/query_dp_ranks":
		if allow(w, r, http.MethodPost) {
			s.handleQueryDPRanks(w, r)
		}
	case "/health":
		if allow(w, r, http.MethodGet, http.MethodHead) {
			text(w, http.StatusOK, "OK")
		}
	default:
		text(w, http.StatusNotFound, "404: Not Found")
	}
}

func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	text(w, http.StatusMethodNotAllowed, "405: Method Not Allowed")
	return false
}

func reply(w http.ResponseWriter, code int, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

func text(w http.ResponseWriter, code int, body string) {
	reply(w, code, "text/plain; charset=utf-8", []byte(body))
}

func jsonReply(w http.ResponseWriter, body []byte) {
	reply(w, http.StatusOK, "application/json; charset=utf-8", body)
}

// authorized is upstream is_bootstrap_write_authorized: split the header once on a space,
// scheme "bearer" in any case, constant-time token compare, fail closed on an empty token.
func (s *BootstrapServer) authorized(r *http.Request) bool {
	if !s.cfg.RequireAuth {
		return true
	}
	if s.cfg.AuthToken == "" {
		return false
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.AuthToken)) == 1
}

// readJSONObject decodes a JSON object body with numbers kept exact.
func readJSONObject(r *http.Request) (map[string]any, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBootstrapBody+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxBootstrapBody {
		return nil, fmt.Errorf("body larger than %d bytes", maxBootstrapBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("invalid JSON body: %v", err)
	}
	if m == nil {
		return nil, fmt.Errorf("JSON body is not an object")
	}
	return m, nil
}

// badRequest answers input upstream would crash on (KeyError/ValueError -> aiohttp 500).
// We answer 400 with the reason instead; see docs/protocol.md "Deviations".
func (s *BootstrapServer) badRequest(w http.ResponseWriter, route string, err error) {
	s.log.Warn("bootstrap: bad request", "route", route, "err", err)
	text(w, http.StatusBadRequest, "Bad request: "+err.Error())
}

func intField(m map[string]any, key string, required bool) (*int64, error) {
	v, ok := m[key]
	if !ok {
		if required {
			return nil, fmt.Errorf("missing key %q", key)
		}
		return nil, nil
	}
	if v == nil && !required {
		return nil, nil
	}
	i, err := pyInt(v)
	if err != nil {
		return nil, fmt.Errorf("key %q: %v", key, err)
	}
	return &i, nil
}

// routePut is the validated body of PUT /route.
type routePut struct {
	attnTPSize, attnTPRank, attnCPSize, attnCPRank, attnDPSize, attnDPRank int64
	ppSize, ppRank, systemDPSize, systemDPRank, rankPort, pageSize         int64
	rankIP                                                                 string
	kvCacheDtype                                                           *string
	loadBalanceMethod                                                      string
	enableDSASplit                                                         bool
	prefillHTTPPort                                                        *int64
}

func parseRoutePut(m map[string]any) (*routePut, error) {
	p := &routePut{loadBalanceMethod: "follow_bootstrap_room"}
	ints := []struct {
		key string
		dst *int64
	}{
		{"attn_tp_size", &p.attnTPSize}, {"attn_tp_rank", &p.attnTPRank},
		{"attn_cp_size", &p.attnCPSize}, {"attn_cp_rank", &p.attnCPRank},
		{"attn_dp_size", &p.attnDPSize}, {"attn_dp_rank", &p.attnDPRank},
		{"pp_size", &p.ppSize}, {"pp_rank", &p.ppRank},
		{"system_dp_size", &p.systemDPSize}, {"system_dp_rank", &p.systemDPRank},
		{"rank_port", &p.rankPort}, {"page_size", &p.pageSize},
	}
	for _, f := range ints {
		v, err := intField(m, f.key, true)
		if err != nil {
			return nil, err
		}
		*f.dst = *v
	}
	ip, ok := m["rank_ip"].(string)
	if !ok {
		return nil, fmt.Errorf("key \"rank_ip\": missing or not a string")
	}
	if len(ip) > maxBootstrapString {
		return nil, fmt.Errorf("key \"rank_ip\": longer than %d bytes", maxBootstrapString)
	}
	p.rankIP = ip
	dt, ok := m["kv_cache_dtype"]
	if !ok {
		return nil, fmt.Errorf("missing key \"kv_cache_dtype\"")
	}
	switch x := dt.(type) {
	case nil:
	case string:
		if len(x) > maxBootstrapString {
			return nil, fmt.Errorf("key \"kv_cache_dtype\": longer than %d bytes", maxBootstrapString)
		}
		p.kvCacheDtype = &x
	default:
		return nil, fmt.Errorf("key \"kv_cache_dtype\": %T is not a string", dt)
	}
	if v, ok := m["load_balance_method"]; ok {
		s, isStr := v.(string)
		if !isStr {
			return nil, fmt.Errorf("key \"load_balance_method\": %T is not a string", v)
		}
		p.loadBalanceMethod = s
	}
	p.enableDSASplit = pyTruthy(m["enable_dsa_cache_layer_split"])
	var err error
	if p.prefillHTTPPort, err = intField(m, "prefill_http_port", false); err != nil {
		return nil, err
	}
	for _, sz := range []int64{p.attnTPSize, p.attnCPSize, p.ppSize, p.systemDPSize, p.attnDPSize} {
		if sz < 1 {
			return nil, fmt.Errorf("sizes must be >= 1")
		}
	}
	if p.rankPort < 0 || p.rankPort > 65535 {
		return nil, fmt.Errorf("rank_port %d out of range", p.rankPort)
	}
	return p, nil
}

// group is the rank's dp group and the instance's dp size: system_dp_* when
// system_dp_size is not 1, else attn_dp_* (upstream's rule).
func (p *routePut) group() (dpSize, dpGroup int64) {
	if p.systemDPSize != 1 {
		return p.systemDPSize, p.systemDPRank
	}
	return p.attnDPSize, p.attnDPRank
}

func (p *routePut) key() rankKey {
	_, dp := p.group()
	return rankKey{dp, p.attnCPRank, p.attnTPRank, p.ppRank}
}

// checkTopology refuses a PUT whose own ranks lie outside its own sizes, or
// whose topology is larger than the rank table may hold.
func (s *BootstrapServer) checkTopology(p *routePut) error {
	dpSize, dpGroup := p.group()
	n := int64(1)
	for _, sz := range []int64{dpSize, p.attnCPSize, p.attnTPSize, p.ppSize} {
		if sz > int64(s.maxRanks) || n*sz > int64(s.maxRanks) {
			return fmt.Errorf("topology dp*cp*tp*pp is larger than %d ranks", s.maxRanks)
		}
		n *= sz
	}
	return inGrid(rankKey{dpGroup, p.attnCPRank, p.attnTPRank, p.ppRank}, dpSize, p.attnCPSize, p.attnTPSize, p.ppSize)
}

func inGrid(k rankKey, dp, cp, tp, pp int64) error {
	if k.dp < 0 || k.dp >= dp || k.cp < 0 || k.cp >= cp || k.tp < 0 || k.tp >= tp || k.pp < 0 || k.pp >= pp {
		return fmt.Errorf("rank (dp %d, cp %d, tp %d, pp %d) outside the topology (dp %d, cp %d, tp %d, pp %d)",
			k.dp, k.cp, k.tp, k.pp, dp, cp, tp, pp)
	}
	return nil
}

// conflictLocked names the first of the owner's fixed values p contradicts.
func (s *BootstrapServer) conflictLocked(p *routePut) string {
	dpSize, _ := p.group()
	for _, c := range []struct {
		name string
		have *int64
		got  int64
	}{{"attn_tp_size", s.attnTPSize, p.attnTPSize}, {"attn_cp_size", s.attnCPSize, p.attnCPSize},
		{"dp_size", s.dpSize, dpSize}, {"pp_size", s.ppSize, p.ppSize}, {"page_size", s.pageSize, p.pageSize}} {
		if c.have != nil && *c.have != c.got {
			return fmt.Sprintf("%s %d, this instance's is %d", c.name, c.got, *c.have)
		}
	}
	if s.kvCacheDtype != nil && p.kvCacheDtype != nil && *s.kvCacheDtype != *p.kvCacheDtype {
		return fmt.Sprintf("kv_cache_dtype %q, this instance's is %q", *p.kvCacheDtype, *s.kvCacheDtype)
	}
	return ""
}

// setInstanceLocked fixes the instance-wide values a PUT carries, first one wins.
func (s *BootstrapServer) setInstanceLocked(p *routePut) {
	dpSize, _ := p.group()
	setOnce(&s.attnTPSize, p.attnTPSize)
	setOnce(&s.attnCPSize, p.attnCPSize)
	setOnce(&s.dpSize, dpSize)
	setOnce(&s.ppSize, p.ppSize)
	setOnce(&s.pageSize, p.pageSize)
	if s.kvCacheDtype == nil && p.kvCacheDtype != nil {
		s.kvCacheDtype = p.kvCacheDtype
	}
	if s.prefillHTTPPort == nil && p.prefillHTTPPort != nil {
		s.prefillHTTPPort = p.prefillHTTPPort
	}
	setOnce(&s.followBootstrapRoom, p.loadBalanceMethod == "follow_bootstrap_room")
	setOnce(&s.enableDSASplit, p.enableDSASplit)
}

func (s *BootstrapServer) handleRoutePut(w http.ResponseWriter, r *http.Request) {
	const route = "PUT /route"
	if !s.authorized(r) {
		s.refuse(w, &s.stats.Unauthorized, http.StatusUnauthorized, route, "Unauthorized", r)
		return
	}
	m, err := readJSONObject(r)
	if err != nil {
		s.badRequest(w, route, err)
		return
	}
	p, err := parseRoutePut(m)
	if err != nil {
		s.badRequest(w, route, err)
		return
	}
	k := p.key()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkTopology(p); err != nil {
		s.refuseLocked(w, &s.stats.OutOfTopology, http.StatusBadRequest, route, "Bad request: "+err.Error(), r)
		return
	}
	if s.owner != nil {
		if k == *s.owner && subtle.ConstantTimeCompare([]byte(r.Header.Get(OwnerKeyHeader)), []byte(s.ownerKey)) != 1 {
			s.refuseLocked(w, &s.stats.OwnerRefused, http.StatusForbidden, route,
				"Forbidden: this rank is served by the bootstrap server's own process", r)
			return
		}
		if c := s.conflictLocked(p); c != "" {
			s.refuseLocked(w, &s.stats.Conflicts, http.StatusConflict, route, "Conflict: "+c, r)
			return
		}
	}
	if s.expectedLocked() >= 0 {
		// The instance topology is known: the rank must lie inside it.
		if err := inGrid(k, *s.dpSize, *s.attnCPSize, *s.attnTPSize, *s.ppSize); err != nil {
			s.refuseLocked(w, &s.stats.OutOfTopology, http.StatusBadRequest, route, "Bad request: "+err.Error(), r)
			return
		}
	}
	if _, known := s.ranks[k]; !known && len(s.ranks) >= s.maxRanks {
		s.refuseLocked(w, &s.stats.TableFull, http.StatusTooManyRequests, route,
			fmt.Sprintf("Too many prefill ranks (%d)", len(s.ranks)), r)
		return
	}
	s.setInstanceLocked(p)
	s.ranks[k] = RankEndpoint{p.rankIP, p.rankPort}
	s.registered++
	count, expected := s.registered, s.expectedLocked()
	s.log.Debug("bootstrap: registered prefill rank", "dp", k.dp, "cp", k.cp, "tp", k.tp,
		"pp", k.pp, "rank_ip", p.rankIP, "rank_port", p.rankPort, "registered", count, "expected", expected)
	text(w, http.StatusOK, "OK")
}

func setOnce[T any](dst **T, v T) {
	if *dst == nil {
		*dst = &v
	}
}

// expectedLocked is dp*cp*tp*pp, or -1 while the topology is unknown.
func (s *BootstrapServer) expectedLocked() int64 {
	if s.attnTPSize == nil || s.attnCPSize == nil || s.ppSize == nil || s.dpSize == nil {
		return -1
	}
	return *s.dpSize * *s.attnCPSize * *s.attnTPSize * *s.ppSize
}

func (s *BootstrapServer) readyLocked() bool {
	e := s.expectedLocked()
	return e >= 0 && s.registered >= e
}

func (s *BootstrapServer) handleRouteGet(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	names := [4]string{"prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"}
	var raw [4]string
	var v [4]int64
	for i, n := range names {
		raw[i] = q.Get(n)
		if raw[i] == "" {
			text(w, http.StatusBadRequest, "Missing inputs for bootstrap server.")
			return
		}
	}
	for i := range names {
		x, err := wire.ParsePyInt([]byte(raw[i]))
		if err != nil {
			s.badRequest(w, "GET /route", fmt.Errorf("%s: %v", names[i], err))
			return
		}
		v[i] = x
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.readyLocked() {
		text(w, http.StatusServiceUnavailable,
			fmt.Sprintf("Prefill server not fully registered yet (%d workers registered).", s.registered))
		return
	}
	if v == [4]int64{-1, -1, -1, -1} {
		jsonReply(w, s.serverInfoLocked())
		return
	}
	ep, ok := s.ranks[rankKey{v[0], v[1], v[2], v[3]}]
	if !ok {
		text(w, http.StatusNotFound, fmt.Sprintf("Bootstrap info not found for dp_rank=%s cp_rank=%s tp_rank=%s pp_rank=%s",
			raw[0], raw[1], raw[2], raw[3]))
		return
	}
	var o pyObject
	o.Str("rank_ip", ep.RankIP)
	o.Int("rank_port", ep.RankPort)
	jsonReply(w, o.Bytes())
}

// serverInfoLocked is dataclasses.asdict(PrefillServerInfo(...)): exactly these keys, in
// this order. The six rank-mapping fields are decode-local and always null here.
func (s *BootstrapServer) serverInfoLocked() []byte {
	var o pyObject
	o.Int("attn_tp_size", *s.attnTPSize)
	o.Int("attn_cp_size", *s.attnCPSize)
	o.Int("dp_size", *s.dpSize)
	o.Int("pp_size", *s.ppSize)
	o.OptInt("page_size", s.pageSize)
	o.OptStr("kv_cache_dtype", s.kvCacheDtype)
	o.Bool("follow_bootstrap_room", s.followBootstrapRoom == nil || *s.followBootstrapRoom)
	if !s.cfg.LegacyServerInfo {
		o.Bool("enable_dsa_cache_layer_split", s.enableDSASplit != nil && *s.enableDSASplit)
		o.OptInt("prefill_http_port", s.prefillHTTPPort)
	}
	for _, k := range []string{"target_tp_rank", "target_tp_ranks", "target_cp_ranks", "target_pp_ranks",
		"required_dst_info_num", "required_prefill_response_num"} {
		o.Null(k)
	}
	return o.Bytes()
}

func (s *BootstrapServer) handleRegisterDPRank(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		s.refuse(w, &s.stats.Unauthorized, http.StatusUnauthorized, "POST /register_dp_rank", "Unauthorized", r)
		return
	}
	m, err := readJSONObject(r)
	if err != nil {
		s.badRequest(w, "POST /register_dp_rank", err)
		return
	}
	room, err := intField(m, "bootstrap_room", true)
	if err != nil {
		s.badRequest(w, "POST /register_dp_rank", err)
		return
	}
	dp, err := intField(m, "dp_rank", true)
	if err != nil {
		s.badRequest(w, "POST /register_dp_rank", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, known := s.roomToDP[*room]; !known && len(s.roomToDP) >= s.maxDP {
		s.refuseLocked(w, &s.stats.TableFull, http.StatusTooManyRequests, "POST /register_dp_rank",
			fmt.Sprintf("Too many room -> dp_rank entries (%d)", len(s.roomToDP)), r)
		return
	}
	s.roomToDP[*room] = dpEntry{dpRank: *dp, at: s.now()}
	text(w, http.StatusOK, "OK")
}

func (s *BootstrapServer) handleQueryDPRanks(w http.ResponseWriter, r *http.Request) {
	m, err := readJSONObject(r)
	if err != nil {
		s.badRequest(w, "POST /query_dp_ranks", err)
		return
	}
	list, ok := m["bootstrap_rooms"].([]any)
	if !ok {
		s.badRequest(w, "POST /query_dp_ranks", fmt.Errorf("key \"bootstrap_rooms\": missing or not a list"))
		return
	}
	rooms := make([]int64, 0, len(list))
	for _, v := range list {
		room, err := pyInt(v)
		if err != nil {
			s.badRequest(w, "POST /query_dp_ranks", fmt.Errorf("bootstrap_rooms: %v", err))
			return
		}
		rooms = append(rooms, room)
	}
	var o pyObject
	seen := make(map[int64]bool, len(rooms))
	s.mu.Lock()
	for _, room := range rooms {
		e, ok := s.roomToDP[room]
		if ok && !seen[room] {
			seen[room] = true
			o.Int(fmt.Sprint(room), e.dpRank)
		}
	}
	s.mu.Unlock()
	jsonReply(w, o.Bytes())
}

// SweepExpired removes room -> dp_rank entries older than the clean-up interval and returns
// how many it removed. RunCleanup calls it every interval, as upstream's background task.
func (s *BootstrapServer) SweepExpired() int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for room, e := range s.roomToDP {
		if now.Sub(e.at) > s.interval {
			delete(s.roomToDP, room)
			n++
		}
	}
	return n
}

// RunCleanup sweeps every clean-up interval until ctx is done.
func (s *BootstrapServer) RunCleanup(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := s.SweepExpired(); n > 0 {
				s.log.Debug("bootstrap: purged expired room->dp_rank entries", "count", n)
			}
		}
	}
}

// registeredCount is the number of PUT /route registrations, duplicates included.
func (s *BootstrapServer) registeredCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.registered)
}

// ready reports whether dp*cp*tp*pp registrations have arrived (GET /route stops 503ing).
func (s *BootstrapServer) ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readyLocked()
}

// rank returns the registered endpoint of one prefill rank.
func (s *BootstrapServer) rank(dp, cp, tp, pp int) (RankEndpoint, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ep, ok := s.ranks[rankKey{int64(dp), int64(cp), int64(tp), int64(pp)}]
	return ep, ok
}

// dpRank returns the dp rank registered for a room, if not yet purged.
func (s *BootstrapServer) dpRank(room int64) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.roomToDP[room]
	return int(e.dpRank), ok
}
