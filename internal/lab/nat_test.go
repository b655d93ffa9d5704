package lab_test

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
)

// natTopology: a site with two uplinks, each behind its own NAT router, to one public host. cpe1
// keeps ports, as a home router; cpe2 randomises them, forgets a UDP mapping after 3 s idle, as
// a carrier-grade NAT, and translates IPv6 too. wan1 is an emulated link, the others are kernel links.
const natTopology = `
name = "nat"
[[host]]
name = "site"
route = [ { dst = "198.51.100.0/24", via = "192.168.1.1" },
          { dst = "203.0.113.0/24", via = "192.168.2.1" },
          { dst = "2001:db8:2::/64", via = "fd00:2::1" } ]
[[host]]
name = "cpe1"
nat = { outside = "wan" }
[[host]]
name = "cpe2"
[host.nat]
outside = "wan"
random_ports = true
ipv6 = true
udp_timeout = "3s"
[[host]]
name = "public"

[[link]]
name = "lan1"
kernel = true
a = "site"
b = "cpe1"
a_ifname = "up1"
a_addr = "192.168.1.2/24"
b_addr = "192.168.1.1/24"
[[link]]
name = "wan1"
a = "cpe1"
b = "public"
a_ifname = "wan"
a_addr = "198.51.100.2/24"
b_addr = "198.51.100.1/24"
delay = "1ms"
[[link]]
name = "lan2"
kernel = true
a = "site"
b = "cpe2"
a_ifname = "up2"
a_addr = ["192.168.2.2/24", "fd00:2::2/64"]
b_addr = ["192.168.2.1/24", "fd00:2::1/64"]
[[link]]
name = "wan2"
kernel = true
a = "cpe2"
b = "public"
a_ifname = "wan"
a_addr = ["203.0.113.2/24", "2001:db8:2::2/64"]
b_addr = ["203.0.113.1/24", "2001:db8:2::1/64"]
`

// udpPeer is a UDP socket in a lab host that records the source of what it receives.
type udpPeer struct {
	t  *testing.T
	pc *net.UDPConn
}

func listenUDP(t *testing.T, h *lab.Host, addr string) *udpPeer {
	t.Helper()
	pc, err := h.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return &udpPeer{t, pc.(*net.UDPConn)}
}

// recv waits up to d for one datagram and returns its payload and source.
func (p *udpPeer) recv(d time.Duration) (string, netip.AddrPort, error) {
	buf := make([]byte, 2048)
	p.pc.SetReadDeadline(time.Now().Add(d))
	n, from, err := p.pc.ReadFromUDPAddrPort(buf)
	if err != nil {
		return "", from, err
	}
	return string(buf[:n]), netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), nil
}

func (p *udpPeer) send(to netip.AddrPort, msg string) {
	p.t.Helper()
	if _, err := p.pc.WriteToUDPAddrPort([]byte(msg), to); err != nil {
		p.t.Fatalf("send to %s: %v", to, err)
	}
}

// exchange sends from in to out's address, answers from out to the source it saw, and returns
// that source: the address and port the NAT translated to.
func exchange(t *testing.T, in, out *udpPeer, to netip.AddrPort) netip.AddrPort {
	t.Helper()
	// The first datagram may be lost while a kernel link's neighbour is being resolved.
	for try := 0; ; try++ {
		in.send(to, "ping")
		msg, src, err := out.recv(time.Second)
		if err != nil {
			if try < 2 {
				continue
			}
			t.Fatalf("nothing arrived at %s: %v", to, err)
		}
		if msg != "ping" {
			t.Fatalf("got %q", msg)
		}
		out.send(src, "pong")
		if msg, _, err := in.recv(time.Second); err != nil || msg != "pong" {
			t.Fatalf("the reply to %s did not come back through the NAT: %q %v", src, msg, err)
		}
		return src
	}
}

