package daemon

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/transport/wire"
)

// The registration state file (-state-dir): the decode registrations this
// rank accepted, kept so that the next kvxferd of the same rank can replay
// them. SGLang's decode registers with a prefill rank once per connection-pool
// entry and forgets it only when the bootstrap server's heartbeat fails; under
// the SGLang plug-in that server is SGLang's and stays up while kvxferd is
// restarted, so without the replay a decode that talked to the old kvxferd
// could never complete a room with the new one.
//
// Format (little endian): "KVXFERRG", u32 version, u32 len + scope (the rank
// and deployment it belongs to: another scope is not replayed), u32 count,
// then per registration u32 frames and per frame u32 len + bytes: the frames
// exactly as received, GUARD included. The file is input from disk: it must
// be a regular file (no symlink) owned by us with mode 0600, at most
// stateMaxFile bytes, and every record must decode as a registration
// (wire.DecodeInbound, the fuzzed codec); otherwise it is refused whole,
// logged, and the daemon starts without it.
const (
	stateMagic     = "KVXFERRG"
	stateVersion   = 1
	stateFile      = "registrations"
	stateMaxFile   = 32 << 20
	stateMaxFrames = 64 // a registration has 25 at most today
)

type storedReg struct {
	agent, endpoint string
	frames          [][]byte
	size            int
}

// regStore keeps the accepted registrations, newest per endpoint, and
// rewrites the file (atomically: temp file + rename, no fsync) on each change.
// The records and the file have one owner, an actor (regWriter): put and
// remove are messages to it, so the peer actors that keep and forget
// registrations never wait on the disk, and every change is written in the
// order it was made.
type regStore struct {
	path, scope string
	max         int
	log         *slog.Logger

	sys    *actor.ActorSystem
	writer *actor.PID
}

// regWriter owns the records and the file.
type regWriter struct {
	s      *regStore
	recs   []storedReg // oldest first
	closed bool
}

// Messages of the writer: close stops it writing (and answers once every
// change before it is on disk); sync only answers.
type (
	regPut    struct{ rec storedReg }
	regRemove struct{ agent string }
	regClose  struct{ done chan struct{} }
	regSync   struct{ done chan struct{} }
)

func (w *regWriter) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *regPut:
		if !w.closed {
			w.put(m.rec)
			w.write()
		}
	case *regRemove:
		if !w.closed {
			n := len(w.recs)
			w.recs = dropRecs(w.recs, func(o storedReg) bool { return o.agent == m.agent })
			if len(w.recs) != n {
				w.write()
			}
		}
	case *regClose:
		w.closed = true
		close(m.done)
	case *regSync:
		close(m.done)
	}
}

// openRegStore prepares dir and reads what it holds for scope. It returns a
// nil store (persistence off, logged) when dir is unusable, and the
// registrations to replay (nil when there are none or the file is refused).
func openRegStore(dir, scope string, maxRecs int, log *slog.Logger) (*regStore, [][][]byte) {
	if err := checkStateDir(dir); err != nil {
		log.Error("state dir refused: decode registrations are neither replayed nor kept", "dir", dir, "err", err)
		return nil, nil
	}
	s := &regStore{path: filepath.Join(dir, stateFile), scope: scope, max: max(maxRecs, 1), log: log}
	w := &regWriter{s: s}
	msgs, err := s.load(w)
	if err != nil {
		w.recs = nil // refused whole: replaced at the next registration
	}
	s.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	s.writer = s.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return w }))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return s, nil
	case err != nil:
		log.Error("state file refused: its decode registrations are not replayed (it is replaced at the next registration)",
			"file", s.path, "err", err)
		return s, nil
	}
	return s, msgs
}

