package decode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ServerInfo is the topology reply of GET /route with all four ranks -1
// (upstream PrefillServerInfo). Pointer fields may be JSON null.
type ServerInfo struct {
	AttnTPSize          int     `json:"attn_tp_size"`
	AttnCPSize          int     `json:"attn_cp_size"`
	DPSize              int     `json:"dp_size"`
	PPSize              int     `json:"pp_size"`
	PageSize            *int    `json:"page_size"`
	KVCacheDtype        *string `json:"kv_cache_dtype"`
	FollowBootstrapRoom bool    `json:"follow_bootstrap_room"`
}

// errNotReady is a 503: the prefill ranks have not all registered yet.
var errNotReady = errors.New("prefill server not fully registered yet")

// bootstrapClient speaks decode's side of the bootstrap HTTP API.
type bootstrapClient struct {
	base string // http://host:port
	hc   *http.Client
}

func newBootstrapClient(addr string, hc *http.Client) *bootstrapClient {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return &bootstrapClient{base: strings.TrimRight(addr, "/"), hc: hc}
}

func (b *bootstrapClient) get(ctx context.Context, path string, q url.Values, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := b.base + path
	if q != nil {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, body, err
}

func routeQuery(dp, cp, tp, pp int) url.Values {
	q := url.Values{}
	q.Set("prefill_dp_rank", strconv.Itoa(dp))
	q.Set("prefill_cp_rank", strconv.Itoa(cp))
	q.Set("target_tp_rank", strconv.Itoa(tp))
	q.Set("target_pp_rank", strconv.Itoa(pp))
	return q
}

// topology is one try_ensure_parallel_info: errNotReady on 503.
func (b *bootstrapClient) topology(ctx context.Context) (*ServerInfo, error) {
	code, body, err := b.get(ctx, "/route", routeQuery(-1, -1, -1, -1), 5*time.Second)
	if err != nil {
		return nil, err
	}
	switch code {
	case http.StatusOK:
	case http.StatusServiceUnavailable:
		return nil, fmt.Errorf("%w: %s", errNotReady, strings.TrimSpace(string(body)))
	default:
		return nil, fmt.Errorf("GET /route topology: status %d: %s", code, strings.TrimSpace(string(body)))
	}
	// Decode builds PrefillServerInfo(**data): an unknown key is a TypeError there,
	// so the emulator refuses one too (checkKeys) rather than hide the bug.
	var si ServerInfo
	if err := json.Unmarshal(body, &si); err != nil {
		return nil, fmt.Errorf("GET /route topology: %w", err)
	}
	if err := checkKeys(body); err != nil {
		return nil, err
	}
	return &si, nil
}

// knownKeys are PrefillServerInfo's fields: a real decode crashes on any other.
var knownKeys = map[string]bool{
	"attn_tp_size": true, "attn_cp_size": true, "dp_size": true, "pp_size": true, "page_size": true,
	"kv_cache_dtype": true, "follow_bootstrap_room": true, "enable_dsa_cache_layer_split": true,
	"prefill_http_port": true, "target_tp_rank": true, "target_tp_ranks": true, "target_cp_ranks": true,
	"target_pp_ranks": true, "required_dst_info_num": true, "required_prefill_response_num": true,
}

func checkKeys(body []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return err
	}
	for k := range m {
		if !knownKeys[k] {
			return fmt.Errorf("GET /route topology: key %q would crash SGLang decode (PrefillServerInfo(**data))", k)
		}
	}
	return nil
}

// waitTopology retries the topology query while the server answers 503 (or is
// unreachable), like DecodePreallocQueue._ensure_prefill_info, up to attempts
// tries spaced by every.
func (b *bootstrapClient) waitTopology(ctx context.Context, attempts int, every time.Duration) (*ServerInfo, error) {
	var last error
	for n := 0; attempts <= 0 || n < attempts; n++ {
		si, err := b.topology(ctx)
		if err == nil {
			return si, nil
		}
		last = err
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("bootstrap topology: %w (last: %v)", ctx.Err(), last)
		case <-t.C:
		}
	}
	return nil, fmt.Errorf("bootstrap topology after %d tries: %w", attempts, last)
}

// rankEndpoint is one specific-rank GET /route.
func (b *bootstrapClient) rankEndpoint(ctx context.Context, dp, cp, tp, pp int) (string, int, error) {
	code, body, err := b.get(ctx, "/route", routeQuery(dp, cp, tp, pp), 5*time.Second)
	if err != nil {
		return "", 0, err
	}
	if code != http.StatusOK {
		return "", 0, fmt.Errorf("GET /route dp=%d cp=%d tp=%d pp=%d: status %d: %s", dp, cp, tp, pp, code, strings.TrimSpace(string(body)))
	}
	var ep struct {
		RankIP   string `json:"rank_ip"`
		RankPort int    `json:"rank_port"`
	}
	if err := json.Unmarshal(body, &ep); err != nil {
		return "", 0, fmt.Errorf("GET /route dp=%d cp=%d tp=%d pp=%d: %w", dp, cp, tp, pp, err)
	}
	return ep.RankIP, ep.RankPort, nil
}

// health is one heartbeat: GET /health must answer 200.
func (b *bootstrapClient) health(ctx context.Context, timeout time.Duration) error {
	code, _, err := b.get(ctx, "/health", nil, timeout)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET /health: status %d", code)
	}
	return nil
}