func upNAT(t *testing.T) *lab.Lab {
	labtest.Require(t)
	if _, ok := labtest.Tool(t, "nft"); !ok {
		labtest.Skip(t, "NAT needs nft (Debian package nftables)")
	}
	tp, err := topo.Parse("nat.toml", []byte(natTopology))
	if err != nil {
		t.Fatal(err)
	}
	return labtest.Up(t, tp)
}

var (
	public1 = netip.MustParseAddrPort("198.51.100.1:7000")
	public2 = netip.MustParseAddrPort("203.0.113.1:7000")
)

// Through a NAT: the public host sees the NAT's address, with the site's port on cpe1 and a
// random one on cpe2; a flush makes new mappings; cpe2's mappings expire after 3 s idle.
func TestNATMappings(t *testing.T) {
	l := upNAT(t)
	site1 := listenUDP(t, l.Host("site"), "192.168.1.2:40001")
	site2 := listenUDP(t, l.Host("site"), "192.168.2.2:40002")
	pub1 := listenUDP(t, l.Host("public"), public1.String())
	pub2 := listenUDP(t, l.Host("public"), public2.String())

	src1 := exchange(t, site1, pub1, public1)
	if want := netip.MustParseAddrPort("198.51.100.2:40001"); src1 != want {
		t.Errorf("behind cpe1 (port-preserving) the public host saw %s, want %s", src1, want)
	}
	src2 := exchange(t, site2, pub2, public2)
	if src2.Addr() != netip.MustParseAddr("203.0.113.2") || src2.Port() == 40002 {
		t.Errorf("behind cpe2 (random ports) the public host saw %s, want 203.0.113.2 and another port than 40002", src2)
	}
	ms, err := l.Host("cpe2").NATMappings()
	if err != nil {
		t.Fatal(err)
	}
	ms = slices.DeleteFunc(ms, func(m lab.Mapping) bool { return m.Inside.Addr().Is6() }) // checked above
	want := lab.Mapping{Proto: "udp", Inside: netip.MustParseAddrPort("192.168.2.2:40002"), Outside: src2, Remote: public2}
	if len(ms) != 1 || ms[0].Proto != want.Proto || ms[0].Inside != want.Inside || ms[0].Outside != want.Outside || ms[0].Remote != want.Remote ||
		ms[0].Expires <= 0 || ms[0].Expires > 3*time.Second {
		t.Errorf("cpe2 mappings %v, want one like %v expiring within 3s", ms, want)
	}
	site6 := listenUDP(t, l.Host("site"), "[fd00:2::2]:40006")
	pub6 := netip.MustParseAddrPort("[2001:db8:2::1]:7000")
	src6 := exchange(t, site6, listenUDP(t, l.Host("public"), pub6.String()), pub6)
	if src6.Addr() != netip.MustParseAddr("2001:db8:2::2") || src6.Port() == 40006 {
		t.Errorf("IPv6 behind cpe2 (ipv6, random ports): the public host saw %s, want 2001:db8:2::2 and another port than 40006", src6)
	}
	if _, err := l.Host("site").NATMappings(); !errors.Is(err, lab.ErrNoNAT) {
		t.Errorf("mappings of a host without NAT: %v, want ErrNoNAT", err)
	}

	t.Run("flush", func(t *testing.T) {
		for _, h := range []string{"cpe1", "cpe2"} {
			if n, err := l.Host(h).FlushNAT(); err != nil || n < 1 {
				t.Fatalf("flush %s: %d entries, %v", h, n, err)
			}
		}
		// The public host's packet to the old mapping no longer reaches the site.
		pub2.send(src2, "stale")
		if msg, _, err := site2.recv(300 * time.Millisecond); err == nil {
			t.Errorf("after the flush, %q through the old mapping %s reached the site", msg, src2)
		}
		if again := exchange(t, site1, pub1, public1); again != src1 {
			t.Errorf("cpe1 after a flush: %s, want the port kept again: %s", again, src1)
		}
		again := exchange(t, site2, pub2, public2)
		if again == src2 || again.Addr() != src2.Addr() {
			t.Errorf("cpe2 after a flush: %s, want a new port on %s than %d", again, src2.Addr(), src2.Port())
		}
		src2 = again
	})

	t.Run("expiry", func(t *testing.T) {
		src := exchange(t, site2, pub2, public2)
		// Within the timeout the mapping holds (and this refreshes it).
		time.Sleep(time.Second)
		pub2.send(src, "early")
		if msg, _, err := site2.recv(time.Second); err != nil || msg != "early" {
			t.Fatalf("1 s after the last packet, the public host could not reach the site through %s: %q %v", src, msg, err)
		}
		time.Sleep(4 * time.Second)
		if ms, err := l.Host("cpe2").NATMappings(); err != nil || len(ms) != 0 {
			t.Errorf("4 s after the last packet, cpe2 (udp_timeout 3s) still has mappings %v (%v)", ms, err)
		}
		pub2.send(src, "late")
		if msg, _, err := site2.recv(300 * time.Millisecond); err == nil {
			t.Errorf("4 s after the last packet, %q reached the site through the expired mapping %s", msg, src)
		}
		// cpe1 keeps the kernel's 30 s (120 s for a flow with replies).
		if ms, err := l.Host("cpe1").NATMappings(); err != nil || len(ms) != 1 || ms[0].Expires < 20*time.Second {
			t.Errorf("cpe1 mappings %v (%v), want one with the kernel's timeout", ms, err)
		}
	})
}

