package sgltest

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Venv is one SGLang release's virtualenv made by scripts/install-sglang.sh.
type Venv struct {
	Version string
	Python  string
}

// Root is where scripts/install-sglang.sh puts the venvs.
func Root() string {
	if r := os.Getenv("KVXFER_SGLANG_ROOT"); r != "" {
		return r
	}
	return "/opt/kvxfer-sglang"
}

// Versions are the releases the tests run against.
func Versions() []string {
	if v := os.Getenv("KVXFER_SGLANG_VERSIONS"); v != "" {
		return strings.Fields(v)
	}
	return []string{"0.5.18", "0.5.23"}
}

// FindVenv returns the venv of version, or an error saying how to install it.
func FindVenv(version string) (Venv, error) {
	py := filepath.Join(Root(), version, "bin", "python")
	if _, err := os.Stat(py); err != nil {
		return Venv{}, fmt.Errorf("no SGLang %s venv at %s (bash scripts/install-sglang.sh)", version, filepath.Dir(filepath.Dir(py)))
	}
	return Venv{Version: version, Python: py}, nil
}

// RoomSpec is one room as decode opens it: its destination pages and aux slot.
type RoomSpec struct {
	Room  uint64  `json:"room"`
	Pages []int32 `json:"pages"`
	Aux   int     `json:"aux"`
}

// RoomView is decode_peer.py's view of one receiver.
type RoomView struct {
	Room uint64 `json:"room"`
	// Phase: bootstrapping, waiting, transferring, success, failed.
	Phase      string   `json:"phase"`
	TOpen      float64  `json:"t_open"`
	TMetadata  *float64 `json:"t_metadata"`
	TTerminal  *float64 `json:"t_terminal"`
	Reason     *string  `json:"reason"`
	Aborted    bool     `json:"aborted"`
	TAbort     *float64 `json:"t_abort"`
	Release    *string  `json:"release"` // immediate, acks, timeout; nil while live or held
	TRelease   *float64 `json:"t_release"`
	Held       bool     `json:"held"`
	Required   int      `json:"required_acks"`
	Generation *int     `json:"generation"`
	Acks       []int    `json:"acks"`
	Ranks      []int    `json:"prefill_ranks"`
	Error      *string  `json:"error"`
	// PrefillDP is the prefill DP rank the receiver was initialised with;
	// Targets its bootstrap infos: [rank_port, is_dummy] per prefill rank.
	PrefillDP *int    `json:"prefill_dp_rank"`
	Targets   [][]any `json:"targets"`
}

// Terminal says the receiver concluded.
func (r RoomView) Terminal() bool { return r.Phase == "success" || r.Phase == "failed" }

// ReasonText is the failure reason or "".
func (r RoomView) ReasonText() string {
	if r.Reason == nil {
		return ""
	}
	return *r.Reason
}

// ReleaseText is how the pages were released, or "" while not released.
func (r RoomView) ReleaseText() string {
	if r.Release == nil {
		return ""
	}
	return *r.Release
}

// At converts one of the view's epoch-second stamps.
func At(sec *float64) time.Time {
	if sec == nil {
		return time.Time{}
	}
	return time.Unix(0, int64(*sec*1e9))
}

// Info is what decode_peer.py reports on start.
type Info struct {
	Version         string   `json:"version"`
	Agent           string   `json:"agent"`
	IP              string   `json:"ip"`
	Port            int      `json:"port"`
	PID             int      `json:"pid"`
	DeferredRelease bool     `json:"deferred_release"`
	ReleaseTimeout  float64  `json:"release_timeout"`
	WaitingTimeout  float64  `json:"waiting_timeout"`
	KVItemLens      []int    `json:"kv_item_lens"`
	AuxItemLens     []uint64 `json:"aux_item_lens"`
	Slots           int      `json:"slots"`
	AuxSlots        int      `json:"aux_slots"`
	Layers          int      `json:"layers"`
	TPSize          int      `json:"tp_size"`
	TPRank          int      `json:"tp_rank"`
	PPSize          int      `json:"pp_size"`
	PPRank          int      `json:"pp_rank"`
	MLA             bool     `json:"mla"`
	KVLayerIDs      []int    `json:"kv_layer_ids"`
}

// Warning is one captured SGLang log record (WARNING and above).
type Warning struct {
	T      float64 `json:"t"`
	Level  string  `json:"level"`
	Logger string  `json:"logger"`
	Msg    string  `json:"msg"`
}

