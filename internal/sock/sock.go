// Package sock opens the tunnel's per-path UDP sockets: bound to the uplink's address (and
// interface), with large buffers, and written without ever blocking, so that a full or dead path
// can never stall the goroutine that feeds the others. It also opens the roles' and the lab's
// control sockets private from the start (ListenPrivate) and checks who connects (PeerAllowed).
package sock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrWouldBlock reports a datagram not sent because the socket's buffer is full; the caller
// counts it as a drop on that path.
var ErrWouldBlock = errors.New("sock: send buffer full")

// BufferSize is the send and receive buffer asked for each path socket: small buffers are where
// other multipath tunnels lose data (UdpRcvbufErrors).
const BufferSize = 8 << 20

// Conn is one path's UDP socket.
type Conn struct {
	*net.UDPConn
	raw   syscall.RawConn
	noGSO atomic.Bool // the kernel refused UDP_SEGMENT once
}

// Listen opens a UDP socket on local, bound to device when it is not empty.
func Listen(local netip.AddrPort, device string) (*Conn, error) {
	return listen(local, device, nil)
}

// listen opens the socket of Listen; extra, when set, sets more options before the bind.
func listen(local netip.AddrPort, device string, extra func(fd int) error) (*Conn, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if device != "" {
				if serr = unix.BindToDevice(int(fd), device); serr != nil {
					serr = fmt.Errorf("bind to interface %s: %w", device, serr)
					return
				}
			}
			// Set DF and never fragment, ignoring the kernel's path MTU cache: the tunnel finds
			// each path's MTU itself by probing (RFC 8899), also where ICMP is filtered.
			if local.Addr().Is4() || local.Addr().Is4In6() {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE)
				// A dual-stack socket also carries IPv4; a v6-only one refuses this, harmlessly.
				unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE)
			}
			if serr != nil {
				serr = fmt.Errorf("path MTU discovery mode: %w", serr)
				return
			}
			// Force past rmem_max/wmem_max where we may (root); otherwise take what is allowed.
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, BufferSize) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, BufferSize)
			}
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, BufferSize) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, BufferSize)
			}
			if extra != nil {
				serr = extra(int(fd))
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	network := "udp4"
	if local.Addr().Is6() && !local.Addr().Is4In6() {
		network = "udp6"
	}
	pc, err := lc.ListenPacket(context.Background(), network, local.String())
	if err != nil {
		return nil, fmt.Errorf("sock: %s: %w", local, err)
	}
	u := pc.(*net.UDPConn)
	raw, err := u.SyscallConn()
	if err != nil {
		u.Close()
		return nil, fmt.Errorf("sock: %w", err)
	}
	return &Conn{UDPConn: u, raw: raw}, nil
}

// Send writes one datagram to dst without blocking: a full buffer returns ErrWouldBlock at once.
func (c *Conn) Send(b []byte, dst netip.AddrPort) error {
	sa := sockaddr(dst)
	var serr error
	err := c.raw.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, unix.MSG_DONTWAIT, sa)
		return true // never wait for the poller: the caller drops instead
	})
	if err != nil {
		return err
	}
	if serr == unix.EAGAIN || serr == unix.ENOBUFS {
		return ErrWouldBlock
	}
	return serr
}

// Segmentation and coalescing of datagrams (UDP GSO and GRO, Linux 4.18 and 5.0).
const (
	solUDP     = 17  // SOL_UDP
	udpSegment = 103 // UDP_SEGMENT: the segment size of a send
	udpGRO     = 104 // UDP_GRO: coalesce received datagrams; their size comes in a control message

	// MaxSegments is the most datagrams one SendSegments call carries (the kernel's limit is
	// 64 up to Linux 6.8 and 128 after).
	MaxSegments = 64
)

// SendSegments sends the datagrams packed in b, each seg bytes but the last, which may be
// shorter, to dst in one system call (UDP GSO): the kernel splits b. Like Send it never
// blocks. If the kernel refuses segmentation (an old kernel, a device that cannot), the
// datagrams go one by one from then on.
func (c *Conn) SendSegments(b []byte, seg int, dst netip.AddrPort) error {
	if seg <= 0 || len(b) <= seg || c.noGSO.Load() {
		var first error
		for len(b) > 0 {
			n := len(b)
			if seg > 0 {
				n = min(seg, len(b))
			}
			if err := c.Send(b[:n], dst); err != nil && first == nil {
				first = err
			}
			b = b[n:]
		}
		return first
	}
	var oob [24]byte // CmsgSpace(2) on 64-bit
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = solUDP, udpSegment
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(seg))
	sa := sockaddr(dst)
	var serr error
	err := c.raw.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgN(int(fd), b, oob[:unix.CmsgSpace(2)], sa, unix.MSG_DONTWAIT)
		return true
	})
	if err != nil {
		return err
	}
	switch serr {
	case nil:
		return nil
	case unix.EAGAIN, unix.ENOBUFS:
		return ErrWouldBlock
	case unix.EIO, unix.EINVAL, unix.EOPNOTSUPP:
		c.noGSO.Store(true)
		return c.SendSegments(b, seg, dst)
	}
	return serr
}

// EnableGRO asks the kernel to coalesce datagrams that arrive back to back from one source
// (UDP GRO); ReadSegments then returns several per call. It reports whether the kernel agreed.
func (c *Conn) EnableGRO() bool {
	var serr error
	c.raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), solUDP, udpGRO, 1) })
	return serr == nil
}

// ReadSegments reads into b what arrived from one source: n bytes of datagrams of seg bytes
// each but the last, which may be shorter (seg is n for a single datagram). oob is scratch
// for the control message, at least 64 bytes.
func (c *Conn) ReadSegments(b, oob []byte) (n, seg int, src netip.AddrPort, err error) {
	n, oobn, _, src, err := c.ReadMsgUDPAddrPort(b, oob)
	if err != nil {
		return 0, 0, src, err
	}
	seg = n
	msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
	if perr == nil {
		for _, m := range msgs {
			if m.Header.Level == solUDP && m.Header.Type == udpGRO && len(m.Data) >= 2 {
				if v := int(binary.NativeEndian.Uint16(m.Data)); v > 0 {
					seg = v
				}
			}
		}
	}
	return n, seg, src, nil
}

func sockaddr(dst netip.AddrPort) unix.Sockaddr {
	if dst.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
}
