package lisp

import (
	"encoding/binary"
	"net/netip"
)

// Flags of the ECM's first word.
const (
	ECMSecurity = 0x08000000 // S: LISP-SEC authentication data follows
	ECMDDT      = 0x04000000 // D: DDT-originated
	ECMToETR    = 0x02000000 // E
	ECMToMS     = 0x01000000 // M
	ecmFlagMask = 0x0fffffff
)

// ECMHeaderLen is the length of the ECM's own header, in front of the inner IP packet.
const ECMHeaderLen = 4

// ECM is an Encapsulated Control Message (RFC 9301 §5.8): a 4-byte LISP header, then an IPv4 or
// IPv6 header and a UDP header (IPUDP), then the control message itself (a Map-Request):
//
//	|Type=8 |S|D|E|M|            Reserved                           |
//	|  inner IPv4 or IPv6 header (no options or extension headers)  |
//	|  inner UDP header                                             |
//	|  LISP control message                                         |
type ECM struct {
	Flags uint32
	Inner IPUDP
}

// Len is the length of the headers in front of the control message.
func (e *ECM) Len() int { return ECMHeaderLen + e.Inner.Len() }

// Decode overwrites e with the ECM at the start of b and returns the offset of the control
// message; the message is b[n:n+e.Inner.PayloadLen].
func (e *ECM) Decode(b []byte) (int, error) {
	*e = ECM{}
	if len(b) < ECMHeaderLen {
		return 0, ErrTruncated
	}
	w := binary.BigEndian.Uint32(b)
	if w>>28 != TypeECM {
		return 0, ErrType
	}
	var d ECM
	n, err := d.Inner.Decode(b[ECMHeaderLen:])
	if err != nil {
		return 0, err
	}
	d.Flags = w & ecmFlagMask
	*e = d
	return ECMHeaderLen + n, nil
}

// Encode writes the ECM headers into b, in front of the control message already at
// b[e.Len():], whose length is e.Inner.PayloadLen; it returns e.Len(), or 0 if b is too short.
// The inner checksums are computed.
func (e *ECM) Encode(b []byte) int {
	n := e.Len()
	if len(b) < n+int(e.Inner.PayloadLen) {
		return 0
	}
	binary.BigEndian.PutUint32(b, uint32(TypeECM)<<28|e.Flags&ecmFlagMask)
	if e.Inner.Encode(b[ECMHeaderLen:]) == 0 {
		return 0
	}
	return n
}

// IPUDP is an IPv4 or IPv6 header without options or extension headers followed by a UDP
// header: the inner headers of an ECM (and whole packets built by tests and tools).
type IPUDP struct {
	Src, Dst   netip.AddrPort // both IPv4 or both IPv6
	TTL        uint8          // IPv4 TTL or IPv6 hop limit
	TOS        uint8          // IPv4 TOS or IPv6 traffic class
	ID         uint16         // IPv4 identification
	DF         bool           // IPv4 don't-fragment
	NoChecksum bool           // IPv4 only: send a zero UDP checksum
	PayloadLen uint16         // bytes after the UDP header
}

// Lengths of the headers.
const (
	IPv4UDPLen = 28
	IPv6UDPLen = 48
)

// Len is the length of the headers: 28 for IPv4, 48 for IPv6.
func (h *IPUDP) Len() int {
	if h.Src.Addr().Is4() {
		return IPv4UDPLen
	}
	return IPv6UDPLen
}

