package session

import (
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/chacha20poly1305"
)

// The cookie, as WireGuard's: a responder under load answers an initiation that carries no
// valid mac2 with a cookie reply instead of doing the handshake's work. The cookie is a MAC of
// the initiation's source address under a secret of the responder's that changes every
// CookieSecretLife, so only a sender that receives at that address learns it; the initiator's
// next initiations from that address carry mac2, a MAC over the initiation and its mac1 keyed
// with the cookie, and a responder under load takes only those. A flood from spoofed sources
// then costs the responder one cookie reply each (smaller than the initiation: no
// amplification) and no handshake work, and takes no place from a peer that proves its address.
//
// On the wire an initiation is msg | mac1 | mac2, mac2 present only when the initiator holds a
// cookie for the path; the responder tells the two forms apart by which of them closes with a
// valid mac1 (SplitInitiation). A cookie reply is nonce (24) | the cookie sealed by
// XChaCha20-Poly1305 (16 + 16) under BLAKE2s-256("cookie--" || the responder's public key),
// with the mac1 of the initiation it answers as associated data: only the initiator that sent
// that initiation can open it, and it cannot be replayed onto another one.
const (
	// MAC2Len is the length of the mac2 that may follow mac1 on an initiation.
	MAC2Len = 16
	// CookieLen is the length of a cookie.
	CookieLen = 16
	// CookieReplyLen is the length of a cookie reply message.
	CookieReplyLen = chacha20poly1305.NonceSizeX + CookieLen + tagLen
	// CookieSecretLife is how long the responder's secret lasts; a cookie is taken under the
	// current secret and the one before it, so for at least this long after it was issued.
	CookieSecretLife = 2 * time.Minute
	// CookieUseFor is how long an initiator uses a cookie it received: less than
	// CookieSecretLife, so that a cookie in use is always one the responder takes.
	CookieUseFor = CookieSecretLife - 10*time.Second
)

// Cookie is what a cookie reply carries.
type Cookie [CookieLen]byte

// ErrCookieReply reports a cookie reply that is not CookieReplyLen bytes or does not open
// with the responder's key and the mac1 it answers.
var ErrCookieReply = errors.New("session: cookie reply malformed or not for this initiation")

// SplitInitiation splits the body of an initiation message into the initiation, its mac1 and
// its mac2 (nil when the initiator had no cookie), given the mac1 key of this side's public
// key (MAC1Key). It reports false when neither form closes with a valid mac1.
func SplitInitiation(b []byte, mac1Key *[blake2s.Size]byte) (msg, mac1, mac2 []byte, ok bool) {
	if msg, ok := CheckMAC1(b, mac1Key); ok {
		return msg, b[len(msg):], nil, true
	}
	if len(b) < MAC1Len+MAC2Len {
		return nil, nil, nil, false
	}
	withMAC1 := b[:len(b)-MAC2Len]
	if msg, ok := CheckMAC1(withMAC1, mac1Key); ok {
		return msg, withMAC1[len(msg):], b[len(withMAC1):], true
	}
	return nil, nil, nil, false
}

// AppendMAC2 appends to b (an initiation closed by its mac1) its mac2 under cookie.
func AppendMAC2(b []byte, cookie *Cookie) []byte {
	m := mac2(b, cookie)
	return append(b, m[:]...)
}

func mac2(b []byte, cookie *Cookie) (out [MAC2Len]byte) {
	h, err := blake2s.New128(cookie[:])
	if err != nil {
		panic(err) // a 16-byte key is always valid
	}
	h.Write(b)
	h.Sum(out[:0])
	return out
}

// cookieKey is the key that seals cookie replies from the holder of pub.
func cookieKey(pub PublicKey) [blake2s.Size]byte {
	return blake2s.Sum256(append([]byte("cookie--"), pub[:]...))
}

