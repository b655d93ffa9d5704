// Package pkt reads and edits inner IP packets in place: today, clamping the TCP maximum
// segment size of SYN packets so that TCP through the tunnel never needs fragmentation.
//
//	IPv4 (RFC 791)                         IPv6 (RFC 8200)
//	+----+----+-------+--------+           +----+--------+-----------+------+------+
//	|4|IHL|TOS| total length   |           |6|TC| flow   | payload   | next | hop  |
//	| id      |flags| fragment |           |    label    | length    | hdr  | limit|
//	| TTL|proto| header cksum  |           | source address (16) | dest. address (16)|
//	| source (4) | dest. (4)   |           +----------------------------------------+
//	+--------------------------+
//	TCP (RFC 9293): ports (4) | seq (4) | ack (4) | offset, flags (2) | window (2) |
//	                checksum (2) | urgent (2) | options ... ; MSS option: kind 2, len 4, value
package pkt

import "encoding/binary"

const protoTCP = 6

// ClampMSS lowers the MSS option of a TCP SYN (or SYN-ACK) in pkt to max if it is larger,
// updating the TCP checksum incrementally (RFC 1624), and reports whether it changed pkt.
// Anything else (not TCP, not a SYN, a fragment, IPv6 extension headers, malformed lengths) is
// left alone.
func ClampMSS(pkt []byte, max uint16) bool {
	if len(pkt) < 1 {
		return false
	}
	var tcp []byte
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return false
		}
		ihl := int(pkt[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(pkt[2:]))
		frag := binary.BigEndian.Uint16(pkt[6:]) & 0x1fff
		if pkt[9] != protoTCP || ihl < 20 || total > len(pkt) || total < ihl || frag != 0 {
			return false
		}
		tcp = pkt[ihl:total]
	case 6:
		if len(pkt) < 40 || pkt[6] != protoTCP {
			return false
		}
		payload := int(binary.BigEndian.Uint16(pkt[4:]))
		if 40+payload > len(pkt) {
			return false
		}
		tcp = pkt[40 : 40+payload]
	default:
		return false
	}
	if len(tcp) < 20 || tcp[13]&0x02 == 0 { // SYN
		return false
	}
	off := int(tcp[12]>>4) * 4
	if off < 20 || off > len(tcp) {
		return false
	}
	opts := tcp[20:off]
	for i := 0; i < len(opts); {
		switch kind := opts[i]; kind {
		case 0: // end of options
			return false
		case 1: // no-op
			i++
			continue
		}
		if i+1 >= len(opts) {
			return false
		}
		l := int(opts[i+1])
		if l < 2 || i+l > len(opts) {
			return false
		}
		if opts[i] == 2 && l == 4 {
			old := binary.BigEndian.Uint16(opts[i+2:])
			if old <= max {
				return false
			}
			binary.BigEndian.PutUint16(opts[i+2:], max)
			sum := binary.BigEndian.Uint16(tcp[16:])
			binary.BigEndian.PutUint16(tcp[16:], adjust(sum, old, max))
			return true
		}
		i += l
	}
	return false
}

// adjust returns checksum sum updated for one 16-bit word changing from old to new:
// HC' = ~(~HC + ~m + m') (RFC 1624, equation 3).
func adjust(sum, old, new uint16) uint16 {
	s := uint32(^sum) + uint32(^old) + uint32(new)
	s = s&0xffff + s>>16
	s = s&0xffff + s>>16
	return ^uint16(s)
}
