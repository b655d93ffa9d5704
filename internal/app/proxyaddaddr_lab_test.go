package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"braid/internal/experiment/federation"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/pmnl"
	"braid/internal/proxy/ident"
)

// TestProxyAddAddrAfterAuth performs the address-leak attack on a running proxy (p2, two
// uplinks, path manager braid): host p1, acting as the attacker, opens an MPTCP connection to
// the peer port and never authenticates; its kernel must receive no ADD_ADDR (the proxy's
// other uplink address stays unknown). Then the real peer key authenticates on another
// connection, and that one is told the other uplink.
func TestProxyAddAddrAfterAuth(t *testing.T) {
	labtest.Require(t)
	l := labtest.Up(t, federation.FederationTopology("paddr", true, topo.Shape{}, topo.Shape{}))
	p1h, p2h := l.Host("p1"), l.Host("p2")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	k1, k2, err := roles.ProxyKeys()
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	t.Setenv("BRAID_TEST_MAIN", "1")
	// p2 alone, pool 0: nothing but the attacker and the test's peer connects.
	p2, err := roles.StartProxy(p2h, self, t.TempDir(), federation.FedSite{Side: 2, Links: 2, Key: k2, PeerKey: k1.Public(), Pool: -1}.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p2.Stop()
		if t.Failed() {
			t.Logf("p2 log:\n%s", p2.Log())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := roles.ProxyStatus(ctx, p2h); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("p2 does not answer: %v", err)
		}
	}
	events, err := pmnl.Subscribe(pmnl.Options{NetNS: p1h.NS.Handle()})
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	peerAddr := fmt.Sprintf("10.9.0.2:%d", federation.FedBluePeer)
	other := netip.MustParseAddr("10.9.1.2") // p2's second uplink

	// announced collects the ADD_ADDRs p1's kernel receives for within.
	announced := func(within time.Duration) []netip.Addr {
		var out []netip.Addr
		ectx, ecancel := context.WithTimeout(ctx, within)
		defer ecancel()
		for {
			e, err := events.Next(ectx)
			if err != nil {
				return out
			}
			if e.Type == pmnl.EventAnnounced {
				out = append(out, e.Remote.Addr())
			}
		}
	}

	attacker, err := dialMPTCP(ctx, p1h, peerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer attacker.Close()
	attacker.Write([]byte("GET / HTTP/1.1\r\n\r\n")) // data, so that the connection is fully established
	if got := announced(2 * time.Second); len(got) > 0 {
		t.Errorf("an unauthenticated MPTCP client was told %v", got)
	}
	attacker.Close()

	// The real peer: TLS with the key p2 pins, then the ready byte; now the other uplink comes.
	raw, err := dialMPTCP(ctx, p1h, peerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	cert, _ := ident.Certificate(k1)
	tc := tls.Client(raw, ident.ClientConfig(cert, k2.Public()))
	ready := make([]byte, 1)
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(tc, ready); err != nil {
		t.Fatal(err)
	}
	got := announced(3 * time.Second)
	found := false
	for _, a := range got {
		found = found || a == other
	}
	if !found {
		t.Errorf("the authenticated peer was told %v, want %s", got, other)
	}
}

// dialMPTCP opens an MPTCP connection from h.
func dialMPTCP(ctx context.Context, h *lab.Host, addr string) (net.Conn, error) {
	var c net.Conn
	d := net.Dialer{}
	d.SetMultipathTCP(true)
	err := h.NS.Spawn(func() error {
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}
