package gre

import (
	"encoding/binary"
	"math/bits"
)

// Checksum is the Internet checksum (RFC 1071) of b: the ones' complement of the ones'
// complement sum of b's 16-bit big-endian words, an odd last byte padded with a zero byte.
// RFC 2784 computes it over the GRE header, with the Checksum field zero, and the payload.
//
// The sum of a buffer that includes a correct checksum is 0xFFFF, so Checksum of such a buffer
// is 0.
func Checksum(b []byte) uint16 {
	// 2^16 ≡ 1 (mod 2^16-1), and 2^16-1 divides 2^64-1: a ones' complement sum of 64-bit words,
	// folded to 16 bits, equals the sum of the 16-bit words.
	// The carry of each addition goes into the next one, and the last carry back into the sum
	// (end-around carry).
	var sum, carry uint64
	for len(b) >= 32 {
		sum, carry = bits.Add64(sum, binary.BigEndian.Uint64(b), carry)
		sum, carry = bits.Add64(sum, binary.BigEndian.Uint64(b[8:]), carry)
		sum, carry = bits.Add64(sum, binary.BigEndian.Uint64(b[16:]), carry)
		sum, carry = bits.Add64(sum, binary.BigEndian.Uint64(b[24:]), carry)
		b = b[32:]
	}
	for len(b) >= 8 {
		sum, carry = bits.Add64(sum, binary.BigEndian.Uint64(b), carry)
		b = b[8:]
	}
	// Fewer than 8 bytes left: they are the top of one more 64-bit word, zero-padded.
	var tail [8]byte
	copy(tail[:], b)
	sum, carry = bits.Add64(sum, binary.BigEndian.Uint64(tail[:]), carry)
	sum, carry = bits.Add64(sum, 0, carry)
	sum += carry // a carry here left sum at 0: no further carry
	s := (sum >> 32) + (sum & 0xFFFFFFFF)
	s = (s >> 16) + (s & 0xFFFF)
	s = (s >> 16) + (s & 0xFFFF)
	s = (s >> 16) + (s & 0xFFFF)
	return ^uint16(s)
}

// VerifyChecksum reports whether pkt, a GRE header followed by its payload, has the C bit set
// and a correct checksum. It reports false when C is clear or pkt is too short to hold the
// Checksum field: there is then nothing to verify, and the caller decides whether it needs one.
func VerifyChecksum(pkt []byte) bool {
	if len(pkt) < 8 || binary.BigEndian.Uint16(pkt)&flagC == 0 {
		return false
	}
	return Checksum(pkt) == 0
}

// PutChecksum computes the checksum of pkt, a GRE header with the C bit set followed by its
// payload, and writes it into the Checksum field. It returns false, and writes nothing, when C
// is clear or pkt is too short to hold the field.
func PutChecksum(pkt []byte) bool {
	if len(pkt) < 8 || binary.BigEndian.Uint16(pkt)&flagC == 0 {
		return false
	}
	binary.BigEndian.PutUint16(pkt[4:], 0)
	binary.BigEndian.PutUint16(pkt[4:], Checksum(pkt))
	return true
}
