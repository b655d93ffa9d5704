package sock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ListenPrivate listens on a unix socket file at path that only its owner (root aside) can
// connect to, from the moment it exists there: the socket is bound in a fresh directory of
// mode 0700 beside path, made 0600 there, then renamed to path, so there is no moment at
// which path is a socket another user may connect to (a bind then chmod at path has one, and
// its mode would follow the umask). Whatever was at path is replaced. Closing the listener
// does not remove path.
func ListenPrivate(path string) (*net.UnixListener, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".sock-")
	if err != nil {
		return nil, fmt.Errorf("private socket %s: %w", path, err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o700); err != nil { // MkdirTemp's 0700 is already that; be sure
		return nil, fmt.Errorf("private socket %s: %w", path, err)
	}
	p := filepath.Join(tmp, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("private socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(p, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("private socket %s: %w", path, err)
	}
	if err := os.Rename(p, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("private socket %s: %w", path, err)
	}
	return ln, nil
}

// ErrPeerDenied reports a unix-socket peer that is neither root nor this process's user.
var ErrPeerDenied = errors.New("permission denied: the peer is neither root nor the daemon's user")

// PeerAllowed lets root and this process's effective user use a unix socket connection c (its
// SO_PEERCRED); an abstract socket has no file mode to keep others out, and a file's mode can
// be changed after the fact. Connections of other kinds are allowed.
func PeerAllowed(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", cerr)
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("%w (uid %d)", ErrPeerDenied, cred.Uid)
	}
	return nil
}
