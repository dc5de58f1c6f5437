package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RankRegistration is the body of PUT /route: one prefill rank announcing its ZMQ PULL
// endpoint (upstream CommonKVManager.register_to_bootstrap).
type RankRegistration struct {
	AttnTPSize, AttnTPRank     int
	AttnCPSize, AttnCPRank     int
	AttnDPSize, AttnDPRank     int
	PPSize, PPRank             int
	SystemDPSize, SystemDPRank int
	RankIP                     string
	RankPort                   int
	PageSize                   int
	// KVCacheDtype, e.g. "auto"; decode refuses a mismatch. "" is sent as null (no check).
	KVCacheDtype string
	// LoadBalanceMethod: "" omits the key, which the server reads as "follow_bootstrap_room".
	LoadBalanceMethod        string
	EnableDSACacheLayerSplit bool
	// PrefillHTTPPort is the prefill's --port; 0 is sent as null.
	PrefillHTTPPort int
}

// JSON returns the body exactly as upstream's requests.put(json=payload) sends it: same
// keys, same order, json.dumps formatting.
func (r RankRegistration) JSON() []byte {
	var o pyObject
	for _, kv := range []struct {
		k string
		v int
	}{
		{"attn_tp_size", r.AttnTPSize}, {"attn_tp_rank", r.AttnTPRank},
		{"attn_cp_size", r.AttnCPSize}, {"attn_cp_rank", r.AttnCPRank},
		{"attn_dp_size", r.AttnDPSize}, {"attn_dp_rank", r.AttnDPRank},
		{"pp_size", r.PPSize}, {"pp_rank", r.PPRank},
		{"system_dp_size", r.SystemDPSize}, {"system_dp_rank", r.SystemDPRank},
	} {
		o.Int(kv.k, int64(kv.v))
	}
	o.Str("rank_ip", r.RankIP)
	o.Int("rank_port", int64(r.RankPort))
	o.Int("page_size", int64(r.PageSize))
	if r.KVCacheDtype == "" {
		o.Null("kv_cache_dtype")
	} else {
		o.Str("kv_cache_dtype", r.KVCacheDtype)
	}
	if r.LoadBalanceMethod != "" {
		o.Str("load_balance_method", r.LoadBalanceMethod)
	}
	o.Bool("enable_dsa_cache_layer_split", r.EnableDSACacheLayerSplit)
	if r.PrefillHTTPPort == 0 {
		o.Null("prefill_http_port")
	} else {
		o.Int("prefill_http_port", int64(r.PrefillHTTPPort))
	}
	return o.Bytes()
}

// RegisterOptions tunes RegisterRank. The zero value is upstream's behaviour without auth.
type RegisterOptions struct {
	Client *http.Client // nil: a client with a per-attempt Timeout
	// Token, when set, is sent as "Authorization: Bearer <Token>" (§9.1).
	Token string
	// OwnerKey, when set, is sent in the X-Kvxfer-Owner-Key header: the secret
	// of the rank a kvxferd-hosted bootstrap server serves itself
	// (BootstrapServer.OwnerKey).
	OwnerKey string
	// Attempts: 0 means 5, as upstream.
	Attempts int
	// Timeout per attempt: 0 means 5 s, as upstream.
	Timeout time.Duration
	// Backoff returns the wait before retry number attempt (0-based). nil: upstream's
	// min(1 s * 2^attempt, 30 s) * uniform[0.75, 1).
	Backoff func(attempt int) time.Duration
}

// ErrRegisterRejected wraps a non-200 reply to PUT /route.
var ErrRegisterRejected = errors.New("bootstrap server rejected the registration")

// bootstrapURL is upstream's URL host rule for register_to_bootstrap: a wildcard bind
// address is not connectable, so 0.0.0.0 becomes 127.0.0.1 and :: becomes ::1; IPv6
// literals are bracketed.
func bootstrapURL(host string, port int) string {
	switch host {
	case "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(port))
}

func defaultBackoff(attempt int) time.Duration {
	d := time.Second << min(attempt, 5)
	d = min(d, 30*time.Second)
	return time.Duration(float64(d) * (0.75 + 0.25*rand.Float64()))
}

// RegisterRank PUTs reg to baseURL + "/route" (baseURL like BootstrapURL's result), retrying
// like upstream. It returns nil on 200, else the last error; ctx cancels waits and requests.
func RegisterRank(ctx context.Context, baseURL string, reg RankRegistration, opt RegisterOptions) error {
	attempts := opt.Attempts
	if attempts <= 0 {
		attempts = 5
	}
	timeout := opt.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	client := opt.Client
	if client == nil {
		client = &http.Client{Timeout: timeout}
	}
	backoff := opt.Backoff
	if backoff == nil {
		backoff = defaultBackoff
	}
	body := reg.JSON()
	url := strings.TrimRight(baseURL, "/") + "/route"
	var last error
	for attempt := range attempts {
		last = putRoute(ctx, client, timeout, url, body, opt.Token, opt.OwnerKey)
		if last == nil {
			return nil
		}
		if attempt == attempts-1 {
			break
		}
		t := time.NewTimer(backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("register rank: %w (last error: %v)", ctx.Err(), last)
		case <-t.C:
		}
	}
	return fmt.Errorf("register rank after %d attempts: %w", attempts, last)
}

func putRoute(ctx context.Context, client *http.Client, timeout time.Duration, url string, body []byte, token, ownerKey string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ownerKey != "" {
		req.Header.Set(OwnerKeyHeader, ownerKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: status %d: %s", ErrRegisterRejected, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}
