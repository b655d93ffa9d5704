package session

import (
	"errors"
	"fmt"
	"math/bits"
)

// Version is a version of braid's tunnel protocol: what a session's packets look like and
// mean after the handshake (docs/tunnel-wire.md, "Protocol versions").
type Version uint8

// Versions is a set of protocol versions, a bit per Version (1 to 15).
type Versions uint16

// The protocol versions. Version 1 is the protocol of the releases before the handshake
// carried a version (their initiation is V1InitLen bytes, their probe reply's feedback had
// fewer fields). Version 3 is version 2 with sparse flows (docs/tunnel-wire.md, "Protocol
// versions"): the packets are the same, but the receiver delivers a sparse flow's packet at
// once and drops its copies whatever their number, so that the sender may send it ahead of
// packets numbered before it and on every path. Version 4 is version 3 with gap nacks (message
// type 8): the receiver names the data sequence numbers its reorder buffer has waited for too
// long, and the sender resends them. This release speaks 2, 3 and 4.
const (
	V1 Version = 1
	V2 Version = 2
	V3 Version = 3
	V4 Version = 4

	// Current is the version this release speaks best.
	Current = V4
	// Supported are the versions this release speaks: it offers them and chooses among them.
	Supported = Versions(1<<V2 | 1<<V3 | 1<<V4)
)

// ErrVersion: the two sides speak no protocol version in common.
var ErrVersion = errors.New("session: no protocol version both sides speak")

func (v Version) valid() bool   { return v >= 1 && v <= 15 }
func (v Version) bit() Versions { return 1 << v }

// Has reports whether vs holds v.
func (vs Versions) Has(v Version) bool { return v.valid() && vs&v.bit() != 0 }

// Best returns the highest version in vs.
func (vs Versions) Best() (Version, bool) {
	vs &= 0xfffe // bit 0 is no version
	if vs == 0 {
		return 0, false
	}
	return Version(15 - bits.LeadingZeros16(uint16(vs))), true
}

// String lists the versions, such as "1,2".
func (vs Versions) String() string {
	s := ""
	for v := Version(1); v <= 15; v++ {
		if vs.Has(v) {
			if s != "" {
				s += ","
			}
			s += fmt.Sprint(uint8(v))
		}
	}
	if s == "" {
		return "none"
	}
	return s
}
