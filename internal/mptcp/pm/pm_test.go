package pm

import (
	"net/netip"
	"testing"

	"braid/internal/mptcp/pm/core"
	"braid/internal/mptcp/pmnl"
)

func TestToCore(t *testing.T) {
	for _, c := range []struct {
		in   pmnl.Event
		want core.Event
	}{
		{pmnl.Event{Type: pmnl.EventSubEstablished, Token: 7, LocID: 2, RemID: 1, Backup: true,
			Local: netip.MustParseAddrPort("10.9.1.1:40001"), Remote: netip.MustParseAddrPort("10.9.1.2:5000")},
			core.Event{Kind: core.SubEstablished, Token: 7, LocID: 2, RemID: 1, Backup: true,
				Local: core.Endpoint{Addr: "10.9.1.1", Port: 40001}, Remote: core.Endpoint{Addr: "10.9.1.2", Port: 5000}}},
		{pmnl.Event{Type: pmnl.EventCreated, Token: 8, ServerSide: true,
			Local: netip.MustParseAddrPort("[fd09::2]:5000"), Remote: netip.MustParseAddrPort("[fd09::1]:41000")},
			core.Event{Kind: core.Created, Token: 8, ServerSide: true, V6: true,
				Local: core.Endpoint{Addr: "fd09::2", Port: 5000}, Remote: core.Endpoint{Addr: "fd09::1", Port: 41000}}},
		{pmnl.Event{Type: pmnl.EventAnnounced, Token: 9, RemID: 3, Remote: netip.MustParseAddrPort("10.9.1.2:0")},
			core.Event{Kind: core.Announced, Token: 9, RemID: 3, Remote: core.Endpoint{Addr: "10.9.1.2"}}},
		{pmnl.Event{Type: pmnl.EventClosed, Token: 10}, core.Event{Kind: core.Closed, Token: 10}},
		// v4-mapped addresses (a dual-stack socket) are IPv4 to the policy.
		{pmnl.Event{Type: pmnl.EventEstablished, Token: 11, Local: netip.MustParseAddrPort("[::ffff:10.9.0.1]:1"), Remote: netip.MustParseAddrPort("[::ffff:10.9.0.2]:2")},
			core.Event{Kind: core.Established, Token: 11, Local: core.Endpoint{Addr: "10.9.0.1", Port: 1}, Remote: core.Endpoint{Addr: "10.9.0.2", Port: 2}}},
	} {
		if got := toCore(c.in); got != c.want {
			t.Errorf("%v:\n got %+v\nwant %+v", c.in, got, c.want)
		}
	}
}
