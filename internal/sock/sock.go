// Package sock opens the tunnel's per-path UDP sockets: bound to the uplink's address (and
// interface), with large buffers, and written without ever blocking, so that a full or dead path
// can never stall the goroutine that feeds the others.
package sock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

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
	raw syscall.RawConn
}

// Listen opens a UDP socket on local, bound to device when it is not empty.
func Listen(local netip.AddrPort, device string) (*Conn, error) {
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
	var sa unix.Sockaddr
	if dst.Addr().Is4() {
		sa4 := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
		sa = sa4
	} else {
		sa = &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
	}
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
