package gre

import (
	"encoding/binary"

	"braid/internal/wire/csum"
)

// Checksum is the Internet checksum (RFC 1071) of b: the ones' complement of the ones'
// complement sum of b's 16-bit big-endian words, an odd last byte padded with a zero byte.
// RFC 2784 computes it over the GRE header, with the Checksum field zero, and the payload.
//
// The sum of a buffer that includes a correct checksum is 0xFFFF, so Checksum of such a buffer
// is 0.
func Checksum(b []byte) uint16 { return csum.Checksum(b) }

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
