package config

import (
	"fmt"
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
