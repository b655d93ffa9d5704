package sock

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Group is several UDP sockets bound to one address and port (SO_REUSEPORT), so that as many
// goroutines, on as many cores, receive what arrives there. The kernel hands each datagram
// to the socket a steering program picks from the datagram's first bytes: the tunnel's GRE
// key, which is the receiver's session index (docs/tunnel.md, "A hub on every core"), modulo
// the number of sockets. The sender of a session thus always lands on one socket, and the
// tunnel, which chooses its indices, chooses which. Datagrams too short to carry a key go to
// the first socket.
//
// Sends go by the first socket; Close closes them all.
type Group struct {
	*Conn
	socks []*Conn
}

// SteerOffset is where the steering program reads the 32-bit key in a datagram's payload:
// behind the 4 bytes of a GRE header's flags and protocol.
const SteerOffset = 4

// steering is the classic BPF program of a group of n sockets: the big-endian 32-bit word
// at SteerOffset, modulo n (a load past the datagram's end returns 0: the first socket).
func steering(n int) ([]unix.SockFilter, error) {
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: SteerOffset, Size: 4},
		bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)},
		bpf.RetA{},
	})
	if err != nil {
		return nil, err
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return f, nil
}

// ListenGroup opens n sockets on local (bound to device when it is not empty) in one
// SO_REUSEPORT group with the steering program. n = 1 is one plain socket in a group of one.
func ListenGroup(local netip.AddrPort, device string, n int) (*Group, error) {
	if n < 1 || n > 1024 {
		return nil, fmt.Errorf("sock: %d sockets in a group, want 1..1024", n)
	}
	prog, err := steering(n)
	if err != nil {
		return nil, fmt.Errorf("sock: steering program: %w", err)
	}
	g := &Group{}
	for i := range n {
		c, err := listen(local, device, func(fd int) error {
			if n == 1 {
				return nil
			}
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
				return fmt.Errorf("SO_REUSEPORT: %w", err)
			}
			return nil
		})
		if err != nil {
			g.Close()
			return nil, err
		}
		if i == 0 && n > 1 {
			// The group's program, attached to its first socket once bound.
			fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
			var serr error
			if err := c.raw.Control(func(fd uintptr) {
				serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fp)
			}); err != nil || serr != nil {
				c.UDPConn.Close()
				return nil, fmt.Errorf("sock: %s: SO_ATTACH_REUSEPORT_CBPF: %w", local, errors.Join(err, serr))
			}
		}
		if i == 0 {
			g.Conn = c
			// Every member binds to the first one's port (local may ask for any port).
			local = netip.AddrPortFrom(local.Addr(), c.LocalAddr().(*net.UDPAddr).AddrPort().Port())
		}
		g.socks = append(g.socks, c)
	}
	return g, nil
}

// Shards is the number of sockets of the group.
func (g *Group) Shards() int { return len(g.socks) }

// ReadShard reads as ReadSegments does, from the group's socket i.
func (g *Group) ReadShard(i int, b, oob []byte) (n, seg int, src netip.AddrPort, err error) {
	return g.socks[i].ReadSegments(b, oob)
}

// EnableGRO asks every socket of the group to coalesce datagrams (Conn.EnableGRO); it reports
// whether the kernel agreed for all.
func (g *Group) EnableGRO() bool {
	ok := true
	for _, c := range g.socks {
		ok = c.EnableGRO() && ok
	}
	return ok
}

// Close closes every socket of the group.
func (g *Group) Close() error {
	var errs []error
	for _, c := range g.socks {
		errs = append(errs, c.UDPConn.Close())
	}
	return errors.Join(errs...)
}