// PeerConfig configures a decode_peer.py process.
type PeerConfig struct {
	Venv      Venv
	Script    string // tests/sglang/decode_peer.py
	Bootstrap string // prefill bootstrap host:port
	Layers    int
	Slots     int
	Item      int
	AuxSlots  int
	Args      []string // extra decode_peer.py arguments (rank identity: --tp-size, --mla, ...)
	Env       []string // extra KEY=VALUE
	Stderr    io.Writer
}

// Peer is a running decode_peer.py: one SGLang decode rank.
type Peer struct {
	Info Info
	cmd  *exec.Cmd
	in   io.WriteCloser

	mu      sync.Mutex
	nextID  int
	pending map[int]chan json.RawMessage
	exited  chan struct{}
	exitErr error
	stderr  *tail
	killed  atomic.Bool
}

// StartPeer starts decode_peer.py and waits for its ready line.
func StartPeer(cfg PeerConfig) (*Peer, error) {
	args := []string{cfg.Script, "--bootstrap", cfg.Bootstrap}
	for _, kv := range [][2]any{{"--layers", cfg.Layers}, {"--slots", cfg.Slots}, {"--item", cfg.Item}, {"--aux-slots", cfg.AuxSlots}} {
		if n := kv[1].(int); n > 0 {
			args = append(args, kv[0].(string), fmt.Sprint(n))
		}
	}
	args = append(args, cfg.Args...)
	cmd := exec.Command(cfg.Venv.Python, args...)
	cmd.Env = append(os.Environ(), cfg.Env...)
	p := &Peer{cmd: cmd, pending: map[int]chan json.RawMessage{}, exited: make(chan struct{}), stderr: &tail{max: 64 << 10}}
	if cfg.Stderr != nil {
		cmd.Stderr = io.MultiWriter(p.stderr, cfg.Stderr)
	} else {
		cmd.Stderr = p.stderr
	}
	var err error
	if p.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan json.RawMessage, 1)
	go p.read(out, ready)
	go func() {
		p.exitErr = cmd.Wait()
		close(p.exited)
	}()
	select {
	case raw := <-ready:
		if err := json.Unmarshal(raw, &p.Info); err != nil {
			p.Kill()
			return nil, fmt.Errorf("decode_peer ready line: %v", err)
		}
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("decode_peer exited before ready (%v):\n%s", p.exitErr, p.stderr.String())
	case <-time.After(60 * time.Second):
		p.Kill()
		return nil, fmt.Errorf("decode_peer not ready after 60s:\n%s", p.stderr.String())
	}
}

func (p *Peer) read(out io.Reader, ready chan json.RawMessage) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		line := append([]byte(nil), sc.Bytes()...)
		var head struct {
			ID    *int   `json:"id"`
			Event string `json:"event"`
		}
		if json.Unmarshal(line, &head) != nil {
			continue
		}
		if head.Event == "ready" {
			ready <- line
			continue
		}
		if head.ID == nil {
			continue
		}
		p.mu.Lock()
		ch := p.pending[*head.ID]
		delete(p.pending, *head.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- line
		}
	}
}

// ErrExited is returned by calls to a peer that is gone.
var ErrExited = errors.New("decode_peer exited")

