// Package vnet reads and writes the virtio-net header that a TUN device with IFF_VNET_HDR puts in
// front of every packet, splits the TCP super-packets such a device hands out (TSO) into
// packets that fit the tunnel, and joins consecutive TCP segments into one super-packet for
// the device to take (the tunnel's own GRO). Standard library only; nothing allocates.
//
// The header (struct virtio_net_hdr, 10 bytes, in the host's byte order, which braid supports
// on little-endian hosts only):
//
//	flags (1) | gso_type (1) | hdr_len (2) | gso_size (2) | csum_start (2) | csum_offset (2)
//
// flags: NEEDS_CSUM (1): the L4 checksum at csum_start+csum_offset holds only the
// pseudo-header sum and must be completed over [csum_start:]; DATA_VALID (2). gso_type: NONE
// (0), TCPV4 (1), UDP (3), TCPV6 (4), UDP_L4 (5), with ECN (0x80) or-ed in; gso_size is the
// payload of each segment.
package vnet

import (
	"encoding/binary"
	"errors"

	"braid/internal/wire/csum"
)

// HdrLen is the length of the header braid asks the device for (TUNSETVNETHDRSZ).
const HdrLen = 10

// Header flags and GSO types.
const (
	FlagNeedsCsum = 1
	FlagDataValid = 2

	GSONone  = 0
	GSOTCPv4 = 1
	GSOUDP   = 3
	GSOTCPv6 = 4
	GSOUDPL4 = 5
	GSOECN   = 0x80
)

// Errors of Decode, Segment and Coalescer.
var (
	ErrTruncated   = errors.New("vnet: truncated")
	ErrGSOType     = errors.New("vnet: GSO type not handled")
	ErrPacket      = errors.New("vnet: packet does not match its header")
	ErrTooMany     = errors.New("vnet: more segments than buffers")
	ErrBufferSmall = errors.New("vnet: a segment does not fit its buffer")
)

// Hdr is the virtio-net header.
type Hdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
}

// Decode reads h from b[:HdrLen] and returns HdrLen. Error: ErrTruncated.
func (h *Hdr) Decode(b []byte) (int, error) {
	*h = Hdr{}
	if len(b) < HdrLen {
		return 0, ErrTruncated
	}
	*h = Hdr{
		Flags: b[0], GSOType: b[1],
		HdrLen:     binary.LittleEndian.Uint16(b[2:]),
		GSOSize:    binary.LittleEndian.Uint16(b[4:]),
		CsumStart:  binary.LittleEndian.Uint16(b[6:]),
		CsumOffset: binary.LittleEndian.Uint16(b[8:]),
	}
	return HdrLen, nil
}

// Encode writes h into b[:HdrLen] and returns HdrLen, or 0 if b is shorter.
func (h *Hdr) Encode(b []byte) int {
	if len(b) < HdrLen {
		return 0
	}
	b[0], b[1] = h.Flags, h.GSOType
	binary.LittleEndian.PutUint16(b[2:], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:], h.CsumOffset)
	return HdrLen
}

const (
	protoTCP = 6

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
	tcpURG = 0x20
	tcpECE = 0x40
	tcpCWR = 0x80
)

// tcpHeaders finds the IP and TCP headers of pkt: their lengths and the IP version. It accepts
// IPv4 without fragmentation and IPv6 whose next header is TCP (no extension headers).
func tcpHeaders(pkt []byte) (ipLen, tcpLen int, v4 bool, ok bool) {
	if len(pkt) < 1 {
		return 0, 0, false, false
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return 0, 0, false, false
		}
		ipLen = int(pkt[0]&0x0f) * 4
		if ipLen < 20 || pkt[9] != protoTCP || binary.BigEndian.Uint16(pkt[6:])&0x3fff != 0 {
			return 0, 0, false, false
		}
		v4 = true
	case 6:
		if len(pkt) < 40 || pkt[6] != protoTCP {
			return 0, 0, false, false
		}
		ipLen = 40
	default:
		return 0, 0, false, false
	}
	if len(pkt) < ipLen+20 {
		return 0, 0, false, false
	}
	tcpLen = int(pkt[ipLen+12]>>4) * 4
	if tcpLen < 20 || len(pkt) < ipLen+tcpLen {
		return 0, 0, false, false
	}
	return ipLen, tcpLen, v4, true
}

