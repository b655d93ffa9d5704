package xtr

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"

	"braid/internal/sock"
	"braid/internal/wire/lisp"

	"golang.org/x/sys/unix"
)

// txSockets is how many sending sockets each uplink has, each bound to its own ephemeral port:
// the flow hash picks one, so that the underlay's ECMP sees as many outer source ports.
const txSockets = 8

// Uplink is one local RLOC and its sockets: Control (UDP 4342, bound to the RLOC and its
// interface) for the control plane, Data (UDP 4341) to receive encapsulated packets, and
// txSockets UDP sockets on ephemeral ports through which encapsulated packets leave, several
// segments per system call (UDP GSO), each flow on the socket of its hash.
type Uplink struct {
	Addr      netip.Addr
	Interface string
	Control   *net.UDPConn
	Data      *net.UDPConn
	tx        []*txSocket
}

// OpenUplink opens the sockets of RLOC addr in the calling thread's network namespace. With a
// non-empty iface, packets leave through that interface whatever the routing table prefers
// (SO_BINDTODEVICE), which is what makes each RLOC a distinct path.
func OpenUplink(addr netip.Addr, iface string) (*Uplink, error) {
	u := &Uplink{Addr: addr, Interface: iface}
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
	u.Data.SetReadBuffer(sock.BufferSize)
	if raw, err := u.Data.SyscallConn(); err == nil {
		// UDP GRO: datagrams that arrive back to back from one source come in one read.
		raw.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) })
	}
	for range txSockets {
		c, err := sock.Listen(netip.AddrPortFrom(addr, 0), iface)
		if err != nil {
			u.Close()
			return nil, fmt.Errorf("xtr: sending socket on %v: %w", addr, err)
		}
		// Nothing is sent to these ports: a receive buffer of one page is enough.
		c.SetReadBuffer(4096)
		t, err := newTxSocket(c.UDPConn, addr.Is6())
		if err != nil {
			c.Close()
			u.Close()
			return nil, fmt.Errorf("xtr: sending socket on %v: %w", addr, err)
		}
		u.tx = append(u.tx, t)
	}
	return u, nil
}

// Close closes the sockets; idempotent.
func (u *Uplink) Close() error {
	if u.Control != nil {
		u.Control.Close()
	}
	if u.Data != nil {
		u.Data.Close()
	}
	for _, t := range u.tx {
		t.conn.Close()
	}
	return nil
}

// errNoSocket: the uplink has no sending socket (tests build uplinks without them).
var errNoSocket = errors.New("xtr: uplink without a sending socket")

// txSocket sends trains of equal-sized datagrams in one sendmsg with UDP_SEGMENT, without
// allocating: the message header, its control messages and the destination live here. The ITR
// loop and the control loop (held packets) may send at once: mu orders them.
type txSocket struct {
	mu    sync.Mutex
	conn  *net.UDPConn
	raw   syscall.RawConn
	v6    bool
	hdr   unix.Msghdr
	iovs  [maxBatch]unix.Iovec
	oob   [64]byte
	sa    unix.RawSockaddrInet6 // large enough for either family
	err   error
	send  func(fd uintptr) bool // the method value, made once
	noGSO bool
}

func newTxSocket(c *net.UDPConn, v6 bool) (*txSocket, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var serr error
	raw.Control(func(fd uintptr) {
		// No DF, as on the raw socket before: a datagram bigger than the path is fragmented
		// (RFC 9300 section 7.1, stateless), not dropped.
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DONT)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
		}
	})
	if serr != nil {
		return nil, serr
	}
	t := &txSocket{conn: c, raw: raw, v6: v6}
	t.send = t.sendFD
	return t, nil
}

