package session

import (
	"crypto/aes"
	"crypto/cipher"
	"fmt"
	"strings"

	"golang.org/x/crypto/chacha20poly1305"
	"golang.org/x/sys/cpu"
)

// Cipher is a transport AEAD: both take a 32-byte key and a 12-byte nonce and add a 16-byte
// tag, so the packet format is the same with either.
type Cipher uint8

// Transport ciphers. ChaCha20-Poly1305 is fast everywhere, also without special instructions;
// AES-256-GCM is several times faster where the CPU has AES and carry-less multiplication
// instructions, and slow (and not constant-time) where it has not.
const (
	ChaCha20Poly1305 Cipher = 1
	AES256GCM        Cipher = 2
)

// Ciphers is a set of transport ciphers, a bit per Cipher.
type Ciphers uint8

// AllCiphers is every cipher there is.
const AllCiphers = Ciphers(1<<ChaCha20Poly1305 | 1<<AES256GCM)

func (c Cipher) valid() bool  { return c == ChaCha20Poly1305 || c == AES256GCM }
func (c Cipher) bit() Ciphers { return 1 << c }
func (c Cipher) String() string {
	switch c {
	case ChaCha20Poly1305:
		return "chacha20-poly1305"
	case AES256GCM:
		return "aes-256-gcm"
	}
	return fmt.Sprintf("cipher(%d)", uint8(c))
}

// ParseCipher reads a cipher name as String writes it.
func ParseCipher(s string) (Cipher, error) {
	for _, c := range []Cipher{ChaCha20Poly1305, AES256GCM} {
		if strings.EqualFold(s, c.String()) {
			return c, nil
		}
	}
	return 0, fmt.Errorf("session: unknown cipher %q (chacha20-poly1305 or aes-256-gcm)", s)
}

// Has reports whether c is in the set.
func (cs Ciphers) Has(c Cipher) bool { return c.valid() && cs&c.bit() != 0 }

// Best is the cipher of the set to use: AES-256-GCM if it is in the set, else ChaCha20-Poly1305.
func (cs Ciphers) Best() (Cipher, bool) {
	switch {
	case cs.Has(AES256GCM):
		return AES256GCM, true
	case cs.Has(ChaCha20Poly1305):
		return ChaCha20Poly1305, true
	}
	return 0, false
}

// Only is the set of one cipher.
func Only(c Cipher) Ciphers { return c.bit() }

// Fast returns the ciphers this machine runs fast and in constant time: ChaCha20-Poly1305
// always, AES-256-GCM where the CPU has AES and carry-less multiplication instructions.
func Fast() Ciphers {
	cs := ChaCha20Poly1305.bit()
	if cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ || cpu.ARM64.HasAES && cpu.ARM64.HasPMULL {
		cs |= AES256GCM.bit()
	}
	return cs
}

// newAEAD returns the AEAD of cipher c under key k.
func newAEAD(c Cipher, k [KeyLen]byte) (cipher.AEAD, error) {
	switch c {
	case ChaCha20Poly1305:
		return chacha20poly1305.New(k[:])
	case AES256GCM:
		b, err := aes.NewCipher(k[:])
		if err != nil {
			return nil, err
		}
		return cipher.NewGCM(b)
	}
	return nil, fmt.Errorf("session: %v", c)
}

// String lists the set's ciphers, best first.
func (cs Ciphers) String() string {
	var names []string
	for _, c := range []Cipher{AES256GCM, ChaCha20Poly1305} {
		if cs.Has(c) {
			names = append(names, c.String())
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}
