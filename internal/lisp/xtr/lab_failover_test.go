package xtr_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/lisp/mapserver"
	"braid/internal/lisp/xtr"
	"braid/internal/wire/lisp"
)

// secondMapServer is the address of the second map server of TestXTRMapServerFailover.
var secondMapServer = netip.MustParseAddrPort("10.0.9.5:4342")

// TestXTRMapServerFailover: two map servers (each also a map-resolver); the xTRs of both sites
// register with both and resolve through both, the first preferred. The first is killed:
// new flows (map-caches cleared) still resolve within 1 s at both ends, whether the dead one
// is tried first (right after the kill, and once each time its rest ends) or skipped while
// it rests, and the registrations of both sites stay fresh on the survivor.
func TestXTRMapServerFailover(t *testing.T) {
	labtest.Require(t)
	sh := topo.Shape{Delay: 2 * time.Millisecond}
	tp := roles.LispSitesTopology("lispms", roles.LispSites[:], func(int, int) (topo.Shape, topo.Shape) { return sh, sh }, sh)
	tp.Hosts = append(tp.Hosts, topo.Host{Name: "ms2", Routes: []topo.Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("10.0.9.6")}}})
	tp.Links = append(tp.Links, topo.Link{Name: "ms2-core", AB: sh, BA: sh,
		A: topo.Endpoint{Host: "ms2", Ifname: "core", Addrs: []netip.Prefix{netip.MustParsePrefix("10.0.9.5/30")}},
		B: topo.Endpoint{Host: "core", Ifname: "ms2", Addrs: []netip.Prefix{netip.MustParsePrefix("10.0.9.6/30")}}})
	l := labtest.Up(t, tp)
	ctx := context.Background()

	const registerInterval = 2 * time.Second
	msCfg := roles.LispMapServerConfig()
	msCfg.RegistrationTimeout = 3 * registerInterval
	addrs := []netip.AddrPort{roles.LispMapServer, secondMapServer}
	var servers [2]*mapserver.Server
	var stopMS [2]func() error
	for i, host := range []string{"ms", "ms2"} {
		s, stop, err := roles.StartMapServer(ctx, l.Host(host), addrs[i], msCfg)
		if err != nil {
			t.Fatal(err)
		}
		servers[i], stopMS[i] = s, stop
	}
	defer func() {
		for _, stop := range stopMS {
			if stop != nil {
				if err := stop(); err != nil {
					t.Errorf("stop map server: %v", err)
				}
			}
		}
	}()
	var xs [2]*xtr.XTR
	for i, s := range roles.LispSites {
		o := roles.LispSiteXTROptions(s)
		o.Resolvers = addrs
		o.MapServers = nil
		for _, a := range addrs {
			o.MapServers = append(o.MapServers, xtr.MapServer{Addr: a, Key: []byte(s.Key), AlgID: lisp.AlgHMACSHA256})
		}
		o.RegisterInterval = registerInterval
		o.RequestTimeout = time.Second
		x, stop, err := roles.StartSiteXTR(ctx, l, s, o)
		if err != nil {
			t.Fatal(err)
		}
		xs[i] = x
		defer func() {
			if err := stop(); err != nil {
				t.Errorf("stop xtr %d: %v", i+1, err)
			}
		}()
	}
	if err := roles.WaitRegistered(xs[:], 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for i, s := range servers {
		if n := len(s.Registrations(time.Now())); n != 4 {
			t.Fatalf("map server %d holds %d registrations, want the 4 EID prefixes of both sites", i+1, n)
		}
	}
	h1, h2 := l.Host("h1"), l.Host("h2")
	s1, s2 := roles.LispSites[0], roles.LispSites[1]

	// One round: empty both map-caches, then open a new flow from h1 to each of h2's EIDs and
	// measure how long each xTR took to resolve the other end.
	round := func(name string) {
		t.Helper()
		for k, dst := range s2.HostIP {
			// A late echo of the previous flow starts a resolution of its own: let the
			// flows settle and such resolutions end, then empty the caches.
			time.Sleep(100 * time.Millisecond)
			for settle := time.Now(); time.Since(settle) < 3*time.Second && (resolving(xs[0]) || resolving(xs[1])); {
				time.Sleep(20 * time.Millisecond)
			}
			for _, x := range xs {
				x.ClearCache()
			}
			r, err := resolveFlow(ctx, h1, h2, dst, xs, [2]netip.Addr{dst, s1.HostIP[k]})
			if err != nil {
				t.Fatalf("%s: %v -> %v: %v", name, s1.HostIP[k], dst, err)
			}
			// xtr2 starts resolving the source when the first packet reaches it, right after
			// xtr1 resolved the destination.
			own := [2]time.Duration{r.resolved[0], r.resolved[1] - r.resolved[0]}
			t.Logf("%s: flow to %v: xtr1 resolved the destination in %v, xtr2 the source %v later, first echo after %v",
				name, dst, own[0].Round(time.Millisecond), own[1].Round(time.Millisecond), r.echo.Round(time.Millisecond))
			if r.echo > 1500*time.Millisecond {
				t.Errorf("%s: first echo to %v after %v", name, dst, r.echo)
			}
			for i, d := range own {
				if d > time.Second {
					t.Errorf("%s: xtr%d took %v to resolve (flow to %v), want < 1 s", name, i+1, d, dst)
				}
			}
		}
	}
	round("both map servers up")
	if c := xs[0].Counters()[xtr.CountResolverTimeouts] + xs[1].Counters()[xtr.CountResolverTimeouts]; c != 0 {
		t.Fatalf("%d resolver timeouts with both map servers up", c)
	}

	if err := stopMS[0](); err != nil {
		t.Fatalf("kill map server 1: %v", err)
	}
	stopMS[0] = nil
	killed := time.Now()
	round("map server 1 killed")
	round("again")
	for i, x := range xs {
		st := x.Status()
		if st.Resolvers[0].Up || !st.Resolvers[1].Up {
			t.Errorf("xtr%d resolver status %+v: want the first down, the second up", i+1, st.Resolvers)
		}
		if st.Counters[xtr.CountResolverTimeouts] == 0 {
			t.Errorf("xtr%d counted no resolver timeout", i+1)
		}
	}
	time.Sleep(time.Second)
	round("later")

	// Registrations: refreshed on the survivor after the kill, for both sites.
	before := servers[1].Counters()[mapserver.CountRegistered]
	time.Sleep(registerInterval + 500*time.Millisecond)
	if got := servers[1].Counters()[mapserver.CountRegistered] - before; got < 4 {
		t.Errorf("the survivor took %d registrations in %v, want the 2 prefixes of each site at least once", got, registerInterval+500*time.Millisecond)
	}
	regs := servers[1].Registrations(time.Now())
	sites := map[string]int{}
	for _, r := range regs {
		if r.ExpiresIn < msCfg.RegistrationTimeout-registerInterval-time.Second {
			t.Errorf("registration %v on the survivor expires in %v: not refreshed since the kill", r.Prefix, r.ExpiresIn)
		}
		sites[r.Site]++
	}
	if sites[s1.Name] != 2 || sites[s2.Name] != 2 {
		t.Errorf("the survivor holds %v registrations per site, want 2 each", sites)
	}
	for i, x := range xs {
		for _, r := range x.Status().Registrations {
			if r.MapServer == secondMapServer && (!r.Registered || r.LastNotify.Before(killed)) {
				t.Errorf("xtr%d: registration with the survivor %+v not confirmed since the kill", i+1, r)
			}
		}
	}
}

