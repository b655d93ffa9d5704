package tunnel_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/sock"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// renumberTopology is natTopology with the site's end of the cgnat link named modem0: the
// test takes it down before the tunnels start and plugs it in later as up2 (plugModem).
func renumberTopology(shape topo.Shape) *topo.Topology {
	tp := natTopology([2]topo.Shape{shape, shape})
	tp.Name = "renum"
	for i := range tp.Links {
		if tp.Links[i].Name == "site-cgnat" {
			tp.Links[i].A.Ifname = "modem0"
		}
	}
	return tp
}

// plugModem makes the site's interface up2 appear, as a modem plugged in after start does: the
// kernel names it up2 (udev renames a new interface so) and it comes up; once the link works
// both ways (the cgnat's end is up: a DHCP exchange needs that) it gets its address and its
// route, as DHCP gives them. It returns when the address is there.
func plugModem(l *lab.Lab) error {
	nl := l.Host("site").NS.Netlink()
	link, err := nl.LinkByName("modem0")
	if err != nil {
		return err
	}
	if err := nl.LinkSetName(link, "up2"); err != nil {
		return fmt.Errorf("rename: %w", err)
	}
	if err := nl.LinkSetUp(link); err != nil {
		return err
	}
	// The cgnat's end of the link: its interface with 192.168.2.1.
	cg := l.Host("cgnat").NS.Netlink()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if farEndUp(cg, net.IP{192, 168, 2, 1}) {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the cgnat's end of the modem's link is not up after 5 s")
		}
	}
	if err := nl.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP{192, 168, 2, 2}, Mask: net.CIDRMask(24, 32)}}); err != nil {
		return err
	}
	return nl.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: net.IP{203, 0, 113, 0}, Mask: net.CIDRMask(24, 32)}, Gw: net.IP{192, 168, 2, 1}})
}

// farEndUp reports whether the interface of nl's host with address a is operationally up.
func farEndUp(nl *netlink.Handle, a net.IP) bool {
	addrs, err := nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return false
	}
	for _, x := range addrs {
		if x.IP.Equal(a) {
			link, err := nl.LinkByIndex(x.LinkIndex)
			return err == nil && link.Attrs().OperState == netlink.OperUp
		}
	}
	return false
}