// addrs returns the source and destination addresses of an IPv4 or IPv6 header.
func addrs(pkt []byte, v4 bool) (src, dst []byte) {
	if v4 {
		return pkt[12:16], pkt[16:20]
	}
	return pkt[8:24], pkt[24:40]
}

// Segment turns one packet read from the device, pkt with its header h, into packets that need
// no offload: copied to out[i][off:], lengths in sizes[i]; it returns how many. A packet
// without GSO is copied whole, its checksum completed if h says NEEDS_CSUM. A TCP super-packet
// (GSOTCPv4 or GSOTCPv6, with or without ECN) is split into segments of h.GSOSize payload
// bytes, each with its own IP length, IPv4 identification and header checksum, sequence number,
// flags (FIN and PSH only on the last, CWR only on the first) and full TCP checksum. Errors:
// ErrGSOType (UDP fragmentation offloads, which braid does not ask for), ErrPacket (headers
// that do not match, a segment size of 0), ErrTooMany, ErrBufferSmall.
func Segment(h Hdr, pkt []byte, out [][]byte, off int, sizes []int) (int, error) {
	if len(out) == 0 || len(sizes) < len(out) {
		return 0, ErrTooMany
	}
	switch h.GSOType &^ GSOECN {
	case GSONone:
		if len(out[0]) < off+len(pkt) {
			return 0, ErrBufferSmall
		}
		p := out[0][off : off+len(pkt)]
		copy(p, pkt)
		if h.Flags&FlagNeedsCsum != 0 {
			at := int(h.CsumStart) + int(h.CsumOffset)
			if int(h.CsumStart) >= len(p) || at+2 > len(p) {
				return 0, ErrPacket
			}
			binary.BigEndian.PutUint16(p[at:], ^csum.Sum(p[h.CsumStart:], 0))
		}
		sizes[0] = len(pkt)
		return 1, nil
	case GSOTCPv4, GSOTCPv6:
	default:
		return 0, ErrGSOType
	}
	ipLen, tcpLen, v4, ok := tcpHeaders(pkt)
	if !ok || v4 != (h.GSOType&^GSOECN == GSOTCPv4) || h.GSOSize == 0 {
		return 0, ErrPacket
	}
	hdrLen := ipLen + tcpLen
	payload := pkt[hdrLen:]
	gso := int(h.GSOSize)
	n := (len(payload) + gso - 1) / gso
	if n == 0 {
		n = 1 // headers alone: one packet
	}
	if n > len(out) {
		return 0, ErrTooMany
	}
	id := binary.BigEndian.Uint16(pkt[4:])
	seq := binary.BigEndian.Uint32(pkt[ipLen+4:])
	flags := pkt[ipLen+13]
	for i := range n {
		chunk := payload[min(i*gso, len(payload)):min((i+1)*gso, len(payload))]
		size := hdrLen + len(chunk)
		if len(out[i]) < off+size {
			return 0, ErrBufferSmall
		}
		p := out[i][off : off+size]
		copy(p, pkt[:hdrLen])
		copy(p[hdrLen:], chunk)
		if v4 {
			binary.BigEndian.PutUint16(p[2:], uint16(size))
			binary.BigEndian.PutUint16(p[4:], id+uint16(i))
			binary.BigEndian.PutUint16(p[10:], 0)
			binary.BigEndian.PutUint16(p[10:], ^csum.Sum(p[:ipLen], 0))
		} else {
			binary.BigEndian.PutUint16(p[4:], uint16(size-ipLen))
		}
		tcp := p[ipLen:]
		binary.BigEndian.PutUint32(tcp[4:], seq+uint32(i*gso))
		f := flags
		if i < n-1 {
			f &^= tcpFIN | tcpPSH
		}
		if i > 0 {
			f &^= tcpCWR
		}
		tcp[13] = f
		src, dst := addrs(p, v4)
		binary.BigEndian.PutUint16(tcp[16:], 0)
		binary.BigEndian.PutUint16(tcp[16:], ^csum.Sum(tcp, csum.Pseudo(src, dst, protoTCP, len(tcp))))
		sizes[i] = size
	}
	return n, nil
}