func checkStateDir(dir string) error {
	if dir == "" {
		return errors.New("empty path")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory (a symlink is refused)")
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("owned by uid %d, not us (%d)", st.Uid, os.Getuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("mode %v: group or others may write to it (want 0700)", fi.Mode().Perm())
	}
	return nil
}

// load reads the file; records are deduplicated (newest per agent and per
// endpoint) and capped (newest s.max) as put does.
func (s *regStore) load(w *regWriter) ([][][]byte, error) {
	f, err := os.OpenFile(s.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, errors.New("a symlink")
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return nil, fmt.Errorf("owned by uid %d, not us (%d)", st.Uid, os.Getuid())
	}
	if fi.Mode().Perm() != 0o600 {
		return nil, fmt.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if fi.Size() > stateMaxFile {
		return nil, fmt.Errorf("%d bytes, over the %d-byte cap", fi.Size(), stateMaxFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, stateMaxFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > stateMaxFile {
		return nil, fmt.Errorf("over the %d-byte cap", stateMaxFile)
	}
	scope, recs, err := decodeState(data, s.max)
	if err != nil {
		return nil, err
	}
	if scope != s.scope {
		return nil, fmt.Errorf("written for %q, this is %q", scope, s.scope)
	}
	for _, r := range recs {
		w.put(r)
	}
	msgs := make([][][]byte, 0, len(w.recs))
	for _, r := range w.recs {
		msgs = append(msgs, r.frames)
	}
	return msgs, nil
}

// decodeState parses the file; any defect refuses it whole.
func decodeState(data []byte, maxRecs int) (string, []storedReg, error) {
	rd := bytes.NewReader(data)
	u32 := func(what string) (int, error) {
		var v uint32
		if err := binary.Read(rd, binary.LittleEndian, &v); err != nil {
			return 0, fmt.Errorf("truncated at %s", what)
		}
		return int(v), nil
	}
	bytesOf := func(n int, what string) ([]byte, error) {
		if n > rd.Len() {
			return nil, fmt.Errorf("%s: %d bytes announced, %d left", what, n, rd.Len())
		}
		b := make([]byte, n)
		_, _ = io.ReadFull(rd, b)
		return b, nil
	}
	magic, err := bytesOf(len(stateMagic), "header")
	if err != nil || string(magic) != stateMagic {
		return "", nil, errors.New("not a kvxferd registration state file (bad magic)")
	}
	v, err := u32("version")
	if err != nil {
		return "", nil, err
	}
	if v != stateVersion {
		return "", nil, fmt.Errorf("version %d, this kvxferd reads %d", v, stateVersion)
	}
	n, err := u32("scope")
	if err != nil {
		return "", nil, err
	}
	if n > 4096 {
		return "", nil, fmt.Errorf("scope of %d bytes", n)
	}
	scope, err := bytesOf(n, "scope")
	if err != nil {
		return "", nil, err
	}
	count, err := u32("count")
	if err != nil {
		return "", nil, err
	}
	if count > maxRecs {
		return "", nil, fmt.Errorf("%d registrations, over the cap of %d", count, maxRecs)
	}
	recs := make([]storedReg, 0, count)
	for i := range count {
		nf, err := u32("frame count")
		if err != nil {
			return "", nil, fmt.Errorf("registration %d: %w", i, err)
		}
		if nf < 2 || nf > stateMaxFrames {
			return "", nil, fmt.Errorf("registration %d: %d frames", i, nf)
		}
		frames := make([][]byte, 0, nf)
		size := 4
		for j := range nf {
			fl, err := u32("frame length")
			if err != nil {
				return "", nil, fmt.Errorf("registration %d: %w", i, err)
			}
			b, err := bytesOf(fl, fmt.Sprintf("registration %d frame %d", i, j))
			if err != nil {
				return "", nil, err
			}
			frames = append(frames, b)
			size += 4 + fl
		}
		m, err := wire.DecodeInbound(frames)
		if err != nil {
			return "", nil, fmt.Errorf("registration %d: %w", i, err)
		}
		r, ok := m.(*wire.Registration)
		if !ok {
			return "", nil, fmt.Errorf("registration %d: a %T, not a registration", i, m)
		}
		recs = append(recs, storedReg{agent: r.AgentName, endpoint: regEndpoint(r), frames: frames, size: size})
	}
	if rd.Len() != 0 {
		return "", nil, fmt.Errorf("%d trailing bytes", rd.Len())
	}
	return string(scope), recs, nil
}

func regEndpoint(r *wire.Registration) string {
	return fmt.Sprintf("%s:%d", r.DecodeIP, r.DecodePort)
}

// put keeps an accepted registration's frames (copied): it replaces any kept
// for the same agent or endpoint (a new agent at an endpoint is that decode
// restarted), and the oldest go past the count and size caps.
func (s *regStore) put(r *wire.Registration, frames [][]byte) {
	if s == nil {
		return
	}
	rec := storedReg{agent: r.AgentName, endpoint: regEndpoint(r), size: 4}
	for _, f := range frames {
		rec.frames = append(rec.frames, append([]byte(nil), f...))
		rec.size += 4 + len(f)
	}
	if len(frames) > stateMaxFrames || rec.size+64+len(s.scope) > stateMaxFile {
		s.log.Warn("decode registration too large to keep in the state file; it is not replayed after a restart",
			"agent", r.AgentName, "frames", len(frames), "bytes", rec.size)
		return
	}
	s.sys.Root.Send(s.writer, &regPut{rec: rec})
}

func (w *regWriter) put(rec storedReg) {
	w.recs = dropRecs(w.recs, func(o storedReg) bool { return o.agent == rec.agent || o.endpoint == rec.endpoint })
	w.recs = append(w.recs, rec)
	total := 64 + len(w.s.scope)
	for _, r := range w.recs {
		total += r.size
	}
	for len(w.recs) > w.s.max || total > stateMaxFile {
		total -= w.recs[0].size
		w.recs = w.recs[1:]
	}
}

// remove forgets an agent (dropped: lost, restarted, or its replay failed).
func (s *regStore) remove(agent string) {
	if s == nil {
		return
	}
	s.sys.Root.Send(s.writer, &regRemove{agent: agent})
}

// regFlush bounds how long close waits for the changes before it on disk.
const regFlush = 5 * time.Second

// close stops writing: a shutdown's drops must not erase what the next
// incarnation replays. It returns once every change made before it is on
// disk (bounded by regFlush), and stops the writer.
func (s *regStore) close() {
	if s == nil {
		return
	}
	done := make(chan struct{})
	s.sys.Root.Send(s.writer, &regClose{done: done})
	select {
	case <-done:
	case <-time.After(regFlush):
		s.log.Warn("state file writer still busy at shutdown; left behind", "file", s.path)
	}
	s.sys.Root.Stop(s.writer)
}

// sync returns once every change made before it is on disk (tests).
func (s *regStore) sync() {
	done := make(chan struct{})
	s.sys.Root.Send(s.writer, &regSync{done: done})
	<-done
}

func dropRecs(recs []storedReg, drop func(storedReg) bool) []storedReg {
	out := recs[:0:0]
	for _, r := range recs {
		if !drop(r) {
			out = append(out, r)
		}
	}
	return out
}

func (w *regWriter) write() {
	s := w.s
	if len(w.recs) == 0 {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("state file: removing it", "file", s.path, "err", err)
		}
		return
	}
	var b bytes.Buffer
	u32 := func(v int) { _ = binary.Write(&b, binary.LittleEndian, uint32(v)) }
	b.WriteString(stateMagic)
	u32(stateVersion)
	u32(len(s.scope))
	b.WriteString(s.scope)
	u32(len(w.recs))
	for _, r := range w.recs {
		u32(len(r.frames))
		for _, f := range r.frames {
			u32(len(f))
			b.Write(f)
		}
	}
	tmp := s.path + ".tmp"
	_ = os.Remove(tmp)
	err := func() error {
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		if _, err := f.Write(b.Bytes()); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return os.Rename(tmp, s.path)
	}()
	if err != nil {
		_ = os.Remove(tmp)
		s.log.Warn("state file not written: decode registrations may not be replayed after a restart", "file", s.path, "err", err)
	}
}
