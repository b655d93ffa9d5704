package tunnel

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"braid/internal/tunnel/session"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The address an uplink binds to among its interface's: global, settled, of the paths'
// family, the current one while it stays.
func TestChooseAddr(t *testing.T) {
	a := netip.MustParseAddr
	global := func(s string) ifAddr { return ifAddr{addr: a(s)} }
	cases := []struct {
		name   string
		cands  []ifAddr
		family int
		cur    string
		want   string
	}{
		{"none", nil, 0, "", ""},
		{"first IPv4", []ifAddr{global("2001:db8::1"), global("192.0.2.1"), global("192.0.2.2")}, 0, "", "192.0.2.1"},
		{"IPv6 when asked", []ifAddr{global("192.0.2.1"), global("2001:db8::1")}, 6, "", "2001:db8::1"},
		{"IPv6 when alone", []ifAddr{global("2001:db8::1")}, 0, "", "2001:db8::1"},
		{"family missing", []ifAddr{global("192.0.2.1")}, 6, "", ""},
		{"current stays", []ifAddr{global("192.0.2.1"), global("192.0.2.9")}, 4, "192.0.2.9", "192.0.2.9"},
		{"current gone", []ifAddr{global("192.0.2.20")}, 4, "192.0.2.9", "192.0.2.20"},
		{"link-local skipped", []ifAddr{global("fe80::1"), global("169.254.1.1")}, 0, "", ""},
		{"scope link skipped", []ifAddr{{addr: a("192.0.2.1"), scope: unix.RT_SCOPE_LINK}, global("192.0.2.2")}, 0, "", "192.0.2.2"},
		{"tentative skipped", []ifAddr{{addr: a("2001:db8::1"), flags: unix.IFA_F_TENTATIVE}, global("2001:db8::2")}, 6, "", "2001:db8::2"},
		{"failed DAD skipped", []ifAddr{{addr: a("2001:db8::1"), flags: unix.IFA_F_DADFAILED}}, 6, "", ""},
	}
	for _, c := range cases {
		var cur, want netip.Addr
		if c.cur != "" {
			cur = a(c.cur)
		}
		if c.want != "" {
			want = a(c.want)
		}
		if got := chooseAddr(c.cands, c.family, cur); got != want {
			t.Errorf("%s: got %v, want %v", c.name, got, want)
		}
	}
}

// The follower of an uplink whose interface is not there reports it absent, binds nothing,
// and stops with its context, leaving no goroutine behind (its netlink subscriptions
// included).
func TestFollowUplinksStops(t *testing.T) {
	nl, err := netlink.NewHandle()
	if err != nil {
		t.Fatalf("netlink: %v", err)
	}
	defer nl.Close()
	k1, _ := session.GenerateKey()
	k2, _ := session.GenerateKey()
	tn, err := New(Options{PrivateKey: k1, Device: nopDev{},
		Uplinks: []Uplink{{Name: "lte", Interface: "braidnone0", Follow: true, Port: 4754}},
		Peers: []PeerConfig{{Name: "hub", PublicKey: k2.Public(), Routes: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
			Paths: []PathConfig{{Uplink: "lte", Remote: netip.MustParseAddrPort("192.0.2.1:4754")}}}}})
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tn.FollowUplinks(ctx, FollowOptions{Netlink: nl, Recheck: 10 * time.Millisecond,
			Listen: func(local netip.AddrPort, ifname string) (Conn, error) {
				t.Errorf("bound %v on %s, which does not exist", local, ifname)
				return nil, errors.New("no")
			}})
	}()
	deadline := time.Now().Add(2 * time.Second)
	for {
		if u := tn.Status().Uplinks; len(u) == 1 && u[0].State == "absent" && u[0].Local == "" && u[0].Follow {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("uplink status %+v, want absent", tn.Status().Uplinks)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := tn.Status().Peers[0].Paths[0].State; st != "link-down" {
		t.Errorf("the path of an uplink whose interface is absent is %s, want link-down", st)
	}
	time.Sleep(50 * time.Millisecond) // a few rechecks
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("FollowUplinks: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("FollowUplinks did not return after its context ended")
	}
	for deadline := time.Now().Add(2 * time.Second); runtime.NumGoroutine() > before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after the follower stopped, %d before it started", runtime.NumGoroutine(), before)
		}
	}
}
