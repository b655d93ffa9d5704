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
	// InitLen: ephemeral | sealed static | sealed (timestamp | sender index | ciphers offered |
	// protocol versions spoken)
	InitLen = KeyLen + (KeyLen + tagLen) + (initPayloadLen + tagLen)
	// V1InitLen is the initiation of protocol version 1, which had no versions field.
	V1InitLen = InitLen - 2
	// ResponseLen: receiver index (clear) | ephemeral | sealed (sender index | cipher chosen |
	// version chosen)
	ResponseLen = 4 + KeyLen + (respPayloadLen + tagLen)
	// MaxInitLen and MaxResponseLen: a later protocol version may append fields to the sealed
	// payloads; a receiver reads the fields it knows and ignores the rest, up to these lengths.
	MaxInitLen     = InitLen + maxExtension
	MaxResponseLen = ResponseLen + maxExtension

	initPayloadLen = tsLen + 4 + 1 + 2
	respPayloadLen = 4 + 1 + 1
	maxExtension   = 64
)

// Handshake errors.
var (
	ErrHandshake = errors.New("session: handshake message does not authenticate")
	ErrLength    = errors.New("session: handshake message has the wrong length")
	ErrNoCipher  = errors.New("session: no transport cipher both sides accept")
)

// Keys are the two transport keys of a session, as seen by one side, and the cipher and
// protocol version the handshake agreed on.
type Keys struct {
	Send, Recv [KeyLen]byte
	Cipher     Cipher
	Version    Version
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
	speak  Versions
}

// Initiate starts a handshake from local to the peer whose static key is remote. index is the
// initiator's receiver index for the new session, offer the transport ciphers it accepts (the
// responder chooses), and the protocol versions offered are Supported. It returns the
// initiation message (InitLen bytes) to send.
func Initiate(local PrivateKey, remote PublicKey, index uint32, offer Ciphers, now time.Time) (*Initiator, []byte, error) {
	return InitiateSpeaking(local, remote, index, offer, Supported, now)
}

// InitiateSpeaking is Initiate offering the versions speak (a subset of Supported: a site
// that plays an older release in a test).
func InitiateSpeaking(local PrivateKey, remote PublicKey, index uint32, offer Ciphers, speak Versions, now time.Time) (*Initiator, []byte, error) {
	eph, err := GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	return initiate(local, remote, eph, index, offer, speak&Supported, now, 0)
}

// initiate builds an initiation offering the versions speak. extra is for the tests of other
// versions' messages: that many zero bytes are appended to the payload (a later version's
// fields), or with -2 the versions field is left out (a version 1 initiation).
func initiate(local PrivateKey, remote PublicKey, eph PrivateKey, index uint32, offer Ciphers, speak Versions, now time.Time, extra int) (*Initiator, []byte, error) {
	if offer&AllCiphers == 0 {
		return nil, nil, ErrNoCipher
	}
	if _, ok := speak.Best(); !ok {
		return nil, nil, ErrVersion
	}
	in := &Initiator{sym: newSymmetric(), local: local, remote: remote, eph: eph, index: index, offer: offer & AllCiphers, speak: speak &^ 1}
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
	payload := make([]byte, initPayloadLen+extra)
	ts := NewTimestamp(now)
	copy(payload[:], ts[:])
	binary.BigEndian.PutUint32(payload[tsLen:], index)
	payload[tsLen+4] = byte(in.offer)
	if extra != -2 {
		binary.BigEndian.PutUint16(payload[tsLen+5:], uint16(in.speak))
	}
	msg = s.encryptAndHash(msg, payload)
	return in, msg, nil
}

// Finish consumes the responder's message and returns the session keys and the responder's
// receiver index. A response that chose a cipher or a protocol version the initiator did not
// offer is refused (ErrNoCipher, ErrVersion). Sealed bytes after the fields this version knows
// (a later version's) are ignored.
func (in *Initiator) Finish(resp []byte) (Keys, uint32, error) {
	if len(resp) < ResponseLen || len(resp) > MaxResponseLen {
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
	version := Version(payload[5])
	if !in.speak.Has(version) {
		return Keys{}, 0, ErrVersion
	}
	k1, k2 := s.split()
	return Keys{Send: k1, Recv: k2, Cipher: chosen, Version: version}, binary.BigEndian.Uint32(payload), nil
}

// Initiation is a verified initiation message, not yet answered.
type Initiation struct {
	Peer        PublicKey // the initiator's static key: look it up before answering
	Timestamp   Timestamp // refuse it unless it is after the peer's last one
	SenderIndex uint32    // the initiator's receiver index
	Offer       Ciphers   // the transport ciphers the initiator accepts
	// Versions are the protocol versions the initiator speaks: V1 alone for an initiation of
	// V1InitLen bytes (a release before versions), which Respond refuses with ErrVersion.
	Versions Versions
	sym      *symmetric
	local    PrivateKey
	re       PublicKey
}

// Receive verifies an initiation message addressed to local: of InitLen bytes, or up to
// MaxInitLen (a later version's, whose extra fields are ignored), or of V1InitLen (version 1,
// which is verified so that the log can say who speaks it, and refused by Respond).
func Receive(local PrivateKey, msg []byte) (*Initiation, error) {
	if len(msg) != V1InitLen && (len(msg) < InitLen || len(msg) > MaxInitLen) {
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
		Offer: Ciphers(payload[tsLen+4]) & AllCiphers, Versions: V1.bit()}
	if len(msg) != V1InitLen {
		in.Versions = Versions(binary.BigEndian.Uint16(payload[tsLen+5:])) &^ 1
	}
	copy(in.Timestamp[:], payload[:tsLen])
	return in, nil
}

// Respond answers a verified initiation; index is the responder's receiver index for the new
// session, accept the transport ciphers the responder accepts: the highest protocol version
// both speak (ErrVersion if there is none) and the best cipher both accept (ErrNoCipher if
// there is none) are chosen. It returns the response message and the session keys.
func (in *Initiation) Respond(index uint32, accept Ciphers) ([]byte, Keys, error) {
	return in.RespondSpeaking(index, accept, Supported)
}

// RespondSpeaking is Respond choosing among the versions speak (a subset of Supported).
func (in *Initiation) RespondSpeaking(index uint32, accept Ciphers, speak Versions) ([]byte, Keys, error) {
	eph, err := GenerateKey()
	if err != nil {
		return nil, Keys{}, err
	}
	return in.respond(eph, index, accept, speak&Supported, 0)
}

// respond answers with the versions speak; extra zero bytes are appended to the payload (a
// later version's fields, for tests).
func (in *Initiation) respond(eph PrivateKey, index uint32, accept Ciphers, speak Versions, extra int) ([]byte, Keys, error) {
	version, ok := (in.Versions & speak).Best()
	if !ok {
		return nil, Keys{}, ErrVersion
	}
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
	payload := make([]byte, respPayloadLen+extra)
	binary.BigEndian.PutUint32(payload, index)
	payload[4] = byte(chosen)
	payload[5] = byte(version)
	msg = s.encryptAndHash(msg, payload)
	k1, k2 := s.split()
	return msg, Keys{Send: k2, Recv: k1, Cipher: chosen, Version: version}, nil
}

// Equal reports whether two public keys are equal, in constant time.
func (p PublicKey) Equal(o PublicKey) bool { return subtle.ConstantTimeCompare(p[:], o[:]) == 1 }
