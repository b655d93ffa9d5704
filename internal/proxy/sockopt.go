package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
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
