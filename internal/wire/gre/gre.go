// Package gre encodes and decodes the GRE header of RFC 2784 with the Key and Sequence Number
// extensions of RFC 2890, as carried in UDP (RFC 8086) by both tunnel modes of braid
// (docs/tunnel-wire.md).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|C| |K|S| Reserved0       | Ver |         Protocol Type         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|      Checksum (optional)      |       Reserved1 (Optional)    |  if C
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                         Key (optional)                        |  if K
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                 Sequence Number (Optional)                    |  if S
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// Reserved0 is bit 1 and bits 4 to 12 (RFC 1701's R, s, Recur and Flags). Decode rejects a
// header with any of them set (ErrReserved), or with a Ver other than 0 (ErrVersion), as
// docs/tunnel-wire.md requires; this is stricter than RFC 2784, which asks receivers to ignore
// bits 6 to 12. Reserved1 is ignored on receipt and always encoded as zero: it is the only
// normalisation Encode(Decode(b)) applies.
//
// Decode does not verify the checksum; the caller decides, with VerifyChecksum. Nothing in this
// package allocates.
package gre

import (
	"encoding/binary"
	"errors"
)

// Protocol Type values (EtherTypes) used by braid.
const (
	ProtoIPv4  = 0x0800
	ProtoIPv6  = 0x86DD
	ProtoBraid = 0x88B5 // IEEE 802 local experimental EtherType 1: braid mode
)

// Lengths of the header: the fixed part, and the most it can be (C, K and S all set).
const (
	MinLen = 4
	MaxLen = 16
)

// Bits of the first 16-bit word of the header.
const (
	flagC        = 0x8000
	flagK        = 0x2000
	flagS        = 0x1000
	maskReserved = 0x4FF8 // bit 1 and bits 4..12
	maskVer      = 0x0007
)

// Errors returned by Decode. The data path counts drops per error.
var (
	ErrTruncated = errors.New("gre: truncated header")
	ErrVersion   = errors.New("gre: version is not 0")
	ErrReserved  = errors.New("gre: reserved bit set")
)

// Header is a GRE header. The optional fields CSum, Key and Seq are on the wire only when their
// flag is set; Decode leaves them zero otherwise, Encode ignores them.
type Header struct {
	ChecksumPresent bool // C
	KeyPresent      bool // K
	SeqPresent      bool // S
	Protocol        uint16
	CSum            uint16 // Checksum, if ChecksumPresent
	Key             uint32 // if KeyPresent
	Seq             uint32 // Sequence Number, if SeqPresent
}

// Len is the encoded length of h: 4, plus 4 for each of C, K and S.
func (h *Header) Len() int {
	n := MinLen
	if h.ChecksumPresent {
		n += 4
	}
	if h.KeyPresent {
		n += 4
	}
	if h.SeqPresent {
		n += 4
	}
	return n
}

// Decode overwrites h with the header at the start of b and returns its length; the payload
// is b[n:]. The checks come in this order: ErrTruncated (fewer than 4 bytes), ErrVersion,
// ErrReserved, ErrTruncated (fewer bytes than the flags call for). On error h is zero.
func (h *Header) Decode(b []byte) (n int, err error) {
	*h = Header{}
	if len(b) < MinLen {
		return 0, ErrTruncated
	}
	w := binary.BigEndian.Uint16(b)
	if w&maskVer != 0 {
		return 0, ErrVersion
	}
	if w&maskReserved != 0 {
		return 0, ErrReserved
	}
	d := Header{
		ChecksumPresent: w&flagC != 0,
		KeyPresent:      w&flagK != 0,
		SeqPresent:      w&flagS != 0,
		Protocol:        binary.BigEndian.Uint16(b[2:]),
	}
	n = d.Len()
	if len(b) < n {
		return 0, ErrTruncated
	}
	off := MinLen
	if d.ChecksumPresent {
		d.CSum = binary.BigEndian.Uint16(b[off:])
		off += 4
	}
	if d.KeyPresent {
		d.Key = binary.BigEndian.Uint32(b[off:])
		off += 4
	}
	if d.SeqPresent {
		d.Seq = binary.BigEndian.Uint32(b[off:])
	}
	*h = d
	return n, nil
}

// Encode writes h into b[:h.Len()] and returns h.Len(), or returns 0 and writes nothing if b is
// shorter than that. Reserved0, Ver and Reserved1 are written as zero. With ChecksumPresent,
// CSum is written as it is: leave it 0 and call PutChecksum once the payload is in place.
func (h *Header) Encode(b []byte) int {
	n := h.Len()
	if len(b) < n {
		return 0
	}
	var w uint16
	if h.ChecksumPresent {
		w |= flagC
	}
	if h.KeyPresent {
		w |= flagK
	}
	if h.SeqPresent {
		w |= flagS
	}
	binary.BigEndian.PutUint16(b, w)
	binary.BigEndian.PutUint16(b[2:], h.Protocol)
	off := MinLen
	if h.ChecksumPresent {
		binary.BigEndian.PutUint16(b[off:], h.CSum)
		binary.BigEndian.PutUint16(b[off+2:], 0)
		off += 4
	}
	if h.KeyPresent {
		binary.BigEndian.PutUint32(b[off:], h.Key)
		off += 4
	}
	if h.SeqPresent {
		binary.BigEndian.PutUint32(b[off:], h.Seq)
	}
	return n
}
