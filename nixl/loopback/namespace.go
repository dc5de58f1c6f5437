package loopback

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvxfer/kvxfer/nixl"
)

// The namespace. Every loopback agent of one user keeps its segments in
//
//	<root>/kvxfer-<euid>/nixl-<random>/m<N>       (mode 0600, created O_EXCL)
//	<root>/kvxfer-<euid>/nixl-<random>/notif.sock
//
// where <root> is Options.Dir (default /dev/shm, else the temp directory),
// kvxfer-<euid> is a 0700 directory owned by the user, and nixl-<random> is an
// agent's own 0700 directory. LoadPeer maps a peer's file only when its name
// has exactly that shape under this agent's own namespace and the file, opened
// component by component with O_NOFOLLOW, is what an agent creates: a regular
// file owned by us, mode 0600, one link, at least as large as the metadata
// says. So a peer's metadata can name only segments a loopback agent created;
// an ordinary file, a symlink, a file of another owner or mode is refused and
// never opened for writing.
const (
	nsPrefix    = "kvxfer-"
	agentPrefix = "nixl-"
	sockName    = "notif.sock"
	segMode     = 0o600
	dirMode     = 0o700
)

// namespace returns (creating it if needed) the user's namespace directory
// under root, after checking that it is a real directory owned by us, 0700.
func namespace(root string) (string, error) {
	if !filepath.IsAbs(root) {
		abs, err := filepath.Abs(root)
		if err != nil {
			return "", nixl.Errorf(nixl.ErrBackend, "loopback: namespace root %q: %v", root, err)
		}
		root = abs
	}
	ns := filepath.Join(root, nsPrefix+strconv.Itoa(os.Geteuid()))
	if err := os.Mkdir(ns, dirMode); err == nil {
		// Created here: make the mode exact whatever the umask.
		if err := os.Chmod(ns, dirMode); err != nil {
			return "", nixl.Errorf(nixl.ErrBackend, "loopback: chmod %s: %v", ns, err)
		}
	} else if !errors.Is(err, os.ErrExist) {
		return "", nixl.Errorf(nixl.ErrBackend, "loopback: namespace %s: %v", ns, err)
	}
	fd, err := syscall.Open(ns, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", nixl.Errorf(nixl.ErrBackend, "loopback: namespace %s is not a directory of ours: %v", ns, err)
	}
	defer syscall.Close(fd)
	if err := checkDirFd(fd, ns); err != nil {
		return "", nixl.Errorf(nixl.ErrBackend, "loopback: namespace %v (remove it, or choose another Options.Dir)", err)
	}
	return ns, nil
}

// checkDirFd requires a directory owned by us with mode exactly 0700.
func checkDirFd(fd int, name string) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: fstat: %v", name, err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFDIR:
		return fmt.Errorf("%s is not a directory", name)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s is owned by uid %d, not %d", name, st.Uid, os.Geteuid())
	case st.Mode&0o7777 != dirMode:
		return fmt.Errorf("%s has mode %#o, want %#o", name, st.Mode&0o7777, dirMode)
	}
	return nil
}

