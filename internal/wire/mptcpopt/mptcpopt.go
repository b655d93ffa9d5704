// Package mptcpopt reads and writes the MPTCP options (TCP option kind 30, RFC 8684 and RFC
// 6824) that a load balancer acts on, and derives tokens from keys. It applies the same rules
// as braid lb's XDP data plane, so the control plane and the tests can predict what the data
// plane does with a packet.
//
// The options it knows (byte offsets from the Kind byte):
//
//	MP_CAPABLE   | 30 | len | 0 | ver | flags | sender's key (8) | receiver's key (8) | DLL (2) | csum (2) |
//	             len 4 (v1 SYN), 12 (SYN/ACK; v0 SYN), 20 (third ACK), 22 / 24 (v1 first data)
//	MP_JOIN SYN  | 30 | 12 | 1 | B | address id | receiver's token (4) | sender's random (4) |
//	DSS          | 30 | len | 2 | reserved | F m M a A | ...           (F 0x10: DATA_FIN)
//	MP_FASTCLOSE | 30 | 12 | 7 | reserved (12 bits) | option receiver's key (8) |
//
// The token of a key is the most significant 32 bits of SHA-256(key) (version 1) or SHA-1(key)
// (version 0), the key taken as its 8 bytes in network order.
package mptcpopt

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
)

// Kind is the TCP option kind of MPTCP.
const Kind = 30

// Subtypes.
const (
	SubCapable   = 0
	SubJoin      = 1
	SubDSS       = 2
	SubFastclose = 7
)

// Flags of Info: what a TCP option list carries.
const (
	HasCapable   = 1 << iota // an MP_CAPABLE option
	CapableKey               // ... of a form that carries the receiver's key (length 20, 22, 24)
	CapableBad               // ... with a length, version or flags no RFC defines
	V0                       // ... of version 0
	HasJoin                  // an MP_JOIN option
	JoinSYN                  // ... of the SYN form (length 12, carries the token)
	HasFastclose             // an MP_FASTCLOSE of length 12
	DataFIN                  // a DSS with the DATA_FIN flag
)

// ErrMalformed is returned for an option list whose lengths lie: an option that runs past the
// end, a length below 2, or a kind byte without its length. A receiver ignores such a list.
var ErrMalformed = errors.New("mptcpopt: malformed option list")

// Info is what a TCP option list says to a load balancer. Only the first option of each
// subtype counts, as in the data plane.
type Info struct {
	Flags        int
	Version      uint8   // of the MP_CAPABLE
	ReceiverKey  [8]byte // MP_CAPABLE (CapableKey)
	Token        uint32  // MP_JOIN SYN: the receiver's token
	AddrID       uint8   // MP_JOIN SYN
	Backup       bool    // MP_JOIN SYN
	Nonce        uint32  // MP_JOIN SYN: the sender's random number
	FastcloseKey [8]byte // MP_FASTCLOSE
}

// Parse reads the TCP option list opts (the bytes after the 20-byte TCP header) into in,
// overwriting all of it. On ErrMalformed in is zero.
func Parse(opts []byte, in *Info) error {
	*in = Info{}
	cap, join, dss, fc := -1, -1, -1, -1
	for i := 0; i < len(opts); {
		kind := opts[i]
		if kind == 0 {
			break
		}
		if kind == 1 {
			i++
			continue
		}
		if i+1 >= len(opts) {
			return ErrMalformed
		}
		l := int(opts[i+1])
		if l < 2 || i+l > len(opts) {
			return ErrMalformed
		}
		if kind == Kind && l >= 3 {
			switch sub := opts[i+2] >> 4; {
			case sub == SubCapable && cap < 0:
				cap = i
			case sub == SubJoin && join < 0:
				join = i
			case sub == SubDSS && dss < 0:
				dss = i
			case sub == SubFastclose && fc < 0:
				fc = i
			}
		}
		i += l
	}
	if cap >= 0 {
		o := opts[cap:]
		l := int(o[1])
		ver := o[2] & 0x0f
		var fl byte
		if l >= 4 {
			fl = o[3]
		}
		in.Flags |= HasCapable
		in.Version = ver
		if ver == 0 {
			in.Flags |= V0
		}
		switch {
		case ver > 1 || l < 4 || fl&0x1f != 0x01 || fl&0x40 != 0:
			in.Flags |= CapableBad
		case l == 20 || ver == 1 && (l == 22 || l == 24):
			in.Flags |= CapableKey
			copy(in.ReceiverKey[:], o[12:20])
		case !(l == 4 && ver == 1) && l != 12:
			in.Flags |= CapableBad
		}
	}
	if join >= 0 {
		o := opts[join:]
		in.Flags |= HasJoin
		if o[1] == 12 {
			in.Flags |= JoinSYN
			in.Backup = o[2]&1 != 0
			in.AddrID = o[3]
			in.Token = binary.BigEndian.Uint32(o[4:])
			in.Nonce = binary.BigEndian.Uint32(o[8:])
		}
	}
	if fc >= 0 && opts[fc+1] == 12 {
		in.Flags |= HasFastclose
		copy(in.FastcloseKey[:], opts[fc+4:fc+12])
	}
	if dss >= 0 && opts[dss+1] >= 4 && opts[dss+3]&0x10 != 0 {
		in.Flags |= DataFIN
	}
	return nil
}

