// Package mpt encodes and decodes the wire format of MPT (MPT-GRE, spyff/mpt), which braid's
// mpt mode speaks to interoperate with it (docs/tunnel-wire.md, mode mpt). MPT carries the
// inner packet right after a GRE header of 4 bytes, or 8 with the connection-wide sequence
// number used for reordering:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|C| |K|S| Reserved0     | Ver |        Protocol Type            |   00 00 08 00 | 10 00 08 00
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|        Sequence Number (only if S = 1; 32 bits, big-endian)   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|        inner IPv4 or IPv6 packet, or a command (first byte >= 0xA0) ...
//
// Protocol Type is the connection's ip_ver (0x0800 or 0x86DD), not the inner packet's. Like
// MPT, DecodeData looks only at the S flag: C, K, the reserved bits, Ver and Protocol Type are
// ignored, and the payload starts after byte 4 or 8 whatever C and K say. EncodeData therefore
// normalises: it writes only S and the Protocol Type of the ip_ver it is given.
//
// A payload whose first byte is 0xA0 or more is an MPT command; an IP packet never starts so,
// its version nibble being 4 or 6. The keepalive (0xA1) is the only command on the data socket:
//
//	00 00 08 00 | A1 | 00 00 00 00 | ip_ver (04|06) | 00 00 | local tunnel IP (16) | remote tunnel IP (16)
//	GRE           cmd  status, auth_type,  connection    pad
//	                   auth_len, round     IP version
//
// It is the peer-to-peer control layout of MPT's command port (cmd | status | auth_type |
// auth_len | auth | round | ip_ver | 2 pad | local IP | remote IP | payload) with no
// authentication. Tunnel IPv4 addresses are written as ::ffff:a.b.c.d.
//
// MPT has no authentication: nothing here tells a forged packet from a real one. Nothing in
// this package allocates, except Keepalive.Append when b lacks capacity.
package mpt

import (
	"encoding/binary"
	"errors"
)

// Errors. ErrCommand is not a fault: DecodeData returns it, with the payload, for a command.
var (
	ErrTruncated    = errors.New("mpt: truncated")
	ErrTrailing     = errors.New("mpt: trailing bytes after a fixed-length command")
	ErrCommand      = errors.New("mpt: command, not data")
	ErrNotKeepalive = errors.New("mpt: command is not a keepalive")
	ErrIPVersion    = errors.New("mpt: ip_ver is neither 4 nor 6")
)

// Lengths of the GRE header of a data packet, without and with the sequence number.
const (
	HeaderLen    = 4
	SeqHeaderLen = 8
)

const (
	flagS     = 0x10 // in the first byte
	protoIPv4 = 0x0800
	protoIPv6 = 0x86DD
)

// EncodeData writes the GRE header of a data packet (or a command) into b and returns its
// length, 4, or 8 with withSeq: no flag but S, and the Protocol Type of the connection's
// ip_ver, 4 (0x0800) or 6 (0x86DD). It returns 0, writing nothing, if ipVer is neither or b is
// too short.
func EncodeData(b []byte, ipVer int, seq uint32, withSeq bool) int {
	var proto uint16
	switch ipVer {
	case 4:
		proto = protoIPv4
	case 6:
		proto = protoIPv6
	default:
		return 0
	}
	n := HeaderLen
	if withSeq {
		n = SeqHeaderLen
	}
	if len(b) < n {
		return 0
	}
	b[0], b[1] = 0, 0
	if withSeq {
		b[0] = flagS
		binary.BigEndian.PutUint32(b[4:], seq)
	}
	binary.BigEndian.PutUint16(b[2:], proto)
	return n
}

// DecodeData splits b, a UDP payload, into its GRE header and the payload, a sub-slice of b,
// possibly empty (as in MPT, which would hand it on). hasSeq is the S flag, and seq the
// sequence number when it is set, 0 otherwise. Errors: ErrTruncated (fewer than 4 bytes, or 8
// with S; payload is then nil), and ErrCommand when the payload starts with a byte of 0xA0 or
// more: payload, seq and hasSeq are then valid and the caller parses the command (see
// Keepalive).
func DecodeData(b []byte) (payload []byte, seq uint32, hasSeq bool, err error) {
	if len(b) < HeaderLen {
		return nil, 0, false, ErrTruncated
	}
	n := HeaderLen
	if b[0]&flagS != 0 {
		if len(b) < SeqHeaderLen {
			return nil, 0, false, ErrTruncated
		}
		n = SeqHeaderLen
		seq = binary.BigEndian.Uint32(b[4:])
		hasSeq = true
	}
	payload = b[n:]
	if len(payload) > 0 && payload[0] >= CommandMin {
		return payload, seq, hasSeq, ErrCommand
	}
	return payload, seq, hasSeq, nil
}
