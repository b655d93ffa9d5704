package ident

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"
)

// handshake runs a TLS handshake over an in-memory pipe and returns each side's error (the
// client's includes the server's verdict on its certificate, which TLS 1.3 clients learn on
// their first read) and the client key the server authenticated.
func handshake(t *testing.T, srv, cli *tls.Config) (serverErr, clientErr error, peer PublicKey) {
	t.Helper()
	a, b := net.Pipe()
	// A side that rejects the other may block writing its alert into the unbuffered pipe while
	// the other still writes its own flight: the deadline ends that.
	deadline := time.Now().Add(time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, srv)
		err := s.Handshake()
		if err == nil {
			peer, _ = PeerKey(s.ConnectionState())
			_, err = s.Write([]byte{1})
		}
		a.Close()
		done <- err
	}()
	c := tls.Client(b, cli)
	clientErr = c.Handshake()
	if clientErr == nil {
		_, clientErr = c.Read(make([]byte, 1))
	}
	b.Close()
	serverErr = <-done
	return
}

func mustKey(t *testing.T) (PrivateKey, tls.Certificate) {
	k, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Certificate(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, c
}

func TestMutualAuthentication(t *testing.T) {
	ka, ca := mustKey(t)
	kb, cb := mustKey(t)
	kc, cc := mustKey(t)
	only := func(p PublicKey) func(PublicKey) bool { return func(k PublicKey) bool { return k == p } }

	// a (client) and b (server) know each other.
	se, ce, peer := handshake(t, ServerConfig(cb, only(ka.Public())), ClientConfig(ca, kb.Public()))
	if se != nil || ce != nil || peer != ka.Public() {
		t.Fatalf("configured pair: server %v, client %v, peer %v", se, ce, peer)
	}
	// c is not configured at b: refused.
	se, _, _ = handshake(t, ServerConfig(cb, only(ka.Public())), ClientConfig(cc, kb.Public()))
	if !errors.Is(se, ErrUnknownPeer) {
		t.Errorf("unknown client: server %v", se)
	}
	// a expects b but reaches c: a refuses.
	_, ce, _ = handshake(t, ServerConfig(cc, only(ka.Public())), ClientConfig(ca, kb.Public()))
	if !errors.Is(ce, ErrUnknownPeer) {
		t.Errorf("wrong server: client %v", ce)
	}
	_ = kc
}

func TestKeyText(t *testing.T) {
	k, _ := mustKey(t)
	k2, err := ParsePrivateKey(k.String())
	if err != nil || k2 != k {
		t.Fatalf("round trip: %v", err)
	}
	p, err := ParsePublicKey(k.Public().String())
	if err != nil || p != k.Public() {
		t.Fatalf("public round trip: %v", err)
	}
	for _, s := range []string{"", "abc", "AAAA", k.String() + "AAAA"} {
		if _, err := ParsePrivateKey(s); !errors.Is(err, ErrKey) {
			t.Errorf("%q: %v", s, err)
		}
	}
}
