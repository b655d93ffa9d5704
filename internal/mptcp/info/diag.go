package info

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// sock_diag facts (linux/inet_diag.h, linux/mptcp.h).
const (
	sockDiagByFamily  = 20
	diagMsgSize       = 72 // struct inet_diag_msg
	diagReqSize       = 56 // struct inet_diag_req_v2
	diagInfo          = 2  // INET_DIAG_INFO
	diagMemInfo       = 7  // INET_DIAG_SKMEMINFO
	diagULPInfo       = 19 // INET_DIAG_ULP_INFO
	diagReqProtocol   = 3  // INET_DIAG_REQ_PROTOCOL
	ulpInfoName       = 1  // INET_ULP_INFO_NAME
	ulpInfoMPTCP      = 3  // INET_ULP_INFO_MPTCP
	sfAttrTokenLoc    = 2  // MPTCP_SUBFLOW_ATTR_TOKEN_LOC
	sfAttrFlags       = 8  // MPTCP_SUBFLOW_ATTR_FLAGS
	sfAttrIDRem       = 9  // MPTCP_SUBFLOW_ATTR_ID_REM
	sfAttrIDLoc       = 10 // MPTCP_SUBFLOW_ATTR_ID_LOC
	tcpListen         = 10
	allButListenState = ^uint32(1 << tcpListen)
)

// Options say which namespace to dump.
type Options struct {
	NetNS int // file descriptor of a network namespace; 0 is the caller's
}

// diagSock is one socket of a dump.
type diagSock struct {
	state        uint8
	local        netip.AddrPort
	remote       netip.AddrPort
	inode        uint32
	info         []byte // INET_DIAG_INFO: mptcp_info or tcp_info
	mem          MemInfo
	ulpMPTCP     bool   // the socket is an MPTCP subflow (INET_ULP_INFO_NAME "mptcp")
	token        uint32 // the MPTCP connection's local token (subflows)
	flags        SubflowFlags
	locID, remID uint8
}

func attrs(b []byte) ([][2][]byte, error) {
	var out [][2][]byte // {type (2 bytes), data}
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, fmt.Errorf("%w: %d trailing attribute bytes", ErrMalformed, len(b))
		}
		l := int(binary.NativeEndian.Uint16(b))
		if l < 4 || l > len(b) {
			return nil, fmt.Errorf("%w: attribute length %d of %d", ErrMalformed, l, len(b))
		}
		out = append(out, [2][]byte{b[2:4], b[4:l]})
		b = b[min((l+3)&^3, len(b)):]
	}
	return out, nil
}

func attrType(a [2][]byte) uint16 { return binary.NativeEndian.Uint16(a[0]) & 0x3fff }

