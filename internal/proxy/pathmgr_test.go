package proxy

import (
	"net/netip"
	"testing"
	"time"

	"braid/internal/mptcp/pmnl"
)

// TestAnnounceOnlyAfterAuth: the announcer sends this site's uplink addresses (ADD_ADDR) on a
// peer's connection only once it is both established and authenticated, in either order, once;
// a connection that never authenticates (a scanner, a peer with a wrong key) learns nothing,
// and an authentication that names another connection announces on none.
func TestAnnounceOnlyAfterAuth(t *testing.T) {
	ap := netip.MustParseAddrPort
	local, remote := ap("192.0.2.1:7101"), ap("198.51.100.7:40000")
	now := time.Now()
	created := func(tok uint32, l, r netip.AddrPort) pmnl.Event {
		return pmnl.Event{Type: pmnl.EventCreated, Token: tok, Local: l, Remote: r, ServerSide: true}
	}
	est := func(tok uint32) pmnl.Event { return pmnl.Event{Type: pmnl.EventEstablished, Token: tok} }

	s := newAnnState([]uint16{7101})
	// The attacker's connection: established, never authenticated.
	for _, e := range []pmnl.Event{created(1, local, remote), est(1)} {
		if _, _, due := s.event(e, now); due {
			t.Fatalf("announced on %v before authentication", e)
		}
	}
	// Another connection authenticates: still nothing on token 1.
	if _, _, due := s.auth(local, ap("198.51.100.8:40000"), now); due {
		t.Fatal("an authentication of another connection announced")
	}
	// Its own authentication: due once, on the connection's local address.
	tok, initial, due := s.auth(local, remote, now)
	if !due || tok != 1 || initial != local.Addr() {
		t.Fatalf("after authentication: %v %v %v", tok, initial, due)
	}
	if _, _, due := s.auth(local, remote, now); due {
		t.Fatal("announced twice")
	}

	// Authentication before the kernel's events (IPv4-mapped on one side): due on established.
	r2 := ap("198.51.100.9:40001")
	if _, _, due := s.auth(netip.AddrPortFrom(netip.AddrFrom16(local.Addr().As16()), 7101), r2, now); due {
		t.Fatal("due without events")
	}
	if _, _, due := s.event(created(2, local, r2), now); due {
		t.Fatal("due before established")
	}
	if tok, _, due := s.event(est(2), now); !due || tok != 2 {
		t.Fatalf("authenticated early, then established: %v %v", tok, due)
	}
	// An early authentication that is too old counts for nothing.
	r3 := ap("198.51.100.9:40002")
	s.auth(local, r3, now)
	s.event(created(3, local, r3), now.Add(earlyAuthTTL+time.Second))
	if _, _, due := s.event(est(3), now.Add(earlyAuthTTL+time.Second)); due {
		t.Fatal("a stale early authentication announced")
	}
	// Other ports and client-side connections are not ours.
	s.auth(ap("192.0.2.1:9999"), r3, now)
	s.event(created(4, ap("192.0.2.1:9999"), r3), now)
	if _, _, due := s.event(est(4), now); due {
		t.Fatal("announced on a port that is no peer port")
	}
	// Early authentications are bounded.
	for i := range maxEarlyAuth + 100 {
		s.auth(local, netip.AddrPortFrom(netip.MustParseAddr("203.0.113.1"), uint16(i)), now)
	}
	if len(s.authed) > maxEarlyAuth {
		t.Errorf("%d early authentications kept, max %d", len(s.authed), maxEarlyAuth)
	}
}