// OpenCookieReply opens a cookie reply from the holder of responder, answering the initiation
// whose mac1 is mac1.
func OpenCookieReply(reply []byte, responder PublicKey, mac1 []byte) (Cookie, error) {
	var c Cookie
	if len(reply) != CookieReplyLen {
		return c, ErrCookieReply
	}
	k := cookieKey(responder)
	aead, err := chacha20poly1305.NewX(k[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	nonce := reply[:chacha20poly1305.NonceSizeX]
	if _, err := aead.Open(c[:0], nonce, reply[len(nonce):], mac1); err != nil {
		return Cookie{}, ErrCookieReply
	}
	return c, nil
}

// Cookies is a responder's side of the cookie: the rotating secret, the check of mac2 and the
// sealing of replies. It is safe for concurrent use.
type Cookies struct {
	aead cipher.AEAD // seals replies under cookieKey of this side's public key
	// A reply's nonce is salt followed by a counter: unique per key, which is all XChaCha20
	// needs, without a read of the system's random source per reply (a flood's cost).
	salt [chacha20poly1305.NonceSizeX - 8]byte
	ctr  atomic.Uint64

	mu      sync.Mutex
	secret  [2][blake2s.Size]byte // current, previous
	born    int64                 // when secret[0] was drawn (monotonic nanoseconds)
	started bool
}

// NewCookies returns the cookie state of the holder of pub.
func NewCookies(pub PublicKey) *Cookies {
	k := cookieKey(pub)
	aead, err := chacha20poly1305.NewX(k[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	c := &Cookies{aead: aead}
	rand.Read(c.salt[:])
	return c
}

// secretsLocked returns the current and previous secrets at now, drawing a new one when the
// current one is older than CookieSecretLife.
func (c *Cookies) secretsLocked(now int64) [2][blake2s.Size]byte {
	if !c.started || time.Duration(now-c.born) >= CookieSecretLife {
		prev := c.secret[0]
		if !c.started || time.Duration(now-c.born) >= 2*CookieSecretLife {
			rand.Read(prev[:]) // the old one has expired too: nothing may match it
		}
		c.secret[1] = prev
		rand.Read(c.secret[0][:])
		c.born, c.started = now, true
	}
	return c.secret
}

// cookieFor is the cookie of src under secret.
func cookieFor(secret *[blake2s.Size]byte, src netip.AddrPort) (out Cookie) {
	h, err := blake2s.New128(secret[:])
	if err != nil {
		panic(err)
	}
	a := src.Addr().As16()
	h.Write(a[:])
	h.Write([]byte{byte(src.Port() >> 8), byte(src.Port())})
	h.Sum(out[:0])
	return out
}

// CheckMAC2 reports whether mac2 is right for b (the initiation and its mac1) sent from src,
// under a cookie of the current or the previous secret at now.
func (c *Cookies) CheckMAC2(b, mac2b []byte, src netip.AddrPort, now int64) bool {
	if len(mac2b) != MAC2Len {
		return false
	}
	c.mu.Lock()
	secrets := c.secretsLocked(now)
	c.mu.Unlock()
	ok := 0
	for i := range secrets {
		ck := cookieFor(&secrets[i], src)
		m := mac2(b, &ck)
		ok |= subtle.ConstantTimeCompare(m[:], mac2b)
	}
	return ok == 1
}

// AppendReply appends to dst the cookie reply to an initiation closed by mac1 sent from src.
func (c *Cookies) AppendReply(dst, mac1 []byte, src netip.AddrPort, now int64) []byte {
	c.mu.Lock()
	secrets := c.secretsLocked(now)
	c.mu.Unlock()
	ck := cookieFor(&secrets[0], src)
	var nonce [chacha20poly1305.NonceSizeX]byte
	copy(nonce[:], c.salt[:])
	binary.BigEndian.PutUint64(nonce[len(c.salt):], c.ctr.Add(1))
	dst = append(dst, nonce[:]...)
	return c.aead.Seal(dst, nonce[:], ck[:], mac1)
}