// Token returns the token of key in the given MPTCP version (0: SHA-1, otherwise SHA-256).
func Token(key [8]byte, version uint8) uint32 {
	if version == 0 {
		h := sha1.Sum(key[:])
		return binary.BigEndian.Uint32(h[:4])
	}
	h := sha256.Sum256(key[:])
	return binary.BigEndian.Uint32(h[:4])
}

// IDSN returns the initial data sequence number of key's owner.
func IDSN(key [8]byte, version uint8) uint64 {
	if version == 0 {
		h := sha1.Sum(key[:])
		return binary.BigEndian.Uint64(h[12:20])
	}
	h := sha256.Sum256(key[:])
	return binary.BigEndian.Uint64(h[24:32])
}

// Capable is an MP_CAPABLE option to write.
type Capable struct {
	Length      uint8 // 4, 12, 20, 22 or 24
	Version     uint8
	Flags       uint8 // 0x01 (H) for HMAC-SHA256 / SHA-1; 0x81 with checksums
	SenderKey   [8]byte
	ReceiverKey [8]byte
	DataLen     uint16 // lengths 22 and 24
	Checksum    uint16 // length 24
}

// AppendCapable appends c to b. Lengths other than the five defined ones write the first
// Length bytes of the length-24 form (for tests of lying lengths), at least 3.
func AppendCapable(b []byte, c Capable) []byte {
	var o [24]byte
	o[0], o[1], o[2], o[3] = Kind, c.Length, SubCapable<<4|c.Version&0x0f, c.Flags
	copy(o[4:], c.SenderKey[:])
	copy(o[12:], c.ReceiverKey[:])
	binary.BigEndian.PutUint16(o[20:], c.DataLen)
	binary.BigEndian.PutUint16(o[22:], c.Checksum)
	n := int(c.Length)
	if n < 3 {
		n = 3
	}
	if n > 24 {
		n = 24
	}
	return append(b, o[:n]...)
}

// AppendJoinSYN appends the MP_JOIN option of a SYN.
func AppendJoinSYN(b []byte, addrID uint8, backup bool, token, nonce uint32) []byte {
	var o [12]byte
	o[0], o[1], o[2], o[3] = Kind, 12, SubJoin<<4, addrID
	if backup {
		o[2] |= 1
	}
	binary.BigEndian.PutUint32(o[4:], token)
	binary.BigEndian.PutUint32(o[8:], nonce)
	return append(b, o[:]...)
}

// AppendFastclose appends an MP_FASTCLOSE carrying key.
func AppendFastclose(b []byte, key [8]byte) []byte {
	b = append(b, Kind, 12, SubFastclose<<4, 0)
	return append(b, key[:]...)
}

// AppendDataACK appends a DSS with a 4-byte DATA_ACK, and DATA_FIN when fin.
func AppendDataACK(b []byte, ack uint32, fin bool) []byte {
	fl := byte(0x01)
	if fin {
		fl |= 0x10
	}
	b = append(b, Kind, 8, SubDSS<<4, fl)
	return binary.BigEndian.AppendUint32(b, ack)
}

// Pad appends NOPs until len(b) is a multiple of 4.
func Pad(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 1)
	}
	return b
}
