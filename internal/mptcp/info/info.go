// Package info reads the kernel's view of MPTCP connections: MPTCP_INFO, MPTCP_TCPINFO,
// MPTCP_SUBFLOW_ADDRS and MPTCP_FULL_INFO on a socket the caller holds, and a sock_diag dump of
// every MPTCP connection of a network namespace with its subflows, for daemons that watch
// connections they do not own. Linux only.
//
// The structures are the kernel's (include/uapi/linux/mptcp.h, tcp.h), read at fixed offsets
// from a buffer; a shorter buffer from an older kernel leaves the missing fields zero:
//
//	mptcp_info (96 B):  0 subflows  1 add_addr_signal  2 add_addr_accepted  3 subflows_max
//	  4 add_addr_signal_max  5 add_addr_accepted_max  8 flags u32  12 token u32
//	  16 write_seq u64  24 snd_una u64  32 rcv_nxt u64  40 local_addr_used  41 local_addr_max
//	  42 csum_enabled  44 retransmits u32  48 bytes_retrans  56 bytes_sent  64 bytes_received
//	  72 bytes_acked (u64 each)  80 subflows_total  84 last_data_sent  88 last_data_recv
//	  92 last_ack_recv (u32 ms each)
//	tcp_info (280 B on 6.18): see decodeTCPInfo for the offsets used.
package info

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Sizes of the kernel structures this package asks for.
const (
	mptcpInfoSize   = 96
	tcpInfoSize     = 280
	subflowDataSize = 16
	addrsSize       = 256 // two sockaddr_storage
	sfInfoSize      = 264 // u32 id, pad, mptcp_subflow_addrs
	fullInfoSize    = 136
)

// ErrMalformed is returned for a structure the kernel could not have written.
var ErrMalformed = errors.New("info: malformed kernel structure")

// ErrFallback is returned when the connection has fallen back to plain TCP (the kernel then
// refuses MPTCP_INFO).
var ErrFallback = errors.New("info: the connection fell back to plain TCP")

// ErrNotMPTCP is returned for a socket that is not an MPTCP socket.
var ErrNotMPTCP = errors.New("info: not an MPTCP socket")

// ConnInfo is struct mptcp_info: the connection-level (MPTCP) state.
type ConnInfo struct {
	Subflows           uint8  `json:"subflows"` // additional subflows (not counting the first)
	AddAddrSignal      uint8  `json:"add_addr_signal"`
	AddAddrAccepted    uint8  `json:"add_addr_accepted"`
	SubflowsMax        uint8  `json:"subflows_max"`
	AddAddrSignalMax   uint8  `json:"add_addr_signal_max"`
	AddAddrAcceptedMax uint8  `json:"add_addr_accepted_max"`
	Flags              uint32 `json:"flags"`
	Token              uint32 `json:"token"`
	WriteSeq           uint64 `json:"write_seq"`
	SndUna             uint64 `json:"snd_una"`
	RcvNxt             uint64 `json:"rcv_nxt"`
	LocalAddrUsed      uint8  `json:"local_addr_used"`
	LocalAddrMax       uint8  `json:"local_addr_max"`
	CsumEnabled        bool   `json:"csum_enabled"`
	Retransmits        uint32 `json:"retransmits"`
	BytesRetrans       uint64 `json:"bytes_retrans"`
	BytesSent          uint64 `json:"bytes_sent"`
	BytesReceived      uint64 `json:"bytes_received"`
	BytesAcked         uint64 `json:"bytes_acked"`
	SubflowsTotal      uint8  `json:"subflows_total"`
	LastDataSent       uint32 `json:"last_data_sent_ms"`
	LastDataRecv       uint32 `json:"last_data_recv_ms"`
	LastAckRecv        uint32 `json:"last_ack_recv_ms"`
}

// Connection flags (mptcpi_flags).
const (
	FlagFallback          = 1 << 0
	FlagRemoteKeyReceived = 1 << 1
)

// padded returns b extended with zeros to n bytes (fields an older kernel did not write).
func padded(b []byte, n int) []byte {
	if len(b) >= n {
		return b[:n]
	}
	p := make([]byte, n)
	copy(p, b)
	return p
}

