// Package session gives the tunnel its keys and sessions: static X25519 key pairs that identify
// peers (no default key exists; `braid keygen` makes them), a Noise IK handshake that turns two
// static keys into fresh per-direction session keys, ChaCha20-Poly1305 sealing with a 64-bit
// counter nonce, and a replay window over that counter.
//
// The handshake is Noise_IK_25519_ChaChaPoly_BLAKE2s (noiseprotocol.org, revision 34) with the
// prologue "braid tunnel v1": the initiator knows the responder's static key, both prove their
// own, and each handshake uses new ephemeral keys, so session keys are never reused across
// restarts and old traffic stays secret if a static key leaks later.
package session

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/curve25519"
)

// KeyLen is the length of keys, public and private.
const KeyLen = 32

// PrivateKey is a static X25519 private key.
type PrivateKey [KeyLen]byte

// PublicKey is a static X25519 public key: a peer's identity.
type PublicKey [KeyLen]byte

// ErrKey reports a key that is not 32 bytes of standard base64, or is weak.
var ErrKey = errors.New("session: a key is 32 bytes in standard base64 (as printed by 'braid keygen')")

// GenerateKey returns a new random private key, clamped as X25519 requires.
func GenerateKey() (PrivateKey, error) {
	var k PrivateKey
	if _, err := rand.Read(k[:]); err != nil {
		return k, fmt.Errorf("session: %w", err)
	}
	k.clamp()
	return k, nil
}

func (k *PrivateKey) clamp() {
	k[0] &= 248
	k[31] = k[31]&127 | 64
}

// Public returns the public key of k.
func (k PrivateKey) Public() PublicKey {
	var p PublicKey
	pub, err := curve25519.X25519(k[:], curve25519.Basepoint)
	if err != nil { // only for a low-order result, impossible with the base point
		panic(err)
	}
	copy(p[:], pub)
	return p
}

// IsZero reports whether k is unset.
func (k PrivateKey) IsZero() bool { return k == PrivateKey{} }

// String returns k in standard base64.
func (k PrivateKey) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// String returns p in standard base64.
func (p PublicKey) String() string { return base64.StdEncoding.EncodeToString(p[:]) }

// IsZero reports whether p is unset.
func (p PublicKey) IsZero() bool { return p == PublicKey{} }

// ParsePrivateKey reads a private key in standard base64.
func ParsePrivateKey(s string) (PrivateKey, error) {
	var k PrivateKey
	if err := parseKey(s, k[:]); err != nil {
		return k, err
	}
	if k.IsZero() {
		return k, ErrKey
	}
	k.clamp()
	return k, nil
}

// ParsePublicKey reads a public key in standard base64.
func ParsePublicKey(s string) (PublicKey, error) {
	var p PublicKey
	if err := parseKey(s, p[:]); err != nil {
		return p, err
	}
	if p.IsZero() {
		return p, ErrKey
	}
	return p, nil
}

func parseKey(s string, dst []byte) error {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != KeyLen {
		return ErrKey
	}
	copy(dst, b)
	return nil
}

// dh computes X25519(priv, pub); a low-order public key is refused.
func dh(priv *PrivateKey, pub *PublicKey) ([KeyLen]byte, error) {
	var out [KeyLen]byte
	r, err := curve25519.X25519(priv[:], pub[:])
	if err != nil {
		return out, ErrKey
	}
	copy(out[:], r)
	return out, nil
}
