// Package unixsock is mdag's authenticated local transport (issue 36): a
// Unix socket on which both ends check the other's uid with SO_PEERCRED,
// where a TCP loopback port is open to every local user (any of them may
// bind it first, or connect to it).
//
// Listen serves a socket only the server's own uid and root may use: its
// directory is the server's (or root's) and writable by no one else, the
// socket is mode 0600 from the moment its name appears, and every
// connection's peer is checked. Dial is the client's side, usable as
// gRPC's context dialer (grpc.WithContextDialer(unixsock.Dial)): it
// refuses a socket served by another uid than the client's own or root's,
// so a client never sends its data to a server another user started at
// the path.
//
// Linux only (SO_PEERCRED); the standard library and log/slog only.
package unixsock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// MaxPath is the longest socket path a Unix socket address holds: Linux's
// sun_path is 108 bytes, the path's terminating NUL included.
const MaxPath = 107

// Scheme is the address prefix of a Unix socket: unix:/PATH (or gRPC's
// unix:///PATH).
const Scheme = "unix:"

// IsTarget reports whether a gRPC target names a Unix socket (unix:PATH,
// or an abstract one, unix-abstract:NAME), which Dial connects to.
func IsTarget(target string) bool {
	return strings.HasPrefix(target, Scheme) || strings.HasPrefix(target, "unix-abstract:")
}

// Path returns the socket path of a unix: address (unix:/PATH, or
// unix:///PATH as gRPC writes it); ok is false for any other address.
// The path is returned as given: Listen wants it absolute.
func Path(addr string) (path string, ok bool) {
	p, ok := strings.CutPrefix(addr, Scheme)
	if !ok {
		return "", false
	}
	if strings.HasPrefix(p, "//") { // unix:///PATH
		p = p[2:]
	}
	return p, true
}

// Listen listens on a Unix socket at path for the server's own uid: the
// directory must be owned by this uid or root and writable by nobody else
// (it is created 0700 when absent; its parent must exist), the socket is
// made 0600 before its name appears (bound in a private 0700 directory
// beside it, then renamed into place), and every connection's peer
// credentials (SO_PEERCRED) are checked: a peer of another uid than the
// server's or root is closed at once and logged on log (nil: not logged).
// A stale socket at path (no server answers) is replaced; anything else
// there is an error, and so is a path too long for a socket address
// (MaxPath), the temporary one included. Closing the listener removes the
// socket.
func Listen(path string, log *slog.Logger) (net.Listener, error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	path = strings.TrimPrefix(path, "//") // unix:///PATH
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("socket path %q: want an absolute path (unix:/PATH)", path)
	}
	path = filepath.Clean(path)
	dir := filepath.Dir(path)
	if err := checkLength(path); err != nil {
		return nil, err
	}
	// the temporary name's length is fixed: the check holds for the one made
	if bound := filepath.Join(dir, tmpPrefix+strings.Repeat("X", tmpRandom), boundName); len(bound) > MaxPath {
		return nil, fmt.Errorf("socket path %s: the socket is bound at %s first, then renamed into place, and that path is %d bytes: a Unix socket path may have at most %d (sun_path, 108 bytes with its NUL): use a shorter directory",
			path, bound, len(bound), MaxPath)
	}
	real, err := socketDir(dir)
	if err != nil {
		return nil, err
	}
	// from here on the resolved directory: a symbolic link on the way
	// cannot be re-pointed between the check and the bind
	path = filepath.Join(real, filepath.Base(path))
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket (a %s): not replaced", path, fi.Mode().Type())
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another server is listening there", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) { // busy (a full backlog) is not stale
			return nil, fmt.Errorf("%s exists and did not answer (%v): not replaced; remove it if no server uses it", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing the stale socket %s: %w", path, err)
		}
	}
	tmp, err := mkdirTemp(real)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bound := filepath.Join(tmp, boundName)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(bound, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	if err := os.Rename(bound, path); err != nil {
		l.Close()
		return nil, err
	}
	return &peerListener{UnixListener: l, path: path, uid: os.Geteuid(), log: log.With("listen", Scheme+path)}, nil
}

// The temporary directory Listen binds in: .m and 8 hex digits, beside
// the socket; the socket in it is "s".
const (
	tmpPrefix = ".m"
	tmpRandom = 8
	boundName = "s"
)

// mkdirTemp makes a private (0700) directory of a fixed-length random name
// in dir (os.MkdirTemp's names vary in length).
func mkdirTemp(dir string) (string, error) {
	for range 100 {
		b := make([]byte, tmpRandom/2)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		d := filepath.Join(dir, tmpPrefix+hex.EncodeToString(b))
		err := os.Mkdir(d, 0o700)
		if err == nil {
			return d, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("socket directory: %w", err)
		}
	}
	return "", fmt.Errorf("socket directory %s: no free temporary name", dir)
}

// checkLength refuses a socket path longer than a socket address holds
// (the kernel's own error says only "invalid argument").
func checkLength(path string) error {
	if len(path) > MaxPath {
		return fmt.Errorf("socket path %s is %d bytes: a Unix socket path may have at most %d (sun_path, 108 bytes with its NUL): use a shorter path", path, len(path), MaxPath)
	}
	return nil
}

