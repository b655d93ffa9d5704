package xtr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"braid/internal/wire/lisp"

	"golang.org/x/sys/unix"
)

// Uplink is one local RLOC and its sockets: Control (UDP 4342, bound to the RLOC and its
// interface) for the control plane, Data (UDP 4341) to receive encapsulated packets, and a raw
// socket through which encapsulated packets leave with outer headers built here, so that each
// flow gets its own outer source port.
type Uplink struct {
	Addr      netip.Addr
	Interface string
	Control   *net.UDPConn
	Data      *net.UDPConn
	raw       int
}

// OpenUplink opens the sockets of RLOC addr in the calling thread's network namespace. With a
// non-empty iface, packets leave through that interface whatever the routing table prefers
// (SO_BINDTODEVICE), which is what makes each RLOC a distinct path.
func OpenUplink(addr netip.Addr, iface string) (*Uplink, error) {
	u := &Uplink{Addr: addr, Interface: iface, raw: -1}
	bind := func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if iface != "" {
				serr = unix.BindToDevice(int(fd), iface)
			}
		})
		return errors.Join(err, serr)
	}
	lc := net.ListenConfig{Control: bind}
	network := "udp4"
	if addr.Is6() {
		network = "udp6"
	}
	pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(addr, lisp.ControlPort).String())
	if err != nil {
		return nil, fmt.Errorf("xtr: control socket on %v: %w", addr, err)
	}
	u.Control = pc.(*net.UDPConn)
	pc, err = lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(addr, lisp.DataPort).String())
	if err != nil {
		u.Close()
		return nil, fmt.Errorf("xtr: data socket on %v: %w", addr, err)
	}
	u.Data = pc.(*net.UDPConn)
	u.Data.SetReadBuffer(4 << 20)
	family := unix.AF_INET
	if addr.Is6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		u.Close()
		return nil, fmt.Errorf("xtr: raw socket for %v: %w", addr, err)
	}
	u.raw = fd
	if iface != "" {
		if err := unix.BindToDevice(fd, iface); err != nil {
			u.Close()
			return nil, fmt.Errorf("xtr: bind raw socket to %s: %w", iface, err)
		}
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
	return u, nil
}

// send sends the IP packet pkt (outer headers included) to dst through the raw socket.
func (u *Uplink) send(pkt []byte, dst netip.Addr) error {
	var sa unix.Sockaddr
	if dst.Is4() {
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: dst.As16()}
	}
	return unix.Sendto(u.raw, pkt, 0, sa)
}

// Close closes the sockets; idempotent.
func (u *Uplink) Close() error {
	if u.Control != nil {
		u.Control.Close()
	}
	if u.Data != nil {
		u.Data.Close()
	}
	if u.raw >= 0 {
		unix.Close(u.raw)
		u.raw = -1
	}
	return nil
}
