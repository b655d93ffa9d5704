// Package ident is the identity of a federation proxy: an Ed25519 key pair, and the TLS 1.3
// configurations that make two proxies authenticate each other by their pinned public keys.
//
// Each proxy presents a self-signed certificate made at start from its private key; what a
// peer checks is not the certificate chain but that the certificate's key is one it was
// configured with. TLS 1.3's CertificateVerify proves that the sender holds the private key,
// so a pinned key authenticates the peer as well as a CA would, without a CA to run.
package ident

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// ALPN is the protocol name both ends require, so that a braid proxy port cannot be mistaken
// for another TLS service or the other way round.
const ALPN = "braid-proxy/1"

// ErrKey reports a key that is not 32 bytes of standard base64.
var ErrKey = errors.New("ident: a proxy key is 32 bytes in standard base64 (as printed by 'braid proxy keygen')")

// ErrUnknownPeer is the handshake error for a peer whose key is not configured.
var ErrUnknownPeer = errors.New("ident: the peer's key is not one of the configured peers'")

// PrivateKey is an Ed25519 seed.
type PrivateKey [ed25519.SeedSize]byte

// PublicKey is an Ed25519 public key.
type PublicKey [ed25519.PublicKeySize]byte

// Generate returns a new random private key.
func Generate() (PrivateKey, error) {
	var k PrivateKey
	if _, err := rand.Read(k[:]); err != nil {
		return k, fmt.Errorf("ident: %w", err)
	}
	return k, nil
}

// String returns k in standard base64.
func (k PrivateKey) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// String returns p in standard base64.
func (p PublicKey) String() string { return base64.StdEncoding.EncodeToString(p[:]) }

// Public returns the public key of k.
func (k PrivateKey) Public() PublicKey {
	return PublicKey(ed25519.NewKeyFromSeed(k[:]).Public().(ed25519.PublicKey))
}

func parse32(s string) ([32]byte, error) {
	var k [32]byte
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 32 {
		return k, ErrKey
	}
	copy(k[:], b)
	return k, nil
}

// ParsePrivateKey reads a private key in standard base64.
func ParsePrivateKey(s string) (PrivateKey, error) {
	k, err := parse32(s)
	return PrivateKey(k), err
}

// ParsePublicKey reads a public key in standard base64.
func ParsePublicKey(s string) (PublicKey, error) {
	k, err := parse32(s)
	return PublicKey(k), err
}

// Certificate makes the self-signed certificate of k.
func Certificate(k PrivateKey) (tls.Certificate, error) {
	priv := ed25519.NewKeyFromSeed(k[:])
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "braid proxy " + k.Public().String()},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(20, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, priv.Public(), priv)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("ident: certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}, nil
}

// peerKey returns the Ed25519 key of the first certificate.
func peerKey(raw [][]byte) (PublicKey, error) {
	if len(raw) == 0 {
		return PublicKey{}, errors.New("ident: the peer sent no certificate")
	}
	c, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return PublicKey{}, fmt.Errorf("ident: peer certificate: %w", err)
	}
	pk, ok := c.PublicKey.(ed25519.PublicKey)
	if !ok {
		return PublicKey{}, errors.New("ident: the peer's certificate key is not Ed25519")
	}
	return PublicKey(pk), nil
}

// PeerKey returns the authenticated key of the other end of a finished handshake.
func PeerKey(cs tls.ConnectionState) (PublicKey, bool) {
	if len(cs.PeerCertificates) == 0 {
		return PublicKey{}, false
	}
	pk, ok := cs.PeerCertificates[0].PublicKey.(ed25519.PublicKey)
	if !ok {
		return PublicKey{}, false
	}
	return PublicKey(pk), true
}

func base(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{ALPN},
		// The chain is not what is checked: VerifyPeerCertificate compares the pinned key.
		InsecureSkipVerify: true,
	}
}

// ServerConfig accepts clients whose key allowed accepts, and only those.
func ServerConfig(cert tls.Certificate, allowed func(PublicKey) bool) *tls.Config {
	c := base(cert)
	c.ClientAuth = tls.RequireAnyClientCert
	c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		k, err := peerKey(raw)
		if err != nil {
			return err
		}
		if !allowed(k) {
			return ErrUnknownPeer
		}
		return nil
	}
	return c
}

// ClientConfig connects to the server whose key is peer, presenting cert.
func ClientConfig(cert tls.Certificate, peer PublicKey) *tls.Config {
	c := base(cert)
	c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		k, err := peerKey(raw)
		if err != nil {
			return err
		}
		if k != peer {
			return ErrUnknownPeer
		}
		return nil
	}
	return c
}