// parseDiag reads one inet_diag_msg with its attributes.
func parseDiag(b []byte) (diagSock, error) {
	if len(b) < diagMsgSize {
		return diagSock{}, fmt.Errorf("%w: inet_diag_msg of %d bytes", ErrMalformed, len(b))
	}
	var s diagSock
	family := b[0]
	s.state = b[1]
	sport, dport := binary.BigEndian.Uint16(b[4:]), binary.BigEndian.Uint16(b[6:])
	switch family {
	case unix.AF_INET:
		s.local = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[8:12])), sport)
		s.remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[24:28])), dport)
	case unix.AF_INET6:
		s.local = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), sport)
		s.remote = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[24:40])).Unmap(), dport)
	default:
		return diagSock{}, fmt.Errorf("%w: socket family %d", ErrMalformed, family)
	}
	s.inode = binary.NativeEndian.Uint32(b[68:])
	as, err := attrs(b[diagMsgSize:])
	if err != nil {
		return diagSock{}, err
	}
	for _, a := range as {
		switch attrType(a) {
		case diagInfo:
			s.info = a[1]
		case diagMemInfo:
			m, err := decodeMemInfo(a[1])
			if err != nil {
				return diagSock{}, err
			}
			s.mem = m
		case diagULPInfo:
			ulp, err := attrs(a[1])
			if err != nil {
				return diagSock{}, err
			}
			for _, u := range ulp {
				switch attrType(u) {
				case ulpInfoName:
					name := u[1]
					if n := len(name); n > 0 && name[n-1] == 0 {
						name = name[:n-1]
					}
					s.ulpMPTCP = string(name) == "mptcp"
				case ulpInfoMPTCP:
					sf, err := attrs(u[1])
					if err != nil {
						return diagSock{}, err
					}
					for _, f := range sf {
						d := f[1]
						switch attrType(f) {
						case sfAttrTokenLoc, sfAttrFlags:
							if len(d) != 4 {
								return diagSock{}, fmt.Errorf("%w: subflow attribute of %d bytes", ErrMalformed, len(d))
							}
							if attrType(f) == sfAttrTokenLoc {
								s.token = binary.NativeEndian.Uint32(d)
							} else {
								s.flags = SubflowFlags(binary.NativeEndian.Uint32(d))
							}
						case sfAttrIDRem, sfAttrIDLoc:
							if len(d) != 1 {
								return diagSock{}, fmt.Errorf("%w: subflow id of %d bytes", ErrMalformed, len(d))
							}
							if attrType(f) == sfAttrIDRem {
								s.remID = d[0]
							} else {
								s.locID = d[0]
							}
						}
					}
				}
			}
		}
	}
	return s, nil
}

// diagRequest is an inet_diag_req_v2 for the sockets of family and protocol in the given states
// (a bit per TCP state), asking for INET_DIAG_INFO and, with mem, INET_DIAG_SKMEMINFO.
func diagRequest(family uint8, protocol uint32, states uint32, mem bool) []byte {
	b := make([]byte, diagReqSize, diagReqSize+8)
	b[0] = family
	b[1] = uint8(protocol) // 262 does not fit: the attribute below carries the real one
	b[2] = 1 << (diagInfo - 1)
	if mem {
		b[2] |= 1 << (diagMemInfo - 1)
	}
	binary.NativeEndian.PutUint32(b[4:], states)
	b = binary.NativeEndian.AppendUint16(b, 8)
	b = binary.NativeEndian.AppendUint16(b, diagReqProtocol)
	return binary.NativeEndian.AppendUint32(b, protocol)
}

// ErrNoDiag is returned when the kernel cannot dump MPTCP sockets (no mptcp_diag).
var ErrNoDiag = errors.New("info: the kernel cannot dump MPTCP sockets (CONFIG_INET_MPTCP_DIAG missing?)")

func dump(c *netlink.Conn, family uint8, protocol uint32, states uint32, mem bool) ([]diagSock, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request | netlink.Dump},
		Data:   diagRequest(family, protocol, states, mem),
	})
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
			return nil, ErrNoDiag
		}
		return nil, fmt.Errorf("info: sock_diag dump: %w", err)
	}
	out := make([]diagSock, 0, len(msgs))
	for _, m := range msgs {
		s, err := parseDiag(m.Data)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Diag is an open sock_diag socket, for daemons that dump repeatedly.
type Diag struct {
	c *netlink.Conn
}

// OpenDiag opens a sock_diag socket in the namespace o names (or, with NetNS 0, the namespace
// of the calling thread).
func OpenDiag(o Options) (*Diag, error) {
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: o.NetNS})
	if err != nil {
		return nil, fmt.Errorf("info: open sock_diag socket: %w", err)
	}
	return &Diag{c: c}, nil
}

// Close closes the socket.
func (d *Diag) Close() error { return d.c.Close() }