type resolution struct {
	resolved [2]time.Duration // xtr1 for the destination, xtr2 for the source
	echo     time.Duration
}

// resolveFlow sends UDP datagrams every 20 ms from h1 to an echo server on h2 at dst until
// the first echo (3 s at most), and meanwhile watches xtr i's map-cache for a resolved entry
// covering eids[i].
func resolveFlow(ctx context.Context, h1, h2 *lab.Host, dst netip.Addr, xs [2]*xtr.XTR, eids [2]netip.Addr) (r resolution, err error) {
	to := netip.AddrPortFrom(dst, 7)
	stop, err := kit.EchoServer(h2, to.String())
	if err != nil {
		return r, err
	}
	defer stop()
	c, err := h1.Dial(ctx, "udp", to.String())
	if err != nil {
		return r, err
	}
	defer c.Close()
	got := make(chan time.Time, 1)
	go func() {
		buf := make([]byte, 64)
		if _, err := c.Read(buf); err == nil {
			got <- time.Now()
		}
	}()
	for i, x := range xs {
		if resolvedIn(x, eids[i]) {
			return r, fmt.Errorf("xtr%d has a mapping for %v before the flow", i+1, eids[i])
		}
	}
	start := time.Now()
	deadline := start.Add(3 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var lastSend time.Time
	var echoed bool
	for {
		now := time.Now()
		if !echoed && now.Sub(lastSend) >= 20*time.Millisecond {
			c.Write([]byte("braid-map-server-failover"))
			lastSend = now
		}
		select {
		case at := <-got:
			r.echo, echoed = at.Sub(start), true
		default:
		}
		done := echoed
		for i, x := range xs {
			if r.resolved[i] == 0 && resolvedIn(x, eids[i]) {
				r.resolved[i] = time.Since(start)
			}
			done = done && r.resolved[i] != 0
		}
		if done {
			return r, nil
		}
		if now.After(deadline) {
			return r, fmt.Errorf("after 3 s: echo %v, resolutions %v", echoed, r.resolved)
		}
		<-tick.C
	}
}

// resolvedIn reports whether x's map-cache holds a resolved entry covering a.
func resolvedIn(x *xtr.XTR, a netip.Addr) bool {
	for _, e := range x.Status().Cache {
		if !e.Pending && !e.Negative && e.Prefix.Contains(a) {
			return true
		}
	}
	return false
}

// resolving reports whether x has a resolution in progress.
func resolving(x *xtr.XTR) bool {
	for _, e := range x.Status().Cache {
		if e.Pending {
			return true
		}
	}
	return false
}
