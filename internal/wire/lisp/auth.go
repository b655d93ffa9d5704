package lisp

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
)

// Errors of Sign and Verify.
var (
	ErrAlgorithm  = errors.New("lisp: unknown authentication algorithm")
	ErrAuthLength = errors.New("lisp: authentication data length does not fit the algorithm")
	ErrNoAuth     = errors.New("lisp: message is not authenticated")
	ErrAuth       = errors.New("lisp: authentication data does not match")
)

// authOffset is where the authentication data starts in a Map-Register, Map-Notify or
// Map-Notify-Ack.
const authOffset = 16

// AuthLen returns the digest length deployed peers send for alg: 20 for HMAC-SHA-1, 32 for
// HMAC-SHA-256, 0 otherwise.
func AuthLen(alg uint8) int {
	switch alg {
	case AlgHMACSHA1:
		return sha1.Size
	case AlgHMACSHA256:
		return sha256.Size
	}
	return 0
}

// authHash returns the HMAC of alg keyed with key, after checking that length is one of the
// algorithm's lengths: the full digest, or the truncated one its RFC name implies (12 bytes for
// HMAC-SHA-1-96, 16 for HMAC-SHA-256-128).
func authHash(alg uint8, length int, key []byte) (hash.Hash, error) {
	switch alg {
	case AlgHMACSHA1:
		if length != 20 && length != 12 {
			return nil, ErrAuthLength
		}
		return hmac.New(sha1.New, key), nil
	case AlgHMACSHA256:
		if length != 32 && length != 16 {
			return nil, ErrAuthLength
		}
		return hmac.New(sha256.New, key), nil
	case AlgNone:
		return nil, ErrNoAuth
	}
	return nil, ErrAlgorithm
}

// authField returns the algorithm and the authentication data of the encoded message msg.
func authField(msg []byte) (alg uint8, field []byte, err error) {
	if len(msg) < authOffset {
		return 0, nil, ErrTruncated
	}
	if t := Type(msg); t < TypeMapRegister || t > TypeMapNotifyAck {
		return 0, nil, ErrType
	}
	l := int(binary.BigEndian.Uint16(msg[14:]))
	if len(msg) < authOffset+l {
		return 0, nil, ErrTruncated
	}
	return msg[13], msg[authOffset : authOffset+l], nil
}

// digest computes the HMAC over msg with the authentication data taken as zeros, the rule of
// RFC 9301 §5.6, without changing msg.
func digest(h hash.Hash, msg []byte, fieldLen int, out []byte) []byte {
	var zeros [32]byte
	h.Write(msg[:authOffset])
	h.Write(zeros[:fieldLen])
	h.Write(msg[authOffset+fieldLen:])
	return h.Sum(out)
}

// Sign fills the authentication data of the encoded Map-Register, Map-Notify or Map-Notify-Ack
// msg with the HMAC of its algorithm under key, truncated to the length its header announces
// (encode the message with AuthData = make([]byte, AuthLen(alg)) or the truncated length).
func Sign(msg, key []byte) error {
	alg, field, err := authField(msg)
	if err != nil {
		return err
	}
	h, err := authHash(alg, len(field), key)
	if err != nil {
		return err
	}
	var buf [32]byte
	sum := digest(h, msg, len(field), buf[:0])
	copy(field, sum)
	return nil
}

// Verify checks the authentication data of the encoded message msg under key: the leftmost
// bytes of the HMAC, as many as were sent, compared in constant time. It returns ErrNoAuth for
// algorithm 0, ErrAlgorithm or ErrAuthLength for a field it cannot check, ErrAuth on mismatch.
func Verify(msg, key []byte) error {
	alg, field, err := authField(msg)
	if err != nil {
		return err
	}
	h, err := authHash(alg, len(field), key)
	if err != nil {
		return err
	}
	var buf [32]byte
	sum := digest(h, msg, len(field), buf[:0])
	if !hmac.Equal(sum[:len(field)], field) {
		return ErrAuth
	}
	return nil
}