// Decode overwrites h with the headers at the start of b and returns their length; the payload
// is b[n:n+h.PayloadLen]. It checks versions, lengths and that the protocol is UDP (ErrInner or
// ErrTruncated), not the checksums. Bytes after the IP packet's length are not part of it.
func (h *IPUDP) Decode(b []byte) (int, error) {
	*h = IPUDP{}
	if len(b) < 1 {
		return 0, ErrTruncated
	}
	var d IPUDP
	var ipEnd, n int
	switch b[0] >> 4 {
	case 4:
		if len(b) < IPv4UDPLen {
			return 0, ErrTruncated
		}
		if b[0]&0x0f != 5 || b[9] != 17 || binary.BigEndian.Uint16(b[6:])&0x3fff != 0 {
			return 0, ErrInner // options, not UDP, or a fragment
		}
		ipEnd = int(binary.BigEndian.Uint16(b[2:]))
		d.TOS, d.ID, d.DF, d.TTL = b[1], binary.BigEndian.Uint16(b[4:]), b[6]&0x40 != 0, b[8]
		d.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[12:16])), binary.BigEndian.Uint16(b[20:]))
		d.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[16:20])), binary.BigEndian.Uint16(b[22:]))
		d.NoChecksum = binary.BigEndian.Uint16(b[26:]) == 0
		n = IPv4UDPLen
	case 6:
		if len(b) < IPv6UDPLen {
			return 0, ErrTruncated
		}
		if b[6] != 17 {
			return 0, ErrInner
		}
		ipEnd = 40 + int(binary.BigEndian.Uint16(b[4:]))
		d.TOS, d.TTL = uint8(binary.BigEndian.Uint16(b)>>4), b[7]
		d.Src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), binary.BigEndian.Uint16(b[40:]))
		d.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[24:40])), binary.BigEndian.Uint16(b[42:]))
		n = IPv6UDPLen
	default:
		return 0, ErrInner
	}
	udpLen := int(binary.BigEndian.Uint16(b[n-4:]))
	if ipEnd < n || udpLen < 8 || n-8+udpLen != ipEnd {
		return 0, ErrLength
	}
	if len(b) < ipEnd {
		return 0, ErrTruncated
	}
	d.PayloadLen = uint16(udpLen - 8)
	*h = d
	return n, nil
}

// Encode writes the headers into b, in front of the payload already at b[h.Len():], computing
// the IPv4 header checksum and the UDP checksum; it returns h.Len(), or 0 if b is shorter than
// the headers and the payload, or the addresses are not both IPv4 or both IPv6.
func (h *IPUDP) Encode(b []byte) int {
	n := h.Len()
	src, dst := h.Src.Addr(), h.Dst.Addr()
	if len(b) < n+int(h.PayloadLen) || src.Is4() != dst.Is4() || !src.IsValid() || !dst.IsValid() || src.Is4In6() || dst.Is4In6() {
		return 0
	}
	total := n + int(h.PayloadLen)
	if total > 0xffff+40 || (src.Is4() && total > 0xffff) {
		return 0
	}
	udpLen := uint16(8 + int(h.PayloadLen))
	if src.Is4() {
		b[0], b[1] = 0x45, h.TOS
		binary.BigEndian.PutUint16(b[2:], uint16(total))
		binary.BigEndian.PutUint16(b[4:], h.ID)
		b[6], b[7] = 0, 0
		if h.DF {
			b[6] = 0x40
		}
		b[8], b[9] = h.TTL, 17
		b[10], b[11] = 0, 0
		putIP(b[12:], src)
		putIP(b[16:], dst)
		binary.BigEndian.PutUint16(b[10:], ^fold(sum(b[:20], 0)))
	} else {
		binary.BigEndian.PutUint32(b, 6<<28|uint32(h.TOS)<<20)
		binary.BigEndian.PutUint16(b[4:], udpLen)
		b[6], b[7] = 17, h.TTL
		putIP(b[8:], src)
		putIP(b[24:], dst)
	}
	u := b[n-8:]
	binary.BigEndian.PutUint16(u, h.Src.Port())
	binary.BigEndian.PutUint16(u[2:], h.Dst.Port())
	binary.BigEndian.PutUint16(u[4:], udpLen)
	u[6], u[7] = 0, 0
	if src.Is4() && h.NoChecksum {
		return n
	}
	// Pseudo-header: addresses, protocol, UDP length.
	var s uint32
	if src.Is4() {
		s = sum(b[12:20], 0)
	} else {
		s = sum(b[8:40], 0)
	}
	s += 17 + uint32(udpLen)
	c := ^fold(sum(u[:udpLen], s))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
	return n
}

// sum adds b as big-endian 16-bit words to s (ones' complement sum before folding).
func sum(b []byte, s uint32) uint32 {
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}