// DecodeConnInfo reads a struct mptcp_info.
func DecodeConnInfo(b []byte) ConnInfo {
	b = padded(b, mptcpInfoSize)
	le := binary.NativeEndian
	return ConnInfo{
		Subflows: b[0], AddAddrSignal: b[1], AddAddrAccepted: b[2], SubflowsMax: b[3],
		AddAddrSignalMax: b[4], AddAddrAcceptedMax: b[5],
		Flags: le.Uint32(b[8:]), Token: le.Uint32(b[12:]),
		WriteSeq: le.Uint64(b[16:]), SndUna: le.Uint64(b[24:]), RcvNxt: le.Uint64(b[32:]),
		LocalAddrUsed: b[40], LocalAddrMax: b[41], CsumEnabled: b[42] != 0,
		Retransmits: le.Uint32(b[44:]), BytesRetrans: le.Uint64(b[48:]), BytesSent: le.Uint64(b[56:]),
		BytesReceived: le.Uint64(b[64:]), BytesAcked: le.Uint64(b[72:]), SubflowsTotal: b[80],
		LastDataSent: le.Uint32(b[84:]), LastDataRecv: le.Uint32(b[88:]), LastAckRecv: le.Uint32(b[92:]),
	}
}

// TCPInfo is the part of struct tcp_info that describes a subflow's path.
type TCPInfo struct {
	State         uint8         `json:"state"`
	CAState       uint8         `json:"ca_state"`
	Retransmits   uint8         `json:"retransmits"`
	Backoff       uint8         `json:"backoff"`
	RTO           time.Duration `json:"rto_ns"`
	SndMSS        uint32        `json:"snd_mss"`
	Unacked       uint32        `json:"unacked"`
	Lost          uint32        `json:"lost"`
	LastDataSent  time.Duration `json:"last_data_sent_ns"`
	LastDataRecv  time.Duration `json:"last_data_recv_ns"`
	LastAckRecv   time.Duration `json:"last_ack_recv_ns"`
	RTT           time.Duration `json:"rtt_ns"`
	RTTVar        time.Duration `json:"rttvar_ns"`
	SndCwnd       uint32        `json:"snd_cwnd"`
	TotalRetrans  uint32        `json:"total_retrans"`
	PacingRate    uint64        `json:"pacing_rate"` // bytes/s
	BytesAcked    uint64        `json:"bytes_acked"`
	BytesReceived uint64        `json:"bytes_received"`
	NotsentBytes  uint32        `json:"notsent_bytes"`
	MinRTT        time.Duration `json:"min_rtt_ns"`
	DeliveryRate  uint64        `json:"delivery_rate"` // bytes/s
	RwndLimited   time.Duration `json:"rwnd_limited_ns"`
	SndbufLimited time.Duration `json:"sndbuf_limited_ns"`
	BytesSent     uint64        `json:"bytes_sent"`
	BytesRetrans  uint64        `json:"bytes_retrans"`
	SndWnd        uint32        `json:"snd_wnd"`
	RcvWnd        uint32        `json:"rcv_wnd"`
}

// DecodeTCPInfo reads a struct tcp_info (any prefix of it).
func DecodeTCPInfo(b []byte) TCPInfo {
	b = padded(b, tcpInfoSize)
	le := binary.NativeEndian
	us := func(off int) time.Duration { return time.Duration(le.Uint32(b[off:])) * time.Microsecond }
	ms := func(off int) time.Duration { return time.Duration(le.Uint32(b[off:])) * time.Millisecond }
	return TCPInfo{
		State: b[0], CAState: b[1], Retransmits: b[2], Backoff: b[4],
		RTO: us(8), SndMSS: le.Uint32(b[16:]), Unacked: le.Uint32(b[24:]), Lost: le.Uint32(b[32:]),
		LastDataSent: ms(44), LastDataRecv: ms(52), LastAckRecv: ms(56),
		RTT: us(68), RTTVar: us(72), SndCwnd: le.Uint32(b[80:]), TotalRetrans: le.Uint32(b[100:]),
		PacingRate: le.Uint64(b[104:]), BytesAcked: le.Uint64(b[120:]), BytesReceived: le.Uint64(b[128:]),
		NotsentBytes: le.Uint32(b[144:]), MinRTT: us(148), DeliveryRate: le.Uint64(b[160:]),
		RwndLimited:   time.Duration(le.Uint64(b[176:])) * time.Microsecond,
		SndbufLimited: time.Duration(le.Uint64(b[184:])) * time.Microsecond,
		BytesSent:     le.Uint64(b[200:]), BytesRetrans: le.Uint64(b[208:]),
		SndWnd: le.Uint32(b[228:]), RcvWnd: le.Uint32(b[232:]),
	}
}

