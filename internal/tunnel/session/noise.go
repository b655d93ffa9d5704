package session

import (
	"crypto/hmac"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"hash"
	"time"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/chacha20poly1305"
)

const (
	protocolName = "Noise_IK_25519_ChaChaPoly_BLAKE2s"
	prologue     = "braid tunnel v1"
	tagLen       = chacha20poly1305.Overhead
	tsLen        = 12 // TAI64N
)

// Handshake message sizes.
const (
	// InitLen: ephemeral | sealed static | sealed (timestamp | sender index | ciphers offered)
	InitLen = KeyLen + (KeyLen + tagLen) + (tsLen + 4 + 1 + tagLen)
	// ResponseLen: receiver index (clear) | ephemeral | sealed (sender index | cipher chosen)
	ResponseLen = 4 + KeyLen + (4 + 1 + tagLen)
)

// Handshake errors.
var (
	ErrHandshake = errors.New("session: handshake message does not authenticate")
	ErrLength    = errors.New("session: handshake message has the wrong length")
	ErrNoCipher  = errors.New("session: no transport cipher both sides accept")
)

// Keys are the two transport keys of a session, as seen by one side, and the cipher the
// handshake agreed on.
type Keys struct {
	Send, Recv [KeyLen]byte
	Cipher     Cipher
}

// symmetric is Noise's SymmetricState with its CipherState.
type symmetric struct {
	ck, h [blake2s.Size]byte
	k     [KeyLen]byte
	hasK  bool
	n     uint64
}

func newSymmetric() *symmetric {
	s := &symmetric{}
	// protocolName is longer than HASHLEN, so h = HASH(protocolName).
	s.h = blake2s.Sum256([]byte(protocolName))
	s.ck = s.h
	s.mixHash([]byte(prologue))
	return s
}

func (s *symmetric) mixHash(data []byte) {
	h, _ := blake2s.New256(nil)
	h.Write(s.h[:])
	h.Write(data)
	h.Sum(s.h[:0])
}

func (s *symmetric) mixKey(ikm []byte) {
	var k [KeyLen]byte
	s.ck, k = hkdf2(s.ck[:], ikm)
	s.k, s.hasK, s.n = k, true, 0
}

func (s *symmetric) nonce() []byte {
	var n [chacha20poly1305.NonceSize]byte
	binary.LittleEndian.PutUint64(n[4:], s.n) // Noise: 32 zero bits, then n little-endian
	return n[:]
}

func (s *symmetric) encryptAndHash(dst, plaintext []byte) []byte {
	aead, _ := chacha20poly1305.New(s.k[:])
	out := aead.Seal(dst, s.nonce(), plaintext, s.h[:])
	s.n++
	s.mixHash(out[len(dst):])
	return out
}

func (s *symmetric) decryptAndHash(ciphertext []byte) ([]byte, error) {
	aead, _ := chacha20poly1305.New(s.k[:])
	out, err := aead.Open(nil, s.nonce(), ciphertext, s.h[:])
	if err != nil {
		return nil, ErrHandshake
	}
	s.n++
	s.mixHash(ciphertext)
	return out, nil
}

func (s *symmetric) split() (k1, k2 [KeyLen]byte) { return hkdf2(s.ck[:], nil) }

func newHMAC(key []byte) hash.Hash {
	return hmac.New(func() hash.Hash { h, _ := blake2s.New256(nil); return h }, key)
}

// hkdf2 is Noise's HKDF with two outputs, over HMAC-BLAKE2s.
func hkdf2(ck, ikm []byte) (out1, out2 [blake2s.Size]byte) {
	m := newHMAC(ck)
	m.Write(ikm)
	temp := m.Sum(nil)
	m = newHMAC(temp)
	m.Write([]byte{1})
	m.Sum(out1[:0])
	m = newHMAC(temp)
	m.Write(out1[:])
	m.Write([]byte{2})
	m.Sum(out2[:0])
	return
}

// Timestamp is TAI64N: it orders handshakes of one initiator, so that a replayed initiation is
// refused by a responder that has seen a newer one.
type Timestamp [tsLen]byte

// NewTimestamp returns t as TAI64N.
func NewTimestamp(t time.Time) Timestamp {
	var ts Timestamp
	binary.BigEndian.PutUint64(ts[:8], uint64(0x400000000000000a+t.Unix()))
	binary.BigEndian.PutUint32(ts[8:], uint32(t.Nanosecond()))
	return ts
}

// After reports whether ts is later than o.
func (ts Timestamp) After(o Timestamp) bool {
	for i := range ts {
		if ts[i] != o[i] {
			return ts[i] > o[i]
		}
	}
	return false
}

// Initiator is the initiating side of a handshake in progress.
type Initiator struct {
	sym    *symmetric
	local  PrivateKey
	remote PublicKey
	eph    PrivateKey
	index  uint32
	offer  Ciphers
}

// Initiate starts a handshake from local to the peer whose static key is remote. index is the
// initiator's receiver index for the new session, offer the transport ciphers it accepts (the
// responder chooses). It returns the initiation message (InitLen bytes) to send.
func Initiate(local PrivateKey, remote PublicKey, index uint32, offer Ciphers, now time.Time) (*Initiator, []byte, error) {
	eph, err := GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	return initiate(local, remote, eph, index, offer, now)
}