// sendSegments sends the datagrams dgs, each seg bytes but the last, which may be shorter, to
// dst with outer TTL (hop limit) ttl, in one system call. It never blocks: a full buffer is an
// error (the caller counts the drops).
func (t *txSocket) sendSegments(dgs [][]byte, seg int, dst netip.AddrPort, ttl uint8) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.noGSO || len(dgs) == 1 {
		err := t.sendLocked(dgs, seg, dst, ttl)
		if len(dgs) == 1 || (err != unix.EIO && err != unix.EINVAL && err != unix.EOPNOTSUPP) {
			return err
		}
		// EINVAL: datagrams bigger than the path's MTU, which the kernel does not segment
		// (they go one by one, fragmented); EIO, EOPNOTSUPP: a device or kernel without UDP
		// segmentation, one by one from now on.
		if err != unix.EINVAL {
			t.noGSO = true
		}
	}
	var first error
	for i := range dgs {
		if err := t.sendLocked(dgs[i:i+1], 0, dst, ttl); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (t *txSocket) sendLocked(dgs [][]byte, seg int, dst netip.AddrPort, ttl uint8) error {
	t.hdr = unix.Msghdr{}
	for i, d := range dgs {
		t.iovs[i].Base = unsafe.SliceData(d)
		t.iovs[i].SetLen(len(d))
	}
	t.hdr.Iov = &t.iovs[0]
	t.hdr.SetIovlen(len(dgs))
	if a := dst.Addr(); a.Is4() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&t.sa))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], dst.Port())
		t.hdr.Name = (*byte)(unsafe.Pointer(sa))
		t.hdr.Namelen = unix.SizeofSockaddrInet4
	} else {
		t.sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&t.sa.Port))[:], dst.Port())
		t.hdr.Name = (*byte)(unsafe.Pointer(&t.sa))
		t.hdr.Namelen = unix.SizeofSockaddrInet6
	}
	// Control messages: the outer TTL (copied from the inner packet, RFC 9300 section 5.3),
	// and the segment size when there is more than one datagram.
	clear(t.oob[:])
	h := (*unix.Cmsghdr)(unsafe.Pointer(&t.oob[0]))
	if t.v6 {
		h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_HOPLIMIT
	} else {
		h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TTL
	}
	h.SetLen(unix.CmsgLen(4))
	binary.NativeEndian.PutUint32(t.oob[unix.CmsgLen(0):], uint32(ttl))
	n := unix.CmsgSpace(4)
	if len(dgs) > 1 {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&t.oob[n]))
		h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		binary.NativeEndian.PutUint16(t.oob[n+unix.CmsgLen(0):], uint16(seg))
		n += unix.CmsgSpace(2)
	}
	t.hdr.Control = &t.oob[0]
	t.hdr.SetControllen(n)
	t.err = nil
	if err := t.raw.Write(t.send); err != nil {
		return err
	}
	return t.err
}

func (t *txSocket) sendFD(fd uintptr) bool {
	_, _, e := unix.Syscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&t.hdr)), unix.MSG_DONTWAIT)
	if e != 0 {
		t.err = e
	}
	return true // never wait for the poller: the caller drops instead
}

// rxBatch is how many reads one recvmmsg makes; rxBufSize holds a coalesced (GRO) read.
const (
	rxBatch   = 16
	rxBufSize = 65536
)

// rxSocket reads the data socket rxBatch datagrams (or GRO trains) per system call, without
// allocating. One goroutine reads at a time.
type rxSocket struct {
	raw  syscall.RawConn
	msgs [rxBatch]unix.Mmsghdr
	iovs [rxBatch]unix.Iovec
	sas  [rxBatch]unix.RawSockaddrInet6
	oobs [rxBatch][64]byte
	bufs [rxBatch][]byte
	n    int
	err  error
	recv func(fd uintptr) bool
}

func newRxSocket(c *net.UDPConn) (*rxSocket, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &rxSocket{raw: raw}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, rxBufSize)
	}
	r.recv = r.recvFD
	return r, nil
}

// read waits for datagrams and returns how many messages it read.
func (r *rxSocket) read() (int, error) {
	for i := range r.msgs {
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(len(r.bufs[i]))
		r.msgs[i] = unix.Mmsghdr{Hdr: unix.Msghdr{Name: (*byte)(unsafe.Pointer(&r.sas[i])), Namelen: unix.SizeofSockaddrInet6,
			Iov: &r.iovs[i], Iovlen: 1, Control: &r.oobs[i][0]}}
		r.msgs[i].Hdr.SetControllen(len(r.oobs[i]))
	}
	r.n, r.err = 0, nil
	if err := r.raw.Read(r.recv); err != nil {
		return 0, err
	}
	return r.n, r.err
}

func (r *rxSocket) recvFD(fd uintptr) bool {
	n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.msgs[0])), rxBatch, unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	if e != 0 {
		r.err = e
		return true
	}
	r.n = int(n)
	return true
}

// message returns message i of the last read: its bytes, the size of each datagram in them
// (UDP GRO), and its source address.
func (r *rxSocket) message(i int) (b []byte, seg int, from netip.Addr) {
	m := &r.msgs[i]
	b = r.bufs[i][:m.Len]
	seg = len(b)
	oob := r.oobs[i][:m.Hdr.Controllen]
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			break
		}
		if h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(2) {
			if v := int(binary.NativeEndian.Uint16(oob[unix.CmsgLen(0):])); v > 0 {
				seg = v
			}
		}
		oob = oob[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(oob)):]
	}
	switch r.sas[i].Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.sas[i]))
		from = netip.AddrFrom4(sa.Addr)
	case unix.AF_INET6:
		from = netip.AddrFrom16(r.sas[i].Addr).Unmap()
	}
	return b, seg, from
}
