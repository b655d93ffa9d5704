package config

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// Default status and metrics addresses, one port per role so that every role can run on one
// machine with its defaults (docs/ARCHITECTURE.md, Operations, lists them).
const (
	DefaultTunnelMetrics    = "127.0.0.1:9473"
	DefaultMapserverMetrics = "127.0.0.1:9474"
	DefaultPMMetrics        = "127.0.0.1:9475"
	DefaultLBMetrics        = "127.0.0.1:9476"
	DefaultXTRMetrics       = "127.0.0.1:9477"
	DefaultProxyMetrics     = "127.0.0.1:9478"
)

// Default control sockets. A name that starts with "@" is a Linux abstract unix socket: it
// lives in the network namespace, not in the file system, so a tunnel in each namespace of one
// machine has its own, 'braid status' run in a namespace finds the one there, and nothing is
// left behind when the role dies. The roles check the peer's credentials, since an abstract
// socket has no file mode.
const (
	DefaultTunnelControl = "@braid/tunnel"
	DefaultLBControl     = "@braid/lb"

	DefaultMapserverControl = "@braid/mapserver"
	DefaultXTRControl       = "@braid/xtr"
	DefaultPMControl        = "@braid/pm"
)

// controlProblem says what is wrong with a control socket name, or "" when it is usable: an
// absolute path, or "@" and a name for an abstract socket.
func controlProblem(s string) string {
	switch {
	case s == "":
	case s == "@":
		return fmt.Sprintf("control %q: an abstract socket needs a name after the @", s)
	case !strings.HasPrefix(s, "@") && !filepath.IsAbs(s):
		return fmt.Sprintf("control %q: want an absolute path, or @NAME for an abstract socket of the network namespace", s)
	case len(s) > maxSunPath || strings.ContainsRune(s, 0):
		return fmt.Sprintf("control %q: a unix socket name has at most %d bytes and no NUL", s, maxSunPath)
	}
	return ""
}

// KeyFileWarnings returns a warning for each of files (key files) that others than its owner
// may read or write (any group or world permission bit), or that cannot be examined: a key
// that others can read is no longer secret. The role logs them at start; they are no error,
// since some deployments share a key file with a group on purpose.
func KeyFileWarnings(files ...string) []string {
	var out []string
	for _, f := range files {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("key file %s: %v", f, err))
		case fi.Mode().Perm()&0o077 != 0:
			out = append(out, fmt.Sprintf("key file %s has mode %04o: others than its owner may read it; chmod 600 %s", f, fi.Mode().Perm(), f))
		}
	}
	return out
}

// MetricsWarning returns a warning when the metrics address addr (host:port) listens beyond
// this machine: on all addresses, a name, or an address that is not loopback. The metrics and
// status pages name peers, addresses and counters and take no credentials; "" when addr is
// loopback (or empty: no metrics).
func MetricsWarning(addr string) string {
	if addr == "" {
		return ""
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("metrics address %q: %v", addr, err)
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Unmap().IsLoopback() {
		return ""
	}
	if host == "localhost" {
		return ""
	}
	return fmt.Sprintf("metrics address %s is not loopback: anyone who reaches it reads the role's status and counters without credentials; firewall it or use 127.0.0.1", addr)
}