func initiate(local PrivateKey, remote PublicKey, eph PrivateKey, index uint32, offer Ciphers, now time.Time) (*Initiator, []byte, error) {
	if offer&AllCiphers == 0 {
		return nil, nil, ErrNoCipher
	}
	in := &Initiator{sym: newSymmetric(), local: local, remote: remote, eph: eph, index: index, offer: offer & AllCiphers}
	s := in.sym
	s.mixHash(remote[:]) // pre-message: <- s
	msg := make([]byte, 0, InitLen)
	e := eph.Public()
	msg = append(msg, e[:]...) // -> e
	s.mixHash(e[:])
	es, err := dh(&eph, &remote) // es
	if err != nil {
		return nil, nil, err
	}
	s.mixKey(es[:])
	pub := local.Public()
	msg = s.encryptAndHash(msg, pub[:]) // s
	ss, err := dh(&local, &remote)      // ss
	if err != nil {
		return nil, nil, err
	}
	s.mixKey(ss[:])
	var payload [tsLen + 4 + 1]byte
	ts := NewTimestamp(now)
	copy(payload[:], ts[:])
	binary.BigEndian.PutUint32(payload[tsLen:], index)
	payload[tsLen+4] = byte(in.offer)
	msg = s.encryptAndHash(msg, payload[:])
	return in, msg, nil
}

// Finish consumes the responder's message and returns the session keys and the responder's
// receiver index. A response that chose a cipher the initiator did not offer is refused.
func (in *Initiator) Finish(resp []byte) (Keys, uint32, error) {
	if len(resp) != ResponseLen {
		return Keys{}, 0, ErrLength
	}
	if binary.BigEndian.Uint32(resp[:4]) != in.index {
		return Keys{}, 0, ErrHandshake
	}
	s := *in.sym // a forged response must not spoil the state for the real one
	var re PublicKey
	copy(re[:], resp[4:4+KeyLen])
	s.mixHash(re[:]) // <- e
	ee, err := dh(&in.eph, &re)
	if err != nil {
		return Keys{}, 0, ErrHandshake
	}
	s.mixKey(ee[:])
	se, err := dh(&in.local, &re)
	if err != nil {
		return Keys{}, 0, ErrHandshake
	}
	s.mixKey(se[:])
	payload, err := s.decryptAndHash(resp[4+KeyLen:])
	if err != nil {
		return Keys{}, 0, err
	}
	chosen := Cipher(payload[4])
	if !chosen.valid() || in.offer&chosen.bit() == 0 {
		return Keys{}, 0, ErrNoCipher
	}
	k1, k2 := s.split()
	return Keys{Send: k1, Recv: k2, Cipher: chosen}, binary.BigEndian.Uint32(payload), nil
}

// Initiation is a verified initiation message, not yet answered.
type Initiation struct {
	Peer        PublicKey // the initiator's static key: look it up before answering
	Timestamp   Timestamp // refuse it unless it is after the peer's last one
	SenderIndex uint32    // the initiator's receiver index
	Offer       Ciphers   // the transport ciphers the initiator accepts
	sym         *symmetric
	local       PrivateKey
	re          PublicKey
}

// Receive verifies an initiation message addressed to local.
func Receive(local PrivateKey, msg []byte) (*Initiation, error) {
	if len(msg) != InitLen {
		return nil, ErrLength
	}
	s := newSymmetric()
	pub := local.Public()
	s.mixHash(pub[:])
	var re PublicKey
	copy(re[:], msg[:KeyLen])
	s.mixHash(re[:])
	es, err := dh(&local, &re)
	if err != nil {
		return nil, ErrHandshake
	}
	s.mixKey(es[:])
	off := KeyLen
	static, err := s.decryptAndHash(msg[off : off+KeyLen+tagLen])
	if err != nil {
		return nil, err
	}
	off += KeyLen + tagLen
	var rs PublicKey
	copy(rs[:], static)
	ss, err := dh(&local, &rs)
	if err != nil {
		return nil, ErrHandshake
	}
	s.mixKey(ss[:])
	payload, err := s.decryptAndHash(msg[off:])
	if err != nil {
		return nil, err
	}
	in := &Initiation{Peer: rs, sym: s, local: local, re: re, SenderIndex: binary.BigEndian.Uint32(payload[tsLen:]),
		Offer: Ciphers(payload[tsLen+4]) & AllCiphers}
	copy(in.Timestamp[:], payload[:tsLen])
	return in, nil
}

// Respond answers a verified initiation; index is the responder's receiver index for the new
// session, accept the transport ciphers the responder accepts: the best one both accept is
// chosen (ErrNoCipher if there is none). It returns the response message and the session keys.
func (in *Initiation) Respond(index uint32, accept Ciphers) ([]byte, Keys, error) {
	eph, err := GenerateKey()
	if err != nil {
		return nil, Keys{}, err
	}
	return in.respond(eph, index, accept)
}

func (in *Initiation) respond(eph PrivateKey, index uint32, accept Ciphers) ([]byte, Keys, error) {
	chosen, ok := (in.Offer & accept).Best()
	if !ok {
		return nil, Keys{}, ErrNoCipher
	}
	s := in.sym
	msg := make([]byte, 4, ResponseLen)
	binary.BigEndian.PutUint32(msg, in.SenderIndex)
	e := eph.Public()
	msg = append(msg, e[:]...)
	s.mixHash(e[:])
	ee, err := dh(&eph, &in.re)
	if err != nil {
		return nil, Keys{}, ErrHandshake
	}
	s.mixKey(ee[:])
	se, err := dh(&eph, &in.Peer)
	if err != nil {
		return nil, Keys{}, ErrHandshake
	}
	s.mixKey(se[:])
	var payload [4 + 1]byte
	binary.BigEndian.PutUint32(payload[:], index)
	payload[4] = byte(chosen)
	msg = s.encryptAndHash(msg, payload[:])
	k1, k2 := s.split()
	return msg, Keys{Send: k2, Recv: k1, Cipher: chosen}, nil
}

// Equal reports whether two public keys are equal, in constant time.
func (p PublicKey) Equal(o PublicKey) bool { return subtle.ConstantTimeCompare(p[:], o[:]) == 1 }
