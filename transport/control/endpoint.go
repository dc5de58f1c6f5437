package control

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// maxSunPath is the longest ipc path Linux accepts (sun_path is 108 bytes with NUL).
const maxSunPath = 107

type endpoint struct {
	ipcPath string // ipc: the socket file
	zmq     string // tcp: the endpoint to bind
	ipv6    bool
}

// parseEndpoint accepts ipc:// with an absolute, clean path (no abstract sockets: they
// have no file permissions to guard them) and tcp:// on a loopback address only,
// because the control API has no authentication of its own.
func parseEndpoint(ep string) (endpoint, error) {
	switch {
	case strings.HasPrefix(ep, "ipc://"):
		p := strings.TrimPrefix(ep, "ipc://")
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return endpoint{}, fmt.Errorf("control: ipc endpoint %q needs an absolute, clean path", ep)
		}
		if len(p) > maxSunPath {
			return endpoint{}, fmt.Errorf("control: ipc path %q is longer than %d bytes", p, maxSunPath)
		}
		return endpoint{ipcPath: p}, nil
	case strings.HasPrefix(ep, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
		if err != nil {
			return endpoint{}, fmt.Errorf("control: tcp endpoint %q: %v", ep, err)
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return endpoint{}, fmt.Errorf("control: tcp endpoint %q: bad port", ep)
		}
		ip := net.ParseIP(host)
		if host == "localhost" {
			ip, host = net.IPv4(127, 0, 0, 1), "127.0.0.1"
		}
		if ip == nil || !ip.IsLoopback() {
			return endpoint{}, fmt.Errorf("control: tcp endpoint %q is not on a loopback address", ep)
		}
		v6 := ip.To4() == nil
		if v6 {
			host = "[" + host + "]"
		}
		return endpoint{zmq: "tcp://" + host + ":" + port, ipv6: v6}, nil
	}
	return endpoint{}, fmt.Errorf("control: endpoint %q is neither ipc:// nor tcp://", ep)
}

// ipcFile is the bound socket file, remembered so that Stop removes it only if it is
// still ours (a successor daemon may have taken the path).
type ipcFile struct {
	path string
	info fs.FileInfo
}

func (f *ipcFile) remove() {
	if cur, err := os.Lstat(f.path); err == nil && os.SameFile(cur, f.info) {
		os.Remove(f.path)
	}
}

// bindIPC binds sock at path with mode 0600 and no window in which anyone else could
// connect: libzmq creates the file with the process umask, so the socket is bound
// inside a fresh 0700 directory next to path, made 0600, then renamed into place (a
// rename keeps the inode, and connect finds a unix socket by inode). Changing the
// umask instead would race with every other goroutine that creates files.
//
// A live server already at path is an error (libzmq would silently unlink its file and
// steal the name); a stale socket file is replaced; any other file is left alone.
func bindIPC(sock *zmq.Socket, path string) (*ipcFile, error) {
	if err := checkIPCPath(path); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".kvxfer-ctl-")
	if err != nil {
		return nil, fmt.Errorf("control: %v", err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	if len(tmp) > maxSunPath {
		return nil, fmt.Errorf("control: ipc directory %q is too deep for a %d-byte socket path", filepath.Dir(path), maxSunPath)
	}
	if err := sock.Bind("ipc://" + tmp); err != nil {
		return nil, fmt.Errorf("control: bind %s: %w", tmp, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, fmt.Errorf("control: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("control: %v", err)
	}
	info, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("control: %v", err)
	}
	return &ipcFile{path: path, info: info}, nil
}

func checkIPCPath(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control: %v", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("control: %s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("control: %s is in use by a live server", path)
	}
	return nil
}