// Dump lists every MPTCP connection of the namespace with its subflows, from sock_diag: each
// connection's mptcp_info, and each subflow's addresses, tcp_info and MPTCP flags. Matching
// subflows to connections needs the subflows' MPTCP details, which the kernel gives only with
// CAP_NET_ADMIN; without it Dump says so.
func (d *Diag) Dump() ([]Conn, error) {
	var msks, tcps []diagSock
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		// Memory only for the connections: the subflows' is not used.
		m, err := dump(d.c, fam, unix.IPPROTO_MPTCP, allButListenState, true)
		if err != nil {
			return nil, err
		}
		msks = append(msks, m...)
		t, err := dump(d.c, fam, unix.IPPROTO_TCP, allButListenState, false)
		if err != nil {
			return nil, err
		}
		tcps = append(tcps, t...)
	}
	conns := group(msks, tcps)
	if len(conns) > 0 && len(tcps) > 0 {
		anyULP := false
		for _, t := range tcps {
			anyULP = anyULP || t.ulpMPTCP
		}
		if !anyULP && os.Geteuid() != 0 {
			return conns, fmt.Errorf("info: subflow details need CAP_NET_ADMIN: %w", syscall.EPERM)
		}
	}
	return conns, nil
}

// Listeners returns the local addresses of the namespace's listening MPTCP sockets.
func (d *Diag) Listeners() ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := dump(d.c, fam, unix.IPPROTO_MPTCP, 1<<tcpListen, false)
		if err != nil {
			return nil, err
		}
		for _, s := range socks {
			out = append(out, s.local)
		}
	}
	return out, nil
}

// Dump opens a sock_diag socket, dumps the namespace's MPTCP connections and closes it.
func Dump(o Options) ([]Conn, error) {
	d, err := OpenDiag(o)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Dump()
}

// group joins subflows to their connections by the local token.
func group(msks, tcps []diagSock) []Conn {
	conns := make([]Conn, 0, len(msks))
	byToken := map[uint32]int{}
	for _, m := range msks {
		ci := DecodeConnInfo(m.info)
		byToken[ci.Token] = len(conns)
		conns = append(conns, Conn{Info: ci, Local: m.local, Remote: m.remote, State: m.state, Inode: m.inode, Mem: m.mem})
	}
	for _, t := range tcps {
		if !t.ulpMPTCP {
			continue
		}
		i, ok := byToken[t.token]
		if !ok {
			continue
		}
		conns[i].Subflows = append(conns[i].Subflows, Subflow{Local: t.local, Remote: t.remote,
			TCP: DecodeTCPInfo(t.info), Flags: t.flags, LocID: t.locID, RemID: t.remID})
	}
	return conns
}

// MemInfo is a socket's memory accounting (INET_DIAG_SKMEMINFO, the kernel's sk_meminfo), in
// bytes. For an MPTCP connection, SendBuffer is the connection-level send buffer (the sum of
// its subflows' buffers) and WriteQueued what it holds: everything written and not yet
// acknowledged at the data level, which includes the data sent on fast subflows behind a
// chunk still in flight on a slow one.
type MemInfo struct {
	Known         bool   `json:"-"` // the kernel sent the attribute
	ReceiveAlloc  uint32 `json:"rmem_alloc"`
	ReceiveBuffer uint32 `json:"rcvbuf"`
	SendBuffer    uint32 `json:"sndbuf"`
	WriteQueued   uint32 `json:"wmem_queued"`
}

// decodeMemInfo reads sk_meminfo: u32 RMEM_ALLOC, RCVBUF, WMEM_ALLOC, SNDBUF, FWD_ALLOC,
// WMEM_QUEUED, ... (kernels add fields at the end).
func decodeMemInfo(b []byte) (MemInfo, error) {
	if len(b) < 24 {
		return MemInfo{}, fmt.Errorf("%w: sk_meminfo of %d bytes", ErrMalformed, len(b))
	}
	u := func(i int) uint32 { return binary.NativeEndian.Uint32(b[4*i:]) }
	return MemInfo{Known: true, ReceiveAlloc: u(0), ReceiveBuffer: u(1), SendBuffer: u(3), WriteQueued: u(5)}, nil
}