// decodeSockaddr reads a sockaddr_in or sockaddr_in6 (family in host order, port and address
// in network order). An AF_UNSPEC (all-zero) address is the zero AddrPort.
func decodeSockaddr(b []byte) (netip.AddrPort, error) {
	if len(b) < 2 {
		return netip.AddrPort{}, fmt.Errorf("%w: sockaddr of %d bytes", ErrMalformed, len(b))
	}
	switch fam := binary.NativeEndian.Uint16(b); fam {
	case 0:
		return netip.AddrPort{}, nil
	case 2:
		if len(b) < 8 {
			return netip.AddrPort{}, fmt.Errorf("%w: sockaddr_in of %d bytes", ErrMalformed, len(b))
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:])), nil
	case 10:
		if len(b) < 24 {
			return netip.AddrPort{}, fmt.Errorf("%w: sockaddr_in6 of %d bytes", ErrMalformed, len(b))
		}
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), binary.BigEndian.Uint16(b[2:])), nil
	default:
		return netip.AddrPort{}, fmt.Errorf("%w: address family %d", ErrMalformed, fam)
	}
}

// encodeSockaddr writes a into a sockaddr_storage-sized buffer (tests and fuzz round trips).
func encodeSockaddr(b []byte, a netip.AddrPort) {
	clear(b)
	if !a.IsValid() {
		return
	}
	binary.BigEndian.PutUint16(b[2:], a.Port())
	if a.Addr().Is4() {
		binary.NativeEndian.PutUint16(b, 2)
		ip := a.Addr().As4()
		copy(b[4:], ip[:])
		return
	}
	binary.NativeEndian.PutUint16(b, 10)
	ip := a.Addr().As16()
	copy(b[8:], ip[:])
}

// AddrPair is one subflow's local and remote address.
type AddrPair struct {
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
}

// decodeAddrPair reads a struct mptcp_subflow_addrs (two sockaddr_storage).
func decodeAddrPair(b []byte) (AddrPair, error) {
	if len(b) < addrsSize {
		return AddrPair{}, fmt.Errorf("%w: subflow addresses of %d bytes", ErrMalformed, len(b))
	}
	l, err := decodeSockaddr(b[:128])
	if err != nil {
		return AddrPair{}, err
	}
	r, err := decodeSockaddr(b[128:256])
	if err != nil {
		return AddrPair{}, err
	}
	return AddrPair{Local: l, Remote: r}, nil
}

// Subflow is one subflow: its addresses and its TCP state. ID is the kernel's subflow number
// (MPTCP_FULL_INFO) and the diag fields are set by Dump only.
type Subflow struct {
	ID     uint32         `json:"id,omitempty"`
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	TCP    TCPInfo        `json:"tcp"`
	// From sock_diag (Dump): the subflow's MPTCP flags and address IDs.
	Flags SubflowFlags `json:"flags"`
	LocID uint8        `json:"loc_id"`
	RemID uint8        `json:"rem_id"`
}

// SubflowFlags are MPTCP_SUBFLOW_FLAG_* from sock_diag.
type SubflowFlags uint32

const (
	SubflowMPCapableRemote SubflowFlags = 1 << 0
	SubflowMPCapableLocal  SubflowFlags = 1 << 1
	SubflowJoinRemote      SubflowFlags = 1 << 2
	SubflowJoinLocal       SubflowFlags = 1 << 3
	SubflowBackupRemote    SubflowFlags = 1 << 4 // the peer asked for backup
	SubflowBackupLocal     SubflowFlags = 1 << 5 // we asked for backup
	SubflowFullyEstab      SubflowFlags = 1 << 6
	SubflowConnected       SubflowFlags = 1 << 7
	SubflowMapValid        SubflowFlags = 1 << 8
)

// Backup reports whether either end marked the subflow backup.
func (f SubflowFlags) Backup() bool { return f&(SubflowBackupLocal|SubflowBackupRemote) != 0 }

// Conn is one MPTCP connection.
type Conn struct {
	Info     ConnInfo       `json:"info"`
	Local    netip.AddrPort `json:"local"`
	Remote   netip.AddrPort `json:"remote"`
	State    uint8          `json:"state"` // TCP state number of the MPTCP socket
	Inode    uint32         `json:"inode,omitempty"`
	Mem      MemInfo        `json:"mem"`
	Subflows []Subflow      `json:"subflows"`
}

// SubflowBytes adds the subflows' TCP-level bytes: sent (including retransmissions) and acked.
func (c Conn) SubflowBytes() (sent, acked, received uint64) {
	for _, s := range c.Subflows {
		sent += s.TCP.BytesSent
		acked += s.TCP.BytesAcked
		received += s.TCP.BytesReceived
	}
	return
}
