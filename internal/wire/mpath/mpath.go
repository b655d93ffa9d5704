// Package mpath encodes and decodes braid mode's own header and the plaintexts it seals
// (docs/tunnel-wire.md, mode braid). The header follows the 8-byte GRE header (flag K,
// Protocol Type 0x88B5) and is authenticated, with the GRE header, as AEAD associated data:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|     Type      |     Path      |             Flags             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                                                               |
//	+                Counter (per peer and direction)               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          sealed payload (ChaCha20-Poly1305) ... | 16-byte tag |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The plaintexts, all big-endian:
//
//	Type 1 data:      | Seq (4) | PathSeq (4) | inner IPv4 or IPv6 packet              |  DataPrefix
//	Type 2 probe:     | Seq (4) | Timestamp (4) | padding (any length)                 |  Probe
//	Type 3 reply:     | Seq (4) | Timestamp (4) | Hold (4) | path feedback (32)        |  ProbeReply
//	Type 4 feedback:  | path feedback (32)                                             |  Feedback
//	Type 5 MTU probe: | Seq (4) | Timestamp (4) | padding to the size probed           |  Probe
//	Type 6 MTU ack:   | Seq (4) | Size (4, the probe's UDP payload as received)         |  MTUAck
//	Type 7 nack:      | First (4) | Count (2) | Path (1)                                 |  Nack
//	Type 8 gap nack:  | First (4) | Missing (8, bit 63 - i: number First + i)             |  GapNack
//
//	path feedback:    | Bytes (8) | Packets (4) | Lost (4) | ReorderPackets (4) | ReorderKiB (4) |
//	                  | Time (4) | ReorderFreeKiB (4) |
//
// Types 16 and 17 are the handshake messages; their payload is not specified yet, so this package
// decodes only their header. Timestamps, Hold and Time are microseconds that wrap.
//
// Every Decode overwrites the whole value (zero on error) and returns the bytes it consumed;
// every Encode writes into a caller's buffer and returns the bytes written, or 0, writing
// nothing, when the buffer is too short. Nothing in this package allocates.
package mpath

import (
	"encoding/binary"
	"errors"
)

// Errors returned by the decoders. The data path counts drops per error.
var (
	ErrTruncated    = errors.New("mpath: truncated")
	ErrTrailing     = errors.New("mpath: trailing bytes after a fixed-length message")
	ErrType         = errors.New("mpath: unknown message type")
	ErrUnknownFlags = errors.New("mpath: unknown flag set")
	ErrInnerPacket  = errors.New("mpath: inner packet is neither a consistent IPv4 nor IPv6 packet")
)

// Flags. Only data packets carry them; Decode rejects any other flag, or a flag on another type.
const (
	// FlagClear marks a data packet whose payload is in clear, followed by a tag that
	// authenticates the whole packet (tunnels with encryption off).
	FlagClear = 0x0001
	// FlagSparse marks a sparse flow's data packet in a session of protocol version 3: sent
	// ahead of packets numbered before it and on every path, for the receiver to deliver at
	// once and to drop the other copies of its number (docs/tunnel-wire.md, "Protocol
	// versions").
	FlagSparse = 0x0002
)

// Message types (Header.Type).
const (
	TypeData          = 1
	TypeProbe         = 2
	TypeProbeReply    = 3
	TypeFeedback      = 4
	TypeMTUProbe      = 5
	TypeMTUAck        = 6
	TypeNack          = 7
	TypeGapNack       = 8
	TypeHandshakeInit = 16
	TypeHandshakeResp = 17
	TypeCookieReply   = 18
)

// HeaderLen is the length of the braid header.
const HeaderLen = 12

// PathReserved is the one Path value a sender must not use. Decode accepts it: what a receiver
// does with it is the data path's decision.
const PathReserved = 255

// Header is braid's header.
type Header struct {
	Type    uint8
	Path    uint8  // the sender's path ID
	Flags   uint16 // FlagClear, FlagSparse (data packets only): Decode rejects any other
	Counter uint64 // per session and direction: makes the header (the AEAD nonce) unique; replay window position
}

// Decode overwrites h with the header at the start of b and returns HeaderLen; the sealed
// payload is b[HeaderLen:]. Errors, in the order checked: ErrTruncated, ErrType (a type other
// than the eleven defined), ErrUnknownFlags (a flag other than FlagClear and FlagSparse, or a flag
// on another type than data).
func (h *Header) Decode(b []byte) (n int, err error) {
	*h = Header{}
	if len(b) < HeaderLen {
		return 0, ErrTruncated
	}
	switch b[0] {
	case TypeData, TypeProbe, TypeProbeReply, TypeFeedback, TypeMTUProbe, TypeMTUAck, TypeNack,
		TypeGapNack, TypeHandshakeInit, TypeHandshakeResp, TypeCookieReply:
	default:
		return 0, ErrType
	}
	flags := binary.BigEndian.Uint16(b[2:])
	if flags&^(FlagClear|FlagSparse) != 0 || flags != 0 && b[0] != TypeData {
		return 0, ErrUnknownFlags
	}
	*h = Header{Type: b[0], Path: b[1], Flags: flags, Counter: binary.BigEndian.Uint64(b[4:])}
	return HeaderLen, nil
}

// Encode writes h into b[:HeaderLen] and returns HeaderLen, or 0 if b is shorter. It writes
// Type and Flags as they are, even values Decode rejects.
func (h *Header) Encode(b []byte) int {
	if len(b) < HeaderLen {
		return 0
	}
	b[0] = h.Type
	b[1] = h.Path
	binary.BigEndian.PutUint16(b[2:], h.Flags)
	binary.BigEndian.PutUint64(b[4:], h.Counter)
	return HeaderLen
}