// MaxSegments is the most segments a Coalescer joins into one super-packet (the kernel's GRO
// limit is 64 as well).
const MaxSegments = 64

// maxSuper is the largest super-packet: an IPv4 total length field's limit.
const maxSuper = 65535

// Coalescer joins consecutive TCP segments of one flow into a super-packet that a TUN device
// with offloads takes in one write (a receive-side GRO). Add a packet; when it cannot join the
// packet being built, Add first returns that one, finished, for the caller to write. Joinable
// segments: same addresses, ports, IP fields (IPv4 without options or fragmentation, IPv6
// without extension headers), TCP header length and options, acknowledgment and window; only
// ACK set (PSH too on the last); contiguous sequence numbers; every payload of the first one's
// size but the last, which may be shorter and ends the run; a correct TCP checksum (each is
// verified, so a damaged segment is never hidden inside a super-packet). Packets that cannot
// join anything pass through alone, unchanged, with a header of no GSO.
type Coalescer struct {
	buf  []byte // HdrLen bytes of header room, then the packet being built
	done []byte // the other half: the packet last returned, valid until the next call
	n    int    // bytes of packet in buf[HdrLen:]
	segs int    // segments in it; 0: empty
	h    Hdr
	// of the packet being built:
	ipLen, tcpLen, gso int
	v4, closed         bool // closed: the last segment was short (or had PSH): nothing may follow
	nextSeq            uint32
}

// CoalescerBuffer is the size of the buffer a Coalescer needs: two packets of HdrLen + 65535
// bytes (one being built, one returned).
const CoalescerBuffer = 2 * (HdrLen + maxSuper)

// NewCoalescer returns a coalescer that builds in buf, of at least CoalescerBuffer bytes.
func NewCoalescer(buf []byte) *Coalescer {
	if len(buf) < CoalescerBuffer {
		panic("vnet: coalescer buffer smaller than CoalescerBuffer")
	}
	half := HdrLen + maxSuper
	return &Coalescer{buf: buf[:half:half], done: buf[half : 2*half : 2*half]}
}

// Add offers the packet pkt. If the packet being built cannot take it, Add finishes that one
// and returns it (header included: write it to the device as it is) and starts over with pkt;
// otherwise it returns nil. The returned slice is valid until the next call.
func (c *Coalescer) Add(pkt []byte) []byte {
	if c.segs > 0 && c.join(pkt) {
		return nil
	}
	out := c.Flush()
	c.start(pkt)
	return out
}

// Flush finishes the packet being built and returns it (nil if there is none). The returned
// slice is valid until the next call.
func (c *Coalescer) Flush() []byte {
	if c.segs == 0 {
		return nil
	}
	p := c.buf[HdrLen : HdrLen+c.n]
	if c.segs > 1 {
		if c.v4 {
			binary.BigEndian.PutUint16(p[2:], uint16(c.n))
			binary.BigEndian.PutUint16(p[10:], 0)
			binary.BigEndian.PutUint16(p[10:], ^csum.Sum(p[:c.ipLen], 0))
		} else {
			binary.BigEndian.PutUint16(p[4:], uint16(c.n-c.ipLen))
		}
		// The device completes the checksum: the field holds the pseudo-header sum.
		src, dst := addrs(p, c.v4)
		binary.BigEndian.PutUint16(p[c.ipLen+16:], csum.Pseudo(src, dst, protoTCP, c.n-c.ipLen))
		c.h = Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv6, HdrLen: uint16(c.ipLen + c.tcpLen),
			GSOSize: uint16(c.gso), CsumStart: uint16(c.ipLen), CsumOffset: 16}
		if c.v4 {
			c.h.GSOType = GSOTCPv4
		}
	} else {
		c.h = Hdr{}
	}
	c.h.Encode(c.buf)
	c.segs = 0
	out := c.buf[:HdrLen+c.n]
	c.buf, c.done = c.done, c.buf
	return out
}