// socketDir makes sure dir may hold the server's socket and returns it
// with its symbolic links resolved: created 0700 when absent, else a
// directory owned by this uid or root that no group or other user may
// write (one who could would replace the socket with theirs, and clients
// would talk to them); and every directory above it owned by this uid or
// root, writable by others only with the sticky bit (as /tmp), so that
// no one else can swap a directory on the way.
func socketDir(dir string) (string, error) {
	_, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return "", fmt.Errorf("socket directory: %w", err)
		}
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("socket directory: %w", err)
	}
	fi, err := os.Lstat(real)
	if err != nil {
		return "", fmt.Errorf("socket directory: %w", err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("socket directory %s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || (int(st.Uid) != os.Geteuid() && st.Uid != 0) {
		return "", fmt.Errorf("socket directory %s is owned by another user: use a directory of uid %d or root's", dir, os.Geteuid())
	}
	if m := fi.Mode().Perm(); m&0o022 != 0 {
		return "", fmt.Errorf("socket directory %s is mode %#o: writable by group or others, who could replace the socket; use a directory only its owner may write (or a new one: it is created 0700)", dir, m)
	}
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return "", fmt.Errorf("socket directory %s: %w", dir, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case !ok || (int(st.Uid) != os.Geteuid() && st.Uid != 0):
			return "", fmt.Errorf("socket directory %s: %s above it is owned by uid %d, who could replace the directory: use a path whose directories are this user's (uid %d) or root's", dir, d, st.Uid, os.Geteuid())
		case fi.Mode().Perm()&0o002 != 0 && fi.Mode()&os.ModeSticky == 0:
			return "", fmt.Errorf("socket directory %s: %s above it is writable by every user without the sticky bit, who could replace the directory", dir, d)
		}
		if d == filepath.Dir(d) {
			return real, nil
		}
	}
}

// peerListener accepts only connections whose peer (SO_PEERCRED) is the
// server's uid or root.
type peerListener struct {
	*net.UnixListener
	path string
	uid  int
	log  *slog.Logger
}

// Accept returns the next allowed connection; refused ones are closed
// and logged.
func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		cred, err := peerCred(c)
		if err == nil {
			err = peerAllowed(cred, l.uid)
		}
		if err != nil {
			c.Close()
			l.log.Warn("refused a connection", "reason", err.Error())
			continue
		}
		return c, nil
	}
}

// Addr is the socket's path (not where it was bound before the rename).
func (l *peerListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close stops listening and removes the socket.
func (l *peerListener) Close() error {
	err := l.UnixListener.Close()
	if e := os.Remove(l.path); e != nil && !errors.Is(e, os.ErrNotExist) && err == nil {
		err = e
	}
	return err
}

// peerCred reads a Unix connection's peer credentials (as they were when
// the peer connected, or, for a client's connection, when the server
// listened).
func peerCred(c *net.UnixConn) (*syscall.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("peer credentials (SO_PEERCRED): %w", cerr)
	}
	return cred, nil
}

// peerAllowed lets the server's own uid and root in.
func peerAllowed(cred *syscall.Ucred, uid int) error {
	if int(cred.Uid) == uid || cred.Uid == 0 {
		return nil
	}
	return fmt.Errorf("peer pid %d uid %d: only uid %d (the server's) and root may use this socket", cred.Pid, cred.Uid, uid)
}

// Dial connects to the Unix socket addr names and checks who serves it:
// the server's uid (SO_PEERCRED, as it was when the server listened) must
// be this process's effective uid or root's, else the connection is
// closed and an error says whose it is. addr is unix:PATH, as gRPC hands
// a unix target to a context dialer (unix:///ABS for unix:/ABS and
// unix:///ABS targets, unix:REL for relative ones, unix:@NAME for
// unix-abstract:NAME), so Dial is usable as grpc.WithContextDialer(Dial).
func Dial(ctx context.Context, addr string) (net.Conn, error) {
	path, ok := Path(addr)
	if !ok || path == "" {
		return nil, fmt.Errorf("unixsock: %q is not a Unix socket address (unix:/PATH)", addr)
	}
	name := Scheme + path
	if !strings.HasPrefix(path, "@") { // an abstract name has no sun_path NUL
		if err := checkLength(path); err != nil {
			return nil, err
		}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	if err := serverAllowed(c.(*net.UnixConn), name, os.Geteuid()); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// serverAllowed checks a client's connection: its server (the peer) must
// be of uid, the client's, or root.
func serverAllowed(c *net.UnixConn, name string, uid int) error {
	cred, err := peerCred(c)
	if err != nil {
		return fmt.Errorf("%s: %w: cannot tell who serves it, refusing to talk to it", name, err)
	}
	return serverUID(cred, name, uid)
}

// serverUID lets a client talk to a server of its own uid or root's.
func serverUID(cred *syscall.Ucred, name string, uid int) error {
	if int(cred.Uid) == uid || cred.Uid == 0 {
		return nil
	}
	who := fmt.Sprintf("this user (uid %d) or root", uid)
	if uid == 0 {
		who = "root (this user)"
	}
	return fmt.Errorf("%s is served by uid %d (pid %d), not %s: refusing to talk to it", name, cred.Uid, cred.Pid, who)
}