// followingSite runs the site's tunnel with two uplinks named by interface alone (up1, which
// exists, and up2, which does not yet), paths to the hub's two addresses, and the follower.
func followingSite(t *testing.T, h *lab.Host, k session.PrivateKey, hub tunnel.PeerConfig) *tunnel.Tunnel {
	t.Helper()
	follow := func(o *tunnel.Options) {
		o.Uplinks = []tunnel.Uplink{
			{Name: "up1", Interface: "up1", Follow: true, Port: roles.TunnelPort},
			{Name: "up2", Interface: "up2", Follow: true, Port: roles.TunnelPort},
		}
	}
	tn, stop, err := roles.StartTunnel(context.Background(), h, []netip.Prefix{netip.PrefixFrom(natSiteInner, 24)}, nil,
		tunnel.Options{PrivateKey: k, MTU: 1400, Reorder: true, Recovery: true, Peers: []tunnel.PeerConfig{hub}}, follow)
	if err != nil {
		t.Fatal(err)
	}
	ns := netns.NsHandle(h.NS.Handle())
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	followed := make(chan error, 1)
	go func() {
		followed <- tn.FollowUplinks(ctx, tunnel.FollowOptions{Netlink: nl, Namespace: &ns, Recheck: time.Second,
			Listen: func(local netip.AddrPort, ifname string) (tunnel.Conn, error) {
				var c *sock.Conn
				err := h.NS.Do(func() (err error) {
					if c, err = sock.Listen(local, ifname); err == nil {
						c.EnableGRO()
					}
					return err
				})
				return c, err
			}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-followed; err != nil {
			t.Errorf("follower: %v", err)
		}
		nl.Close()
		if err := stop(); err != nil {
			t.Errorf("site tunnel: %v", err)
		}
	})
	return tn
}

// sitePath returns the site's path on uplink name.
func sitePath(tn *tunnel.Tunnel, name string) tunnel.PathStatus {
	for _, p := range tn.Status().Peers[0].Paths {
		if p.Uplink == name {
			return p
		}
	}
	return tunnel.PathStatus{}
}

// hubPath returns the hub's path on its address a, if it has learned one.
func hubPath(hub *tunnel.Tunnel, a netip.Addr) (tunnel.PathStatus, bool) {
	for _, p := range hub.Status().Peers[0].Paths {
		if p.Uplink == a.String() {
			return p, true
		}
	}
	return tunnel.PathStatus{}, false
}

// An uplink named by its interface follows it. Its address changes during a transfer (a DHCP
// renumbering behind the cpe): the site binds anew on the new address and tells the hub, whose
// path roams to the cpe's new mapping; a 10 ms ping through the tunnel never waits more than
// 1 s, and the file is intact. Then the second uplink's interface appears (a modem plugged in
// after start): within 1 s the site's path on it is up and the hub has learned it, and a file
// crosses intact with data on both paths.
func TestTunnelUplinkRenumbered(t *testing.T) {
	l := labtest.Up(t, renumberTopology(topo.Shape{Rate: 20e6, Delay: 5 * time.Millisecond}))
	kh, _ := session.GenerateKey()
	ks, _ := session.GenerateKey()
	learned := tunnel.PeerConfig{Name: "site", PublicKey: ks.Public(), Routes: []netip.Prefix{netip.PrefixFrom(natSiteInner, 32)}}
	fixed := tunnel.PeerConfig{Name: "hub", PublicKey: kh.Public(), Routes: []netip.Prefix{netip.PrefixFrom(natHubInner, 32)}}
	for i, a := range natHubAddrs {
		learned.Paths = append(learned.Paths, tunnel.PathConfig{Uplink: a.String()})
		fixed.Paths = append(fixed.Paths, tunnel.PathConfig{Uplink: fmt.Sprintf("up%d", i+1), Remote: netip.AddrPortFrom(a, roles.TunnelPort)})
	}
	// The modem is not plugged in yet: no interface up2, and no address (DHCP gives it one).
	if err := l.Host("site").SetInterfaceUp("modem0", false); err != nil {
		t.Fatal(err)
	}
	if err := l.Host("site").ReplaceAddr("modem0", pf("192.168.2.2/24"), netip.Prefix{}); err != nil {
		t.Fatal(err)
	}
	hub := runTunnel(t, l.Host("hub"), kh, netip.PrefixFrom(natHubInner, 24), natHubAddrs, []tunnel.PeerConfig{learned})
	site := followingSite(t, l.Host("site"), ks, fixed)

	// Up on up1 alone; up2 has no interface.
	deadline := time.Now().Add(10 * time.Second)
	for sitePath(site, "up1").State != "up" {
		if time.Now().After(deadline) {
			t.Fatalf("the site's path on up1 is not up: %+v", site.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, u := range site.Status().Uplinks {
		t.Logf("site uplink %s: interface %s, %s, local %q", u.Name, u.Interface, u.State, u.Local)
	}
	if p := sitePath(site, "up1"); p.Local != "192.168.1.2:4754" {
		t.Errorf("site path on up1: local %q, want 192.168.1.2:4754 (the interface's address)", p.Local)
	}
	before, _ := hubPath(hub, natHubAddrs[0])
	handshakes := func() uint64 {
		return hub.Status().Counters["handshakes_done"] + site.Status().Counters["handshakes_done"]
	}
	hs := handshakes()

	// Renumbered during a transfer.
	addr := serve(t, l.Host("hub"), natHubInner)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rebound := make(chan time.Duration, 1)
	renumber := time.AfterFunc(1500*time.Millisecond, func() {
		at := time.Now()
		if err := l.Host("site").ReplaceAddr("up1", pf("192.168.1.2/24"), pf("192.168.1.20/24")); err != nil {
			t.Errorf("renumber: %v", err)
		}
		for time.Since(at) < 5*time.Second {
			if sitePath(site, "up1").Local == "192.168.1.20:4754" {
				rebound <- time.Since(at)
				return
			}
			time.Sleep(time.Millisecond)
		}
		rebound <- -1
	})
	defer renumber.Stop()
	fileDone := make(chan traffic.FileResult, 1)
	go func() {
		f, err := traffic.File(ctx, l.Host("site").Dial, addr, traffic.FileOptions{Size: 8 << 20, Seed: 21})
		if err != nil {
			t.Errorf("transfer across the renumbering: %v", err)
		}
		fileDone <- f
	}()
	worst, err := kit.Ping(ctx, l.Host("site"), l.Host("hub"), natHubInner, 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	f := <-fileDone
	took := <-rebound
	after, _ := hubPath(hub, natHubAddrs[0])
	t.Logf("renumbered 192.168.1.2 -> 192.168.1.20: site bound anew after %v; longest ping gap %v; transfer %v", took, worst, f)
	t.Logf("hub path on %s: %s (%s) before, %s (%s, %d moves) after", natHubAddrs[0], before.Remote, before.How, after.Remote, after.How, after.Moves)
	if took < 0 {
		t.Errorf("the site's path on up1 never showed the new local address: %+v", sitePath(site, "up1"))
	}
	if worst > time.Second {
		t.Errorf("longest time without a ping reply across the renumbering: %v, want at most 1 s", worst)
	}
	if !f.Intact {
		t.Errorf("transfer across the renumbering: %v", f)
	}
	if after.How != "roamed" || after.Remote == before.Remote {
		t.Errorf("the hub's path did not roam to the cpe's new mapping: %s (%s) before, %s (%s) after", before.Remote, before.How, after.Remote, after.How)
	}
	if now := handshakes(); now != hs {
		t.Errorf("handshakes done went from %d to %d: the renumbering needed a new handshake", hs, now)
	}
	c := site.Status().Counters
	if c["uplink_rebinds"] != 1 || c["uplink_announces"] == 0 {
		t.Errorf("site: uplink_rebinds %d (want 1), uplink_announces %d (want some)", c["uplink_rebinds"], c["uplink_announces"])
	}

	// The modem appears.
	appeared := time.Now()
	if err := plugModem(l); err != nil {
		t.Fatal(err)
	}
	plugged := time.Now() // its address is there
	var used, heard time.Duration
	for {
		hp, learnedIt := hubPath(hub, natHubAddrs[1])
		if learnedIt && heard == 0 {
			heard = time.Since(plugged)
		}
		if sitePath(site, "up2").State == "up" && learnedIt && hp.State == "up" {
			used = time.Since(plugged)
			break
		}
		if time.Since(plugged) > 5*time.Second {
			t.Fatalf("the new interface's path is not in use 5 s after it appeared: site %+v, hub %+v", sitePath(site, "up2"), hub.Status().Peers[0].Paths)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("interface up2 appeared, and had its address %v later: the hub heard the site on it %v after that, its path up at both ends after %v (site local %s)",
		plugged.Sub(appeared), heard, used, sitePath(site, "up2").Local)
	if used > time.Second {
		t.Errorf("the new interface's path took %v from its address to be in use, want at most 1 s", used)
	}
	if p := sitePath(site, "up2"); p.Local != "192.168.2.2:4754" {
		t.Errorf("site path on up2: local %q, want 192.168.2.2:4754", p.Local)
	}
	was := [2]uint64{sitePath(site, "up1").TxDataPackets, sitePath(site, "up2").TxDataPackets}
	f, err = traffic.File(ctx, l.Host("site").Dial, addr, traffic.FileOptions{Size: 8 << 20, Seed: 22})
	if err != nil || !f.Intact {
		t.Errorf("file over both uplinks: %v %v", err, f)
	}
	for i, name := range []string{"up1", "up2"} {
		if n := sitePath(site, name).TxDataPackets - was[i]; n == 0 {
			t.Errorf("the path on %s carried no data of the last file", name)
		}
	}

	// up1's link drops and comes back (a modem that loses its carrier): its path is out of
	// use at once, the ping goes on over up2, and the path is up again within 2 s of the link.
	type linkEvent struct {
		down   string        // the site's path on up1 50 ms after the link went down
		backIn time.Duration // from the link up to the path up; -1 never
	}
	flapped := make(chan linkEvent, 1)
	flap := time.AfterFunc(time.Second, func() {
		var ev linkEvent
		if err := l.Host("site").SetInterfaceUp("up1", false); err != nil {
			t.Errorf("up1 down: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		ev.down = sitePath(site, "up1").State
		time.Sleep(time.Second)
		at := time.Now()
		if err := l.Host("site").SetInterfaceUp("up1", true); err != nil {
			t.Errorf("up1 up: %v", err)
		}
		for ev.backIn = -1; time.Since(at) < 5*time.Second; time.Sleep(5 * time.Millisecond) {
			if sitePath(site, "up1").State == "up" {
				ev.backIn = time.Since(at)
				break
			}
		}
		flapped <- ev
	})
	defer flap.Stop()
	worst, err = kit.Ping(ctx, l.Host("site"), l.Host("hub"), natHubInner, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ev := <-flapped
	t.Logf("up1 down for 1 s: its path %s 50 ms later, up again %v after the link; longest ping gap %v", ev.down, ev.backIn, worst)
	if ev.down != "link-down" {
		t.Errorf("the path on up1 is %q 50 ms after its link went down, want link-down", ev.down)
	}
	// 2 s: the path is back a few fast probes after the link, but the cpe's end of the link
	// may lose the first ARP exchange (its own link-up is the kernel's, up to 1 s later), and
	// the kernel retries it after 1 s.
	if ev.backIn < 0 || ev.backIn > 2*time.Second {
		t.Errorf("the path on up1 took %v to come back after its link, want at most 2 s", ev.backIn)
	}
	if worst > time.Second {
		t.Errorf("longest ping gap while up1 was down: %v, want at most 1 s (up2 carries it)", worst)
	}
	for _, u := range site.Status().Uplinks {
		t.Logf("site uplink %s: %s, local %s, %d rebinds", u.Name, u.State, u.Local, u.Rebinds)
	}
}