// segName reports whether base is a segment name an agent creates: m<digits>.
func segName(base string) bool {
	if len(base) < 2 || base[0] != 'm' || len(base) > 21 {
		return false
	}
	for _, c := range base[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// agentDirName reports whether base is an agent directory name (nixl-<random>,
// as os.MkdirTemp makes it: digits only).
func agentDirName(base string) bool {
	rest, ok := strings.CutPrefix(base, agentPrefix)
	if !ok || rest == "" || len(rest) > 32 {
		return false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// peerDir checks the names in a peer's metadata and returns the peer's agent
// directory (base name only). The socket and every file must be directly in one
// agent directory directly under ns, named as an agent names them, in clean
// absolute form; own is this agent's directory, which a peer may not name.
func peerDir(ns, own string, md *metadata) (string, error) {
	inNS := func(p, what string) (string, string, error) {
		switch {
		case !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0):
			return "", "", nixl.Errorf(nixl.ErrInvalid, "%s %q is not a clean absolute path", what, p)
		}
		dir, base := filepath.Split(p)
		dir = filepath.Clean(dir)
		if filepath.Dir(dir) != ns || !agentDirName(filepath.Base(dir)) {
			return "", "", nixl.Errorf(nixl.ErrInvalid, "%s %q is outside the loopback namespace %s/%s*", what, p, ns, agentPrefix)
		}
		if dir == own {
			return "", "", nixl.Errorf(nixl.ErrInvalid, "%s %q is this agent's own memory", what, p)
		}
		return filepath.Base(dir), base, nil
	}
	ad, base, err := inNS(md.Socket, "socket")
	if err != nil {
		return "", err
	}
	if base != sockName {
		return "", nixl.Errorf(nixl.ErrInvalid, "socket %q is not an agent's %s", md.Socket, sockName)
	}
	for _, f := range md.Files {
		d, base, err := inNS(f.Path, "segment")
		if err != nil {
			return "", err
		}
		if d != ad || !segName(base) {
			return "", nixl.Errorf(nixl.ErrInvalid, "segment %q is not a segment of agent directory %s", f.Path, ad)
		}
	}
	return ad, nil
}

// openPeerDir opens ns/agentDir without following symlinks and checks it; a
// missing directory is a peer that went away (ErrRemoteDisconnect).
func openPeerDir(ns, agentDir string) (int, error) {
	nfd, err := syscall.Open(ns, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, nixl.Errorf(nixl.ErrBackend, "loopback: open namespace %s: %v", ns, err)
	}
	defer syscall.Close(nfd)
	if err := checkDirFd(nfd, ns); err != nil {
		return -1, nixl.Errorf(nixl.ErrBackend, "loopback: namespace %v", err)
	}
	dfd, err := syscall.Openat(nfd, agentDir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return -1, nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback: peer directory %s/%s: %v", ns, agentDir, err)
		}
		return -1, nixl.Errorf(nixl.ErrInvalid, "loopback: peer directory %s/%s: %v", ns, agentDir, err)
	}
	if err := checkDirFd(dfd, filepath.Join(ns, agentDir)); err != nil {
		syscall.Close(dfd)
		return -1, nixl.Errorf(nixl.ErrInvalid, "loopback: peer directory %v", err)
	}
	return dfd, nil
}

// openPeerSeg opens segment name in the directory dfd read-write without
// following a symlink (O_NONBLOCK: a FIFO never blocks the open) and checks
// that it is what an agent creates. The caller closes the file.
func openPeerSeg(dfd int, dir, name string, minSize uint64) (*os.File, uint64, error) {
	path := filepath.Join(dir, name)
	fd, err := syscall.Openat(dfd, name, syscall.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, 0, nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback: open peer segment %s: %v", path, err)
		}
		return nil, 0, nixl.Errorf(nixl.ErrInvalid, "loopback: open peer segment %s: %v", path, err)
	}
	f, st, why, err := statOwned(fd, path, func(st *syscall.Stat_t) string {
		switch {
		case st.Mode&0o7777 != segMode:
			return fmt.Sprintf("mode %#o, want %#o", st.Mode&0o7777, segMode)
		case st.Size <= 0 || uint64(st.Size) < minSize:
			return fmt.Sprintf("%d bytes, metadata says %d", st.Size, minSize)
		}
		return ""
	})
	if err != nil {
		return nil, 0, nixl.Errorf(nixl.ErrBackend, "loopback: fstat %s: %v", path, err)
	}
	if why != "" {
		return nil, 0, nixl.Errorf(nixl.ErrInvalid, "loopback: peer segment %s is not a loopback segment: %s", path, why)
	}
	return f, uint64(st.Size), nil
}

// statOwned wraps fd and checks what every file kvxferd maps must be: a
// regular file of this user with one link, then extra. On a failed check the
// file is closed and why says what was wrong.
func statOwned(fd int, path string, extra func(*syscall.Stat_t) string) (*os.File, *syscall.Stat_t, string, error) {
	f := os.NewFile(uintptr(fd), path)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, nil, "", err
	}
	var why string
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		why = fmt.Sprintf("not a regular file (mode %#o)", st.Mode)
	case int(st.Uid) != os.Geteuid():
		why = fmt.Sprintf("owned by uid %d, not %d", st.Uid, os.Geteuid())
	case st.Nlink != 1:
		why = fmt.Sprintf("%d links, want 1", st.Nlink)
	default:
		why = extra(&st)
	}
	if why != "" {
		f.Close()
		return nil, nil, why, nil
	}
	return f, &st, "", nil
}

// OpenAttachable opens a shared-memory file that another local process (the
// prefill scheduler) created, for mapping read-write shared, and checks it:
// an absolute clean path whose last component is not a symlink (O_NOFOLLOW), a
// regular file owned by this user, writable by no one else (no group or other
// write bit, no set-id bits), one link, not empty. It returns the open file and
// its size. The scheduler is trusted to name its own memory; these checks keep
// a mistake or a swapped file from making kvxferd write somewhere else.
func OpenAttachable(path string) (*os.File, int64, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || strings.ContainsRune(path, 0) {
		return nil, 0, nixl.Errorf(nixl.ErrInvalid, "attach %q: not a clean absolute path", path)
	}
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, nixl.Errorf(nixl.ErrInvalid, "attach %s: %v", path, err)
	}
	f, st, why, err := statOwned(fd, path, func(st *syscall.Stat_t) string {
		switch {
		case st.Mode&0o7022 != 0:
			return fmt.Sprintf("mode %#o is writable by others or set-id", st.Mode&0o7777)
		case st.Size <= 0:
			return "empty file"
		}
		return ""
	})
	if err != nil {
		return nil, 0, nixl.Errorf(nixl.ErrBackend, "attach %s: fstat: %v", path, err)
	}
	if why != "" {
		return nil, 0, nixl.Errorf(nixl.ErrInvalid, "attach %s: %s", path, why)
	}
	return f, st.Size, nil
}