// start begins a new packet with pkt.
func (c *Coalescer) start(pkt []byte) {
	c.n = copy(c.buf[HdrLen:HdrLen+maxSuper], pkt)
	c.segs = 1
	c.closed = true // unless pkt can lead a run
	ipLen, tcpLen, v4, ok := tcpHeaders(pkt)
	if !ok || len(pkt) > maxSuper || !headersJoinable(pkt, ipLen, v4) {
		return
	}
	payload := len(pkt) - ipLen - tcpLen
	if payload == 0 || pkt[ipLen+13] != tcpACK || !tcpChecksumOK(pkt, ipLen, v4) {
		return
	}
	c.ipLen, c.tcpLen, c.v4, c.gso = ipLen, tcpLen, v4, payload
	c.nextSeq = binary.BigEndian.Uint32(pkt[ipLen+4:]) + uint32(payload)
	c.closed = false
}

// headersJoinable: the IP layer of pkt allows joining (and the length fields are consistent).
func headersJoinable(pkt []byte, ipLen int, v4 bool) bool {
	if v4 {
		return ipLen == 20 && int(binary.BigEndian.Uint16(pkt[2:])) == len(pkt)
	}
	return 40+int(binary.BigEndian.Uint16(pkt[4:])) == len(pkt)
}

func tcpChecksumOK(pkt []byte, ipLen int, v4 bool) bool {
	src, dst := addrs(pkt, v4)
	return csum.Sum(pkt[ipLen:], csum.Pseudo(src, dst, protoTCP, len(pkt)-ipLen)) == 0xffff
}

// join appends pkt to the packet being built if it continues it.
func (c *Coalescer) join(pkt []byte) bool {
	if c.closed || c.segs >= MaxSegments {
		return false
	}
	ipLen, tcpLen, v4, ok := tcpHeaders(pkt)
	hdr := ipLen + tcpLen
	if !ok || v4 != c.v4 || ipLen != c.ipLen || tcpLen != c.tcpLen || !headersJoinable(pkt, ipLen, v4) {
		return false
	}
	payload := len(pkt) - hdr
	if payload == 0 || payload > c.gso || c.n+payload > maxSuper {
		return false
	}
	first := c.buf[HdrLen : HdrLen+hdr]
	flags := pkt[ipLen+13]
	if flags&^tcpPSH != tcpACK || binary.BigEndian.Uint32(pkt[ipLen+4:]) != c.nextSeq {
		return false
	}
	if v4 {
		// Version, IHL, TOS, flags (DF), TTL, protocol and addresses match; the length,
		// identification and checksum differ.
		if first[0] != pkt[0] || first[1] != pkt[1] || first[6] != pkt[6] || first[8] != pkt[8] || first[9] != pkt[9] ||
			string(first[12:20]) != string(pkt[12:20]) {
			return false
		}
	} else if string(first[0:4]) != string(pkt[0:4]) || first[6] != pkt[6] || first[7] != pkt[7] || string(first[8:40]) != string(pkt[8:40]) {
		return false
	}
	// Ports, acknowledgment, header length, window, urgent pointer and options match; the
	// sequence number, flags (PSH) and checksum differ.
	t1, t2 := first[ipLen:], pkt[ipLen:]
	if string(t1[0:4]) != string(t2[0:4]) || string(t1[8:13]) != string(t2[8:13]) || string(t1[14:16]) != string(t2[14:16]) ||
		string(t1[18:tcpLen]) != string(t2[18:tcpLen]) {
		return false
	}
	if !tcpChecksumOK(pkt, ipLen, v4) {
		return false
	}
	copy(c.buf[HdrLen+c.n:], pkt[hdr:])
	c.n += payload
	c.segs++
	c.nextSeq += uint32(payload)
	if flags&tcpPSH != 0 {
		c.buf[HdrLen+ipLen+13] |= tcpPSH
		c.closed = true
	}
	if payload < c.gso {
		c.closed = true
	}
	return true
}
