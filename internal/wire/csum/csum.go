// Package csum computes the Internet checksum (RFC 1071) and the pseudo-header sums of TCP and
// UDP, for the codecs that write or check them (GRE, segmentation and coalescing of offloaded
// packets). It allocates nothing.
package csum

import (
	"encoding/binary"
	"math/bits"
)

// Sum adds b's 16-bit big-endian words (an odd last byte padded with a zero byte) to initial,
// in ones' complement arithmetic, and returns the sum folded to 16 bits (not complemented).
// Sums of consecutive pieces chain through initial as long as every piece but the last has an
// even length.
func Sum(b []byte, initial uint16) uint16 {
	// 2^16 ≡ 1 (mod 2^16-1), and 2^16-1 divides 2^64-1: a ones' complement sum of 64-bit words,
	// folded to 16 bits, equals the sum of the 16-bit words. The carry of each addition goes
	// into the next one, and the last carry back into the sum (end-around carry). The sum is
	// independent of byte order (RFC 1071 section 2(B)): the words are loaded in the host's
	// little-endian order, without a byte swap each, and the folded sum is swapped once.
	sum, carry := uint64(bits.ReverseBytes16(initial)), uint64(0)
	for len(b) >= 64 {
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b), carry)
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b[8:]), carry)
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b[16:]), carry)
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b[24:]), carry)
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b[32:]), carry)
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b[40:]), carry)
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b[48:]), carry)
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b[56:]), carry)
		b = b[64:]
	}
	for len(b) >= 8 {
		sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(b), carry)
		b = b[8:]
	}
	// Fewer than 8 bytes left: they are the start of one more 64-bit word, zero-padded.
	var tail [8]byte
	copy(tail[:], b)
	sum, carry = bits.Add64(sum, binary.LittleEndian.Uint64(tail[:]), carry)
	sum, carry = bits.Add64(sum, 0, carry)
	sum += carry // a carry here left sum at 0: no further carry
	s := (sum >> 32) + (sum & 0xFFFFFFFF)
	s = (s >> 16) + (s & 0xFFFF)
	s = (s >> 16) + (s & 0xFFFF)
	s = (s >> 16) + (s & 0xFFFF)
	return bits.ReverseBytes16(uint16(s))
}

// Checksum is the Internet checksum of b: the ones' complement of Sum(b, 0). The checksum of a
// buffer that includes its correct checksum is 0.
func Checksum(b []byte) uint16 { return ^Sum(b, 0) }

// Pseudo is the sum of the TCP or UDP pseudo-header (RFC 9293 section 3.1, RFC 8200 section
// 8.1) for addresses src and dst (both 4 or both 16 bytes), protocol proto and a transport
// length of length bytes.
func Pseudo(src, dst []byte, proto uint8, length int) uint16 {
	s := Sum(src, 0)
	s = Sum(dst, s)
	var tail [8]byte
	binary.BigEndian.PutUint32(tail[:], uint32(length))
	binary.BigEndian.PutUint32(tail[4:], uint32(proto))
	return Sum(tail[:], s)
}
