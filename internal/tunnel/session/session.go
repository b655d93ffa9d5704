package session

import (
	"crypto/cipher"
	"errors"
	"sync"
	"sync/atomic"

	"golang.org/x/crypto/chacha20poly1305"
)

// Transport errors; the data path counts drops by these.
var (
	ErrReplay     = errors.New("session: counter replayed or too old")
	ErrAuth       = errors.New("session: packet does not authenticate")
	ErrExhausted  = errors.New("session: counter exhausted; a new handshake is needed")
	ErrCiphertext = errors.New("session: ciphertext shorter than the tag")
)

// Overhead is what Seal adds to a plaintext.
const Overhead = chacha20poly1305.Overhead

// RejectAfterMessages bounds the counter of one session: past it the session refuses to seal,
// long before a nonce could repeat.
const RejectAfterMessages = 1<<60 - 1

// Session seals and opens the transport packets of one peer in both directions. Seal and Open
// are safe for concurrent use (one sender goroutine per path, one receiver per path).
type Session struct {
	LocalIndex, RemoteIndex uint32 // receiver indices: ours (in packets to us), the peer's
	Cipher                  Cipher
	Version                 Version // the protocol version the handshake agreed on
	send, recv              cipher.AEAD
	counter                 atomic.Uint64 // next counter to send
	mu                      sync.Mutex    // guards window
	window                  Window
}

// New returns a session for keys, with the cipher they name (ChaCha20-Poly1305 when none);
// local and remote are the receiver indices.
func New(k Keys, local, remote uint32) *Session {
	c := k.Cipher
	if !c.valid() {
		c = ChaCha20Poly1305
	}
	send, _ := newAEAD(c, k.Send)
	recv, _ := newAEAD(c, k.Recv)
	return &Session{LocalIndex: local, RemoteIndex: remote, Cipher: c, Version: k.Version, send: send, recv: recv}
}

// NextCounter reserves the counter of the next packet to send; it goes in the packet's header
// before the header is sealed as associated data.
func (s *Session) NextCounter() (uint64, error) {
	c := s.counter.Add(1) - 1
	if c >= RejectAfterMessages {
		return 0, ErrExhausted
	}
	return c, nil
}

// Sent returns how many counters were used: the handshake layer rekeys on it.
func (s *Session) Sent() uint64 { return s.counter.Load() }

// NonceSize is the length of the nonce that Seal and Open take.
const NonceSize = chacha20poly1305.NonceSize

// Seal appends the sealed plaintext (with its tag) to dst. nonce (NonceSize bytes) must be
// unique for the session, which holds when it contains the counter from NextCounter; aad is the
// packet header.
func (s *Session) Seal(dst, nonce, aad, plaintext []byte) []byte {
	return s.send.Seal(dst, nonce, plaintext, aad)
}

// Open authenticates and decrypts ciphertext (sealed with nonce, which holds counter, and aad)
// and appends the plaintext to dst. A counter seen before, or too far behind the newest, is
// refused; the window moves only for packets that authenticate, so forged packets cannot
// disturb it. dst may be ciphertext[:0] to decrypt in place.
func (s *Session) Open(dst []byte, counter uint64, nonce, aad, ciphertext []byte) ([]byte, error) {
	if len(ciphertext) < Overhead {
		return nil, ErrCiphertext
	}
	if !s.fresh(counter) {
		return nil, ErrReplay
	}
	out, err := s.recv.Open(dst, nonce, ciphertext, aad)
	if err != nil {
		return nil, ErrAuth
	}
	if !s.accept(counter) {
		return nil, ErrReplay
	}
	return out, nil
}

// Sign appends to dst the tag that authenticates msg (header and payload, all in clear) under
// nonce: the AEAD over an empty plaintext with msg as associated data. It costs a MAC over msg
// and one cipher block, against a full encryption for Seal.
func (s *Session) Sign(dst, nonce, msg []byte) []byte {
	return s.send.Seal(dst, nonce, nil, msg)
}

// Verify checks the tag of a message signed with Sign, with the same replay window as Open.
func (s *Session) Verify(counter uint64, nonce, msg, tag []byte) error {
	if len(tag) != Overhead {
		return ErrCiphertext
	}
	if !s.fresh(counter) {
		return ErrReplay
	}
	if _, err := s.recv.Open(nil, nonce, tag, msg); err != nil {
		return ErrAuth
	}
	if !s.accept(counter) {
		return ErrReplay
	}
	return nil
}

// fresh reports whether counter would pass the replay window; accept records it once the
// packet has authenticated (so that forged packets cannot move the window), failing for a copy
// that raced this one through authentication.
func (s *Session) fresh(counter uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.window.Check(counter)
}

func (s *Session) accept(counter uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.window.Accept(counter)
}

// WindowSize is how far behind the newest counter a packet may arrive and still be accepted.
// Multipath reordering needs a wide window: 8192 packets is 100 ms of a 1 Gbit/s path's spread.
const WindowSize = 8192

const windowWords = WindowSize / 64

// Window is a sliding bitmap of the counters seen (RFC 6479): constant time and no allocation
// per packet. The zero value is ready.
type Window struct {
	last   uint64 // newest counter accepted
	any    bool   // whether any counter was accepted
	bitmap [windowWords + 1]uint64
}

// Check reports whether counter would be accepted, without recording it.
func (w *Window) Check(counter uint64) bool {
	if counter >= RejectAfterMessages {
		return false
	}
	if !w.any || counter > w.last {
		return true
	}
	if w.last-counter >= WindowSize {
		return false
	}
	return w.bitmap[(counter/64)%uint64(len(w.bitmap))]&(1<<(counter%64)) == 0
}

// Accept records counter and reports whether it was new and inside the window.
func (w *Window) Accept(counter uint64) bool {
	if !w.Check(counter) {
		return false
	}
	words := uint64(len(w.bitmap))
	if !w.any {
		w.any, w.last = true, counter
	} else if counter > w.last {
		// Clear the words the window slides onto (at most all of them).
		cur := w.last / 64
		for i := range min(counter/64-cur, words) {
			w.bitmap[(cur+1+i)%words] = 0
		}
		w.last = counter
	}
	w.bitmap[(counter/64)%words] |= 1 << (counter % 64)
	return true
}
