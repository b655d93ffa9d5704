package mpt

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/netip"
)

// MPT's peer-to-peer control on the command port (tunnels.md section 3, "Peer <-> peer
// control"). A message is a UDP datagram to the peer's remote_cmd_port, with no GRE header:
//
//	cmd | status | auth_type | auth_len | auth (auth_len bytes) | round | ip_ver | 2 pad |
//	16 B address | 16 B address
//
// auth is empty with auth_type 0, a 4-byte random token with auth_type 1, and the 4-byte token
// followed by a 32-byte SHA-256 with auth_type 2; auth_len says which (0, 4 or 36). With
// auth_type 0 a message has the keepalive's 40-byte layout. The rest is braid's reading where
// the reference is silent (docs/tunnel-wire.md, mode mpt, path status):
//
//   - The two addresses of a 0xA2 name the path: the sender's own address of the path, then the
//     receiver's, IPv4 as ::ffff:a.b.c.d, and ip_ver is the path's address family. A 0xA2 has
//     no payload.
//   - The SHA-256 of auth_type 2 is SHA-256(message with its 32 hash bytes zeroed || key), the
//     key being auth_key's bytes.

// Authentication types (auth_type).
const (
	AuthNone   = 0
	AuthToken  = 1 // a random 4-byte token: no secret
	AuthSHA256 = 2 // the token and SHA-256(message || key)
)

// Lengths of the authentication fields.
const (
	TokenLen = 4
	HashLen  = sha256.Size
)

// StatusChangeLen is the length of a 0xA2 without authentication; AuthLen adds to it.
const StatusChangeLen = 40

// Errors of StatusChange.Decode, besides ErrTruncated, ErrTrailing and ErrIPVersion.
var (
	ErrNotStatusChange = errors.New("mpt: command is not a path status change")
	ErrAuthType        = errors.New("mpt: unknown auth_type, or auth_len does not match it")
	ErrAuth            = errors.New("mpt: authentication failed")
)

// AuthLen returns auth_len for an auth_type, and false for an unknown one.
func AuthLen(authType uint8) (int, bool) {
	switch authType {
	case AuthNone:
		return 0, true
	case AuthToken:
		return TokenLen, true
	case AuthSHA256:
		return TokenLen + HashLen, true
	}
	return 0, false
}

// StatusChange is a 0xA2 P_STATUS_CHANGE: the sender tells the receiver the status of a path.
type StatusChange struct {
	Status   uint8 // StatusOK, StatusPathDown, ...
	AuthType uint8 // AuthNone, AuthToken or AuthSHA256
	Token    [TokenLen]byte
	Round    uint8
	IPVer    uint8      // of the path's addresses: 4 or 6
	Local    netip.Addr // the sender's address of the path
	Remote   netip.Addr // the receiver's address of the path
}

// Len returns the encoded length of s, or 0 for an unknown AuthType.
func (s *StatusChange) Len() int {
	n, ok := AuthLen(s.AuthType)
	if !ok {
		return 0
	}
	return StatusChangeLen + n
}

// Append appends s to b and returns the extended buffer; with AuthSHA256 it computes the hash
// with key, which the other types ignore. Addresses are written as Keepalive.Append writes them.
// It returns b unchanged for an unknown AuthType.
func (s *StatusChange) Append(b []byte, key []byte) []byte {
	n, ok := AuthLen(s.AuthType)
	if !ok {
		return b
	}
	start := len(b)
	b = append(b, CmdPathStatusChange, s.Status, s.AuthType, uint8(n))
	if n > 0 {
		b = append(b, s.Token[:]...)
	}
	if n > TokenLen {
		b = append(b, make([]byte, HashLen)...)
	}
	b = append(b, s.Round, s.IPVer, 0, 0)
	l, r := s.Local.As16(), s.Remote.As16()
	b = append(b, l[:]...)
	b = append(b, r[:]...)
	if s.AuthType == AuthSHA256 {
		m := b[start:]
		sum := authHash(m, key)
		copy(m[4+TokenLen:], sum[:])
	}
	return b
}

// authHash returns SHA-256(m with its hash field zeroed || key); m is a whole auth_type 2
// message. It does not modify m.
func authHash(m, key []byte) [HashLen]byte {
	h := sha256.New()
	h.Write(m[:4+TokenLen])
	var zero [HashLen]byte
	h.Write(zero[:])
	h.Write(m[4+TokenLen+HashLen:])
	h.Write(key)
	var sum [HashLen]byte
	h.Sum(sum[:0])
	return sum
}

// Decode overwrites s with the 0xA2 in b, a whole datagram of the command port, and returns its
// length. With auth_type 2 the hash must be SHA-256(message || key); the other types carry no
// secret and key is ignored. Address decoding is Keepalive.Decode's. Errors, in the order
// checked: ErrTruncated (shorter than its auth_len says, or than 4 bytes), ErrNotStatusChange,
// ErrAuthType, ErrTrailing, ErrIPVersion, ErrAuth; on error s is zero.
func (s *StatusChange) Decode(b []byte, key []byte) (n int, err error) {
	*s = StatusChange{}
	if len(b) < 4 {
		return 0, ErrTruncated
	}
	if b[0] != CmdPathStatusChange {
		return 0, ErrNotStatusChange
	}
	al, ok := AuthLen(b[2])
	if !ok || int(b[3]) != al {
		return 0, ErrAuthType
	}
	n = StatusChangeLen + al
	switch {
	case len(b) < n:
		return 0, ErrTruncated
	case len(b) > n:
		return 0, ErrTrailing
	}
	h := b[4+al:]
	if h[1] != 4 && h[1] != 6 {
		return 0, ErrIPVersion
	}
	if b[2] == AuthSHA256 {
		sum := authHash(b, key)
		if subtle.ConstantTimeCompare(sum[:], b[4+TokenLen:4+TokenLen+HashLen]) != 1 {
			return 0, ErrAuth
		}
	}
	*s = StatusChange{Status: b[1], AuthType: b[2], Round: h[0], IPVer: h[1],
		Local: tunnelAddr(h[1], h[4:20]), Remote: tunnelAddr(h[1], h[20:36])}
	if al > 0 {
		copy(s.Token[:], b[4:4+TokenLen])
	}
	return n, nil
}
