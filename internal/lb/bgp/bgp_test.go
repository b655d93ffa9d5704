package bgp

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// freePort returns a TCP port of 127.0.0.1 that nothing listens on.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// router is a second BGP speaker standing for the upstream router: it listens, takes
// everything the balancer announces, and lets the test read its table.
func router(t *testing.T, port uint16) *server.BgpServer {
	t.Helper()
	r := server.NewBgpServer(server.LoggerOption(&logAdapter{log: slog.New(slog.DiscardHandler)}))
	go r.Serve()
	ctx := context.Background()
	if err := r.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: 65000, RouterId: "10.0.0.1", ListenPort: int32(port), ListenAddresses: []string{"127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	if err := r.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{Conf: &api.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: 65001},
		Transport: &api.Transport{PassiveMode: true}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// routes returns the prefixes in r's table and their next hops.
func routes(r *server.BgpServer) map[string]string {
	out := map[string]string{}
	r.ListPath(context.Background(), &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}},
		func(d *api.Destination) {
			for _, p := range d.Paths {
				for _, a := range p.Pattrs {
					var nh api.NextHopAttribute
					if a.UnmarshalTo(&nh) == nil {
						out[d.Prefix] = nh.NextHop
					}
				}
			}
		})
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSpeakerAnnouncesAndWithdraws: the router learns the VIP with the instance's next hop on
// Announce(true), loses it on Announce(false), learns it again, and loses it when the speaker
// stops (its session closes).
func TestSpeakerAnnouncesAndWithdraws(t *testing.T) {
	port := freePort(t)
	r := router(t, port)
	ctx := context.Background()
	sp, err := Start(ctx, Config{LocalAS: 65001, RouterID: netip.MustParseAddr("10.4.0.2"), NextHop: netip.MustParseAddr("10.4.0.2"),
		Announce:  []netip.Prefix{netip.MustParsePrefix("10.100.0.1/32")},
		Neighbors: []Neighbor{{Address: netip.MustParseAddr("127.0.0.1"), AS: 65000, Port: port}}, HoldTime: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Stop()
	waitFor(t, "the session", func() bool { return sp.Established(ctx) == 1 })
	if len(routes(r)) != 0 {
		t.Fatalf("announced before Announce: %v", routes(r))
	}
	if err := sp.Announce(ctx, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the announcement", func() bool { return routes(r)["10.100.0.1/32"] == "10.4.0.2" })
	if st := sp.Status(ctx); !st.Announced || len(st.Peers) != 1 || st.Peers[0].State != "established" || st.Peers[0].AS != 65000 {
		t.Fatalf("status %+v", st)
	}
	if err := sp.Announce(ctx, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the withdrawal", func() bool { return len(routes(r)) == 0 })
	if err := sp.Announce(ctx, true); err != nil {
		t.Fatal(err)
	}
	// Announcing twice is one announcement: a single withdrawal removes it.
	if err := sp.Announce(ctx, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second announcement", func() bool { return len(routes(r)) == 1 })
	sp.Stop()
	waitFor(t, "the route to go with the session", func() bool { return len(routes(r)) == 0 })
	if err := sp.Announce(ctx, true); err != nil {
		t.Fatalf("announce after stop: %v", err)
	}
}

func TestStartRefusesIncompleteConfig(t *testing.T) {
	for _, c := range []Config{
		{RouterID: netip.MustParseAddr("10.0.0.1"), Neighbors: []Neighbor{{Address: netip.MustParseAddr("10.0.0.2"), AS: 1}}},
		{LocalAS: 1, RouterID: netip.MustParseAddr("2001:db8::1"), Neighbors: []Neighbor{{Address: netip.MustParseAddr("10.0.0.2"), AS: 1}}},
		{LocalAS: 1, RouterID: netip.MustParseAddr("10.0.0.1")},
	} {
		if sp, err := Start(context.Background(), c); err == nil {
			sp.Stop()
			t.Errorf("%+v: no error", c)
		}
	}
}