// Addresses change while the lab runs: the NAT's outside address (a modem that reconnects) and
// the site's own (DHCP renumbering).
func TestNATAddressChange(t *testing.T) {
	l := upNAT(t)
	pub1 := listenUDP(t, l.Host("public"), public1.String())
	site := listenUDP(t, l.Host("site"), "0.0.0.0:40001")
	if src := exchange(t, site, pub1, public1); src.Addr() != netip.MustParseAddr("198.51.100.2") {
		t.Fatalf("before: %s", src)
	}
	cpe1 := l.Host("cpe1")
	if err := cpe1.ReplaceAddr("wan", netip.MustParsePrefix("198.51.100.2/24"), netip.MustParsePrefix("198.51.100.3/24")); err != nil {
		t.Fatal(err)
	}
	if got, err := cpe1.Addrs("wan"); err != nil || !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("198.51.100.3/24")}) {
		t.Errorf("cpe1 wan addresses %v (%v), want 198.51.100.3/24", got, err)
	}
	if src := exchange(t, site, pub1, public1); src != netip.MustParseAddrPort("198.51.100.3:40001") {
		t.Errorf("after the NAT's new address the public host saw %s, want 198.51.100.3:40001", src)
	}

	// The site's uplink is renumbered: its route through cpe1 comes back with the new address.
	h := l.Host("site")
	if err := h.ReplaceAddr("up1", netip.MustParsePrefix("192.168.1.2/24"), netip.MustParsePrefix("192.168.1.7/24")); err != nil {
		t.Fatal(err)
	}
	// The old mapping still holds port 40001 towards the same remote, so the new one gets
	// another port.
	if src := exchange(t, site, pub1, public1); src.Addr() != netip.MustParseAddr("198.51.100.3") || src.Port() == 40001 {
		t.Errorf("after the site's new address the public host saw %s, want 198.51.100.3 and another port than 40001", src)
	}
	ms, err := cpe1.NATMappings()
	if err != nil || !slices.ContainsFunc(ms, func(m lab.Mapping) bool { return m.Inside == netip.MustParseAddrPort("192.168.1.7:40001") }) {
		t.Errorf("cpe1 mappings %v (%v), want one from 192.168.1.7:40001", ms, err)
	}

	// Mistakes are named.
	if err := h.ReplaceAddr("up1", netip.MustParsePrefix("192.168.1.2/24"), netip.Prefix{}); err == nil || !strings.Contains(err.Error(), "192.168.1.2/24 is not an address of up1") {
		t.Errorf("removing an address the interface does not have: %v", err)
	}
	if err := h.ReplaceAddr("nope", netip.Prefix{}, netip.MustParsePrefix("10.0.0.1/8")); err == nil || !strings.Contains(err.Error(), `no interface "nope"`) {
		t.Errorf("an unknown interface: %v", err)
	}
	// A new subnet leaves the route's gateway behind: the address changes, the error says so.
	err = h.ReplaceAddr("up1", netip.MustParsePrefix("192.168.1.7/24"), netip.MustParsePrefix("192.168.9.7/24"))
	if err == nil || !strings.Contains(err.Error(), "route 198.51.100.0/24 via 192.168.1.1: the gateway is in no subnet of up1 any more") {
		t.Errorf("renumbering into another subnet: %v, want the lost route named", err)
	}
}

