package session

import (
	"crypto/subtle"

	"golang.org/x/crypto/blake2s"
)

// MAC1Len is the length of the MAC that closes a handshake initiation on the wire.
//
// An initiation costs its responder four X25519 operations before it is known to come from a
// peer; anyone can send one. The MAC, keyed with a hash of the responder's public key (as
// WireGuard's mac1), costs one BLAKE2s to check and lets a responder drop initiations from
// senders that do not know its public key before any of that work: junk, scans, and floods
// of random bytes. It is no authentication (the public key is not a secret); what a sender
// that knows the key can send is bounded by the responder's handshake budget.
const MAC1Len = 16

// MAC1Key returns the key of the MAC over initiations addressed to pub:
// BLAKE2s-256("mac1----" || pub).
func MAC1Key(pub PublicKey) [blake2s.Size]byte {
	return blake2s.Sum256(append([]byte("mac1----"), pub[:]...))
}

// AppendMAC1 appends to msg its MAC under key (MAC1Key of the responder's public key).
func AppendMAC1(msg []byte, key *[blake2s.Size]byte) []byte {
	m := mac1(msg, key)
	return append(msg, m[:]...)
}

// CheckMAC1 splits b into an initiation and the MAC that closes it, and reports whether the
// MAC is right for key (MAC1Key of this side's public key).
func CheckMAC1(b []byte, key *[blake2s.Size]byte) (msg []byte, ok bool) {
	if len(b) < MAC1Len {
		return nil, false
	}
	msg = b[:len(b)-MAC1Len]
	m := mac1(msg, key)
	return msg, subtle.ConstantTimeCompare(m[:], b[len(msg):]) == 1
}

func mac1(msg []byte, key *[blake2s.Size]byte) (out [MAC1Len]byte) {
	h, err := blake2s.New128(key[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	h.Write(msg)
	h.Sum(out[:0])
	return out
}