// Call sends one command and decodes the answer into out (may be nil).
func (p *Peer) Call(op string, fields map[string]any, timeout time.Duration, out any) error {
	p.mu.Lock()
	p.nextID++
	id := p.nextID
	ch := make(chan json.RawMessage, 1)
	p.pending[id] = ch
	p.mu.Unlock()
	msg := map[string]any{"op": op, "id": id}
	for k, v := range fields {
		msg[k] = v
	}
	b, _ := json.Marshal(msg)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%s: %w (%v)", op, ErrExited, err)
	}
	select {
	case raw := <-ch:
		var st struct {
			OK    bool   `json:"ok"`
			Error string `json:"error"`
			Trace string `json:"trace"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return err
		}
		if !st.OK {
			return fmt.Errorf("decode_peer %s: %s\n%s", op, st.Error, st.Trace)
		}
		if out != nil {
			return json.Unmarshal(raw, out)
		}
		return nil
	case <-p.exited:
		return fmt.Errorf("%s: %w (%v):\n%s", op, ErrExited, p.exitErr, p.stderr.String())
	case <-time.After(timeout):
		// Ask Python for every thread's stack (faulthandler on SIGUSR1).
		if p.cmd.Process != nil {
			_ = p.cmd.Process.Signal(syscall.SIGUSR1)
			time.Sleep(500 * time.Millisecond)
		}
		return fmt.Errorf("decode_peer %s: no answer in %v; stacks:\n%s", op, timeout, lastLines(p.stderr.String(), 200))
	}
}

type roomsReply struct {
	Rooms    []RoomView `json:"rooms"`
	TimedOut bool       `json:"timed_out"`
}

// Open opens rooms as decode.py does: receiver, init, and (metadata) send_metadata.
func (p *Peer) Open(rooms []RoomSpec, metadata bool) ([]RoomView, error) {
	var r roomsReply
	err := p.Call("open", map[string]any{"rooms": rooms, "metadata": metadata}, 60*time.Second, &r)
	return r.Rooms, err
}

// SendMetadata sends the metadata of rooms opened without it.
func (p *Peer) SendMetadata(rooms ...uint64) ([]RoomView, error) {
	var r roomsReply
	err := p.Call("metadata", map[string]any{"rooms": rooms}, 30*time.Second, &r)
	return r.Rooms, err
}

// Abort calls receiver.abort() for rooms (the scheduler's abort_request).
func (p *Peer) Abort(rooms ...uint64) ([]RoomView, error) {
	var r roomsReply
	err := p.Call("abort", map[string]any{"rooms": rooms}, 30*time.Second, &r)
	return r.Rooms, err
}

// Status reports rooms (nil: every room).
func (p *Peer) Status(rooms ...uint64) ([]RoomView, error) {
	var r roomsReply
	f := map[string]any{}
	if rooms != nil {
		f["rooms"] = rooms
	}
	err := p.Call("status", f, 30*time.Second, &r)
	return r.Rooms, err
}

// Wait answers once every room is terminal (until "terminal") or also released
// (until "released"), or after timeout with timedOut set.
func (p *Peer) Wait(rooms []uint64, until string, timeout time.Duration) (views []RoomView, timedOut bool, err error) {
	var r roomsReply
	err = p.Call("wait", map[string]any{"rooms": rooms, "until": until, "timeout": timeout.Seconds()}, timeout+30*time.Second, &r)
	return r.Rooms, r.TimedOut, err
}

// Read returns, for each KV buffer, the bytes of pages (concatenated), and
// for each aux buffer the bytes of aux slot (aux < 0: none).
func (p *Peer) Read(pages []int32, aux int) (kv, auxBufs [][]byte, err error) {
	var r struct {
		KV  []string `json:"kv"`
		Aux []string `json:"aux"`
	}
	f := map[string]any{"pages": pages}
	if aux >= 0 {
		f["aux"] = aux
	}
	if err = p.Call("read", f, 30*time.Second, &r); err != nil {
		return nil, nil, err
	}
	for _, s := range r.KV {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, nil, err
		}
		kv = append(kv, b)
	}
	for _, s := range r.Aux {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, nil, err
		}
		auxBufs = append(auxBufs, b)
	}
	return kv, auxBufs, nil
}

// Zero zeroes pages in every KV buffer and aux slot aux (< 0: none).
func (p *Peer) Zero(pages []int32, aux int) error {
	f := map[string]any{"pages": pages}
	if aux >= 0 {
		f["aux"] = aux
	}
	return p.Call("zero", f, 30*time.Second, nil)
}

// IsZero says whether pages and aux slot aux are all zero.
func (p *Peer) IsZero(pages []int32, aux int) (bool, error) {
	var r struct {
		Zero bool `json:"zero"`
	}
	f := map[string]any{"pages": pages}
	if aux >= 0 {
		f["aux"] = aux
	}
	err := p.Call("is_zero", f, 30*time.Second, &r)
	return r.Zero, err
}

// Warnings are SGLang's WARNING+ log records so far.
func (p *Peer) Warnings() ([]Warning, error) {
	var r struct {
		Warnings []Warning `json:"warnings"`
	}
	err := p.Call("warnings", nil, 30*time.Second, &r)
	return r.Warnings, err
}

// UnreadNotifs drains the NIXL notifications this decode never reads, for
// releases that read none (0.5.23); ok is false where the release reads them.
func (p *Peer) UnreadNotifs() (msgs []string, ok bool, err error) {
	var r struct {
		Notifs *[]string `json:"notifs"`
	}
	if err = p.Call("notifs", nil, 30*time.Second, &r); err != nil || r.Notifs == nil {
		return nil, false, err
	}
	return *r.Notifs, true, nil
}

// Killed says whether Kill was called.
func (p *Peer) Killed() bool { return p.killed.Load() }

// Kill SIGKILLs the process and waits for it.
func (p *Peer) Kill() {
	p.killed.Store(true)
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// Close closes stdin (the peer exits) and kills it if it lingers.
func (p *Peer) Close() {
	_ = p.in.Close()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.Kill()
	}
}

// Stderr is the tail of the peer's stderr.
func (p *Peer) Stderr() string { return p.stderr.String() }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// tail keeps the last max bytes written.
type tail struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(b)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}