// An interface taken down while a flow runs stops it; brought up, the flow resumes through a
// new mapping, with the addresses and routes restored. A whole link (both ends) likewise.
func TestNATLinkDownUp(t *testing.T) {
	l := upNAT(t)
	pub1 := listenUDP(t, l.Host("public"), public1.String())
	site := listenUDP(t, l.Host("site"), "192.168.1.2:40001")
	exchange(t, site, pub1, public1)

	// A flow of one datagram every 10 ms; the public host notes when each arrives.
	var mu sync.Mutex
	var arrivals []time.Time
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if _, _, err := pub1.recv(100 * time.Millisecond); err == nil {
				mu.Lock()
				arrivals = append(arrivals, time.Now())
				mu.Unlock()
			}
			select {
			case <-done:
				return
			default:
			}
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				site.pc.WriteToUDPAddrPort([]byte("flow"), public1) // errors while down are expected
			}
		}
	})
	defer func() { close(done); wg.Wait() }()
	count := func(from, to time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range arrivals {
			if !a.Before(from) && a.Before(to) {
				n++
			}
		}
		return n
	}
	phase := func(name string, down, up func() error) {
		t.Helper()
		t0 := time.Now()
		time.Sleep(300 * time.Millisecond)
		if err := down(); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		time.Sleep(500 * time.Millisecond)
		if err := up(); err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		time.Sleep(500 * time.Millisecond)
		t3 := time.Now()
		before, during, after := count(t0, t1), count(t1.Add(20*time.Millisecond), t2), count(t2, t3)
		t.Logf("%s: %d datagrams in 300 ms before, %d in 480 ms down, %d in 500 ms after", name, before, during, after)
		if before < 15 || during != 0 || after < 15 {
			t.Errorf("%s: %d datagrams in 300 ms before, %d while down, %d in 500 ms after; want about 30, 0, 50", name, before, during, after)
		}
	}

	cpe1 := l.Host("cpe1")
	phase("cpe1 wan down", func() error {
		if err := cpe1.SetInterfaceUp("wan", false); err != nil {
			return err
		}
		if up, err := cpe1.InterfaceUp("wan"); err != nil || up {
			t.Errorf("cpe1 wan up=%v (%v) after it was taken down", up, err)
		}
		return nil
	}, func() error { return cpe1.SetInterfaceUp("wan", true) })

	// The site's side: its interface and its route through cpe1 go, and come back.
	phase("link lan1 down", func() error { return l.SetLinkUp("lan1", false) }, func() error { return l.SetLinkUp("lan1", true) })
	if got, err := l.Host("site").Addrs("up1"); err != nil || !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("192.168.1.2/24")}) {
		t.Errorf("site up1 addresses after down and up: %v (%v)", got, err)
	}
	if err := l.SetLinkUp("nope", false); err == nil || !strings.Contains(err.Error(), `no link named "nope"`) {
		t.Errorf("an unknown link: %v", err)
	}
}

