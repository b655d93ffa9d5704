package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// soOriginalDst is SO_ORIGINAL_DST (IPv4) and IP6T_SO_ORIGINAL_DST (IPv6): the destination a
// connection had before a REDIRECT rewrote it.
const soOriginalDst = 80

// originalDst returns the pre-NAT destination of a REDIRECTed connection.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local := addrPortOf(c.LocalAddr())
	var out netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		var buf [28]byte // sockaddr_in6, the larger of the two
		size := uint32(len(buf))
		level := unix.SOL_IP
		if !local.Addr().Unmap().Is4() {
			level = unix.SOL_IPV6
		}
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), soOriginalDst,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if e != 0 {
			serr = fmt.Errorf("SO_ORIGINAL_DST: %w", e)
			return
		}
		port := binary.BigEndian.Uint16(buf[2:4])
		switch binary.NativeEndian.Uint16(buf[0:2]) {
		case unix.AF_INET:
			out = netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[4:8])), port)
		case unix.AF_INET6:
			out = netip.AddrPortFrom(netip.AddrFrom16([16]byte(buf[8:24])).Unmap(), port)
		default:
			serr = errors.New("SO_ORIGINAL_DST: unknown address family")
		}
	})
	if err == nil {
		err = serr
	}
	return out, err
}

// transparent sets IP_TRANSPARENT (IPv4) or IPV6_TRANSPARENT (IPv6) on a socket before it is
// bound: a listener then accepts TPROXYed connections for any address, and an outgoing socket
// may bind a foreign source address.
func transparent(network string) func(string, string, syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			if network == "tcp6" {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			}
			if serr != nil {
				serr = fmt.Errorf("set IP_TRANSPARENT: %w (needs CAP_NET_ADMIN)", serr)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// alive reports whether a pooled connection is still open: nothing to read (EAGAIN) is alive;
// end of stream or an error (a peer that went away or refused us) is not. Data waiting is
// alive too: the caller reads it.
func alive(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		ok = n > 0 || errors.Is(err, unix.EAGAIN)
		return true // never wait
	})
	return ok
}

// reset closes c with an RST instead of a FIN (SO_LINGER 0), so that the other end sees the
// failure as such.
func reset(c *net.TCPConn) {
	if c == nil {
		return
	}
	c.SetLinger(0)
	c.Close()
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// mptcpCongestion is the congestion control of the proxies' MPTCP connections (every subflow
// inherits it), whatever the host's default. On the federation paper's links (wired 40 Mbit/s
// at 120 ms RTT and LTE 10 Mbit/s at 160 ms, drop-tail queues of one bandwidth-delay product)
// the host default here, bbr, ran two uncoupled subflows per link (fullmesh's cross pairs)
// with 14-17 % of the bytes retransmitted and every queue full (RTT 240 and 318 ms); the
// subflows' send buffers grew to 1-2 MB of data not yet sent, which the receiver then waited
// for: one download got 36 Mbit/s with 250 ms samples at zero, and a cut of the wired uplink
// stranded about 6 MB (2.5 s without progress). With cubic the same download got 45-50
// Mbit/s, more than the wired path alone (docs/proxy.md, "Unequal paths").
const mptcpCongestion = "cubic"

// mptcpKeepAlive is the keepalive of the proxies' MPTCP connections, which the kernel applies
// to every subflow. It is what tells the receiving end that a subflow is gone: after a cut of
// an uplink the sending proxy closes its dead subflows (failover.go), but its FIN or RST is
// lost on the cut path, and the receiving proxy, which sends nothing on the subflow, kept it
// for good. With the client side (the one whose path manager joins) the receiver, no new
// subflow was made over the path when it came back: on the federation paper's links the
// wired uplink carried nothing 4 s after its restore. An idle subflow now sends a probe every
// second; once the path is back the far end answers it with a reset (or its pending FIN),
// the subflow closes, and the path manager joins again. Five unanswered probes close it too.
var mptcpKeepAlive = net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 5}

// The receive buffer of the proxies' MPTCP sockets. Linux's MPTCP receiver moves data from a
// subflow into the connection only while the connection's receive memory is under its buffer;
// data that arrived ahead of a gap counts against it. A connection starts with tcp_rmem's
// default (128 KB) and grows it only as the application reads in order. On paths of unequal
// delay the faster subflows filled those 128 KB with data ahead of the gap while the data of
// the gap sat in the slower subflow's own queue, which was then never moved in (measured on
// Linux 6.18, bench/cellular case A: a new connection's subflow holding 868 KB, the
// connection 131 KB ahead of it, the proxy reading nothing; the connection-level
// retransmissions of the gap went to the same subflow's queue: no progress for 10 s, and the
// client's connection was given up; a 2 MiB upload of `braid lab demo` on a new pooled
// connection that stalled for 10 s in CI fits the same cause, though it was not sampled).
// So every MPTCP socket of the proxies gets, from the start, the largest buffer the
// kernel's autotuning would give it (tcp_rmem's maximum), through SO_RCVBUFFORCE (the proxy
// has CAP_NET_ADMIN for its interception). It is a limit, not an allocation; it does turn
// the autotuning off, which would only have grown it that far. Without the capability the
// kernel's default stays (and the proxy says so when it starts). Probed once, on first use.
var mptcpRcvBuf = sync.OnceValues(func() (int, error) {
	limit, err := tcpRmemMax()
	if err != nil {
		return 0, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_TCP)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, limit/2); err != nil {
		return 0, fmt.Errorf("SO_RCVBUFFORCE: %w", err)
	}
	return limit, nil
})

// tcpRmemMax is the third field of net.ipv4.tcp_rmem (of the proxy's network namespace).
func tcpRmemMax() (int, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0, fmt.Errorf("net.ipv4.tcp_rmem: %q is not three numbers", strings.TrimSpace(string(b)))
	}
	v, err := strconv.Atoi(f[2])
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("net.ipv4.tcp_rmem: bad maximum %q", f[2])
	}
	return v, nil
}

// mptcpControl sets the options of the proxies' MPTCP sockets before they connect or listen
// (accepted connections inherit a listener's): the congestion control and the receive buffer.
// A kernel without the algorithm keeps its default, and a proxy without the capability the
// default buffer: the options are improvements, not requirements.
func mptcpControl(_, _ string, rc syscall.RawConn) error {
	return rc.Control(func(fd uintptr) {
		unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, mptcpCongestion)
		if size, err := mptcpRcvBuf(); err == nil {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size/2)
		}
	})
}