// The control socket of `braid lab up` carries the events for `braid lab nat`, `braid lab iface`
// and `braid lab link --if-down`.
func TestNATControlSocket(t *testing.T) {
	l := upNAT(t)
	sock := t.TempDir() + "/ctl.sock"
	stop, err := l.ServeControl(t.Context(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	st := lab.State{ID: l.ID, Control: sock}

	site := listenUDP(t, l.Host("site"), "192.168.2.2:40002")
	pub2 := listenUDP(t, l.Host("public"), public2.String())
	src := exchange(t, site, pub2, public2)
	nats, err := lab.RequestNAT(st, lab.NATRequest{})
	if err != nil || len(nats) != 2 || nats[1].Host != "cpe2" || !nats[1].NAT.RandomPorts || len(nats[1].Mappings) != 1 || nats[1].Mappings[0].Outside != src {
		t.Fatalf("NAT status %+v (%v), want cpe1 and cpe2 with the mapping to %s", nats, err, src)
	}
	nats, err = lab.RequestNAT(st, lab.NATRequest{Host: "cpe2", Flush: true})
	if err != nil || len(nats) != 1 || nats[0].Flushed < 1 || len(nats[0].Mappings) != 0 {
		t.Errorf("flush cpe2: %+v (%v)", nats, err)
	}
	if _, err := lab.RequestNAT(st, lab.NATRequest{Host: "site", Flush: true}); err == nil || !strings.Contains(err.Error(), "not a NAT host: host site") {
		t.Errorf("flush of a host without NAT: %v", err)
	}

	is, err := lab.RequestIface(st, lab.IfaceRequest{Host: "cpe2", Ifname: "wan", Del: netip.MustParsePrefix("203.0.113.2/24"), Add: netip.MustParsePrefix("203.0.113.9/24")})
	if err != nil || !is.Up || !slices.Equal(is.Addrs, []netip.Prefix{netip.MustParsePrefix("203.0.113.9/24"), netip.MustParsePrefix("2001:db8:2::2/64")}) {
		t.Errorf("address change: %+v (%v)", is, err)
	}
	if src := exchange(t, site, pub2, public2); src.Addr() != netip.MustParseAddr("203.0.113.9") {
		t.Errorf("after the change the public host saw %s, want 203.0.113.9", src)
	}
	// Down, the kernel keeps the IPv4 address and removes the IPv6 one.
	if is, err := lab.RequestIface(st, lab.IfaceRequest{Host: "cpe2", Ifname: "wan", Down: true}); err != nil || is.Up || len(is.Addrs) != 1 {
		t.Errorf("down: %+v (%v)", is, err)
	}
	// The IPv6 address the kernel removed with the interface down comes back.
	if is, err := lab.RequestIface(st, lab.IfaceRequest{Host: "cpe2", Ifname: "wan", Up: true}); err != nil || !is.Up || len(is.Addrs) != 2 {
		t.Errorf("up: %+v (%v)", is, err)
	}
	if _, err := lab.RequestIface(st, lab.IfaceRequest{Host: "cpe9", Ifname: "wan"}); err == nil || !strings.Contains(err.Error(), `no host "cpe9"`) {
		t.Errorf("an unknown host: %v", err)
	}

	links, err := lab.RequestLinks(st, lab.LinkRequest{Name: "wan1", IfDown: true})
	if err != nil || len(links) != 2 || !links[0].IfDown || links[0].Cut {
		t.Errorf("link wan1 --if-down: %+v (%v)", links, err)
	}
	links, err = lab.RequestLinks(st, lab.LinkRequest{Name: "wan1", IfUp: true})
	if err != nil || len(links) != 2 || links[0].IfDown {
		t.Errorf("link wan1 --if-up: %+v (%v)", links, err)
	}
}
