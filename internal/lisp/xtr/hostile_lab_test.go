package xtr_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab/labtest"
	"braid/internal/lisp/mapserver"
	"braid/internal/lisp/xtr"
	"braid/internal/traffic"
	"braid/internal/wire/lisp"
)

// TestLispHostileFlood floods every listening LISP role, twice for 10 s, while a transfer crosses the
// two xTRs (issue 18, "Done when"): from the core router, acting as the attacker, towards xtr2's
// data port (data packets whose inner source is one of site 2's own EIDs, data packets from an
// outer source that is no locator of the inner source, random bytes), xtr2's control port
// (RLOC probes asking for an answer to a victim, ECMs not from a map server, random bytes) and
// the map server (a captured Map-Register of site 2 replayed from the attacker's address,
// registrations of site 2's prefix with the attacker as locator under a wrong key, Map-Requests
// for site 2 with a victim's ITR-RLOC, random bytes). The transfer keeps at least 90 % of the
// rate it has beside the same flood sent to ports where nothing listens (the flood's share of
// the 50 Mbit/s links and of the CPU whoever receives it), a file crosses intact under the flood,
// site 2's registration still names only its own RLOCs, and every kind of attack is counted
// where it is dropped.
func TestLispHostileFlood(t *testing.T) {
	labtest.Require(t)
	l := labtest.Up(t, roles.LispTopology(2*time.Millisecond, 50e6))
	// Site 2 sends and takes its traffic on its first RLOC, the one the attacker floods: with
	// both at one priority, a connection hashed onto the second RLOC crossed a link free of
	// the flood's 4 Mbit/s and carried 47.0 Mbit/s against 42.3 on the first, so the two
	// conditions compared below differed by which link each transfer took.
	ll, err := roles.StartLisp(context.Background(), l, func(site int, o *xtr.Options) {
		if site == 1 {
			o.Locators[1].Priority = 2
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ll.Close(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	s1, s2 := roles.LispSites[0], roles.LispSites[1]
	h1, h2 := l.Host("h1"), l.Host("h2")
	ctx := t.Context()
	addr := netip.AddrPortFrom(s2.HostIP[0], 5201).String()
	stop, err := kit.StartServer(ctx, h2, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	// The first transfer resolves the mapping; the measurements below start with it cached.
	if _, err := traffic.File(ctx, h1.Dial, addr, traffic.FileOptions{Size: 1 << 20, Seed: 1}); err != nil {
		t.Fatal(err)
	}

	attacker := l.Host("core")
	pc, err := attacker.ListenPacket("udp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	self := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	victim := s1.RLOCs[0] // xtr1's RLOC: where the attacker wants answers sent
	xtr2 := s2.RLOCs[0]

	type target struct {
		what string
		to   netip.Addr
		port uint16
		msgs [][]byte
	}
	junk := func(n int) [][]byte {
		var out [][]byte
		for range n {
			b := make([]byte, 20+n%7*60)
			rand.Read(b)
			out = append(out, b)
		}
		return out
	}
	targets := []target{
		{"xtr2 data", xtr2, lisp.DataPort, append([][]byte{
			dataPacket(t, s2.HostIP[0], s2.HostIP[0]),                   // inner source inside site 2's own EIDs
			dataPacket(t, s1.HostIP[0], s2.HostIP[0]),                   // a real EID, but from no locator of it
			dataPacket(t, netip.MustParseAddr("8.8.8.8"), s2.HostIP[0]), // a source nobody maps
		}, junk(8)...)},
		{"xtr2 control", xtr2, lisp.ControlPort, append([][]byte{
			mapRequest(t, lisp.ReqProbe, victim, s2.EIDs[0]),
			ecm(t, self, netip.AddrPortFrom(xtr2, lisp.ControlPort), mapRequest(t, 0, victim, s2.EIDs[0])),
			// A Map-Request cut short: a known type that does not decode. Random bytes alone
			// are that only when their first nibble names a known type (3 of 16), so a run of
			// 8 random messages had no such message one time in five.
			mapRequest(t, 0, victim, s2.EIDs[0])[:12],
			unknownType(),
		}, junk(8)...)},
		{"map server", roles.LispMapServer.Addr(), lisp.ControlPort, append([][]byte{
			register(t, s2, s2.RLOCs, s2.Key, 0x5eed), // a captured registration of site 2, replayed
			register(t, s2, []netip.Addr{self.Addr()}, "a-guess-at-the-site2-key", 0x5eee),
			ecm(t, netip.AddrPortFrom(victim, lisp.ControlPort), roles.LispMapServer, mapRequest(t, 0, victim, s2.EIDs[0])),
		}, junk(8)...)},
	}

	// flood sends, every millisecond, 3 messages to each target (9 000 a second in all) at the
	// target's port plus shift, until stop is closed, and reports how many it sent.
	flood := func(shift uint16, stop <-chan struct{}, sent chan<- int) {
		n := 0
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				sent <- n
				return
			case <-tick.C:
			}
			for _, tg := range targets {
				to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(tg.to, tg.port+shift))
				for i := range 3 {
					pc.WriteTo(tg.msgs[(n+i)%len(tg.msgs)], to)
				}
			}
			n += 3 * len(targets)
		}
	}
	underFlood := func(shift uint16, run func()) int {
		stop, sent := make(chan struct{}), make(chan int)
		go flood(shift, stop, sent)
		run()
		close(stop)
		return <-sent
	}
	opts := traffic.BulkOptions{Duration: 10 * time.Second}
	bulk := func() traffic.BulkResult {
		r, err := traffic.Bulk(ctx, h1.Dial, addr, opts)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// Two rounds, each the transfer beside the flood sent to closed ports (4343 and 4344:
	// nothing listens there on the xTR or the map server), then beside the flood itself; the
	// rates compared are the medians of each condition's 1 s samples of both rounds (after each
	// transfer's first), so that one slow second of a busy machine does not decide.
	var quietS, floodS []float64
	samples := func(r traffic.BulkResult, into *[]float64) {
		var per []string
		for i, s := range r.Samples {
			per = append(per, fmt.Sprintf("%.1f", s.BitsPerSecond/1e6))
			if i > 0 {
				*into = append(*into, s.BitsPerSecond)
			}
		}
		t.Logf("%v; seconds: %s Mbit/s", r, strings.Join(per, " "))
	}
	var file traffic.FileResult
	var ms0, ms1, x0, x1 map[string]uint64
	var floodFor time.Duration
	n := 0
	for round := range 2 {
		underFlood(2, func() { samples(bulk(), &quietS) })
		if round == 0 {
			ms0, x0 = ll.MapServer.Counters(), ll.XTRs[1].Status().Counters
		}
		floodStart := time.Now()
		n += underFlood(0, func() {
			samples(bulk(), &floodS)
			if round == 0 {
				var err error
				if file, err = traffic.File(ctx, h1.Dial, addr, traffic.FileOptions{Size: 8 << 20, Seed: 2}); err != nil {
					t.Error(err)
				}
			}
		})
		floodFor += time.Since(floodStart)
	}
	ms1, x1 = ll.MapServer.Counters(), ll.XTRs[1].Status().Counters
	quiet, flooded := kit.Median(quietS), kit.Median(floodS)
	t.Logf("h1 -> h2 beside the flood sent to closed ports %.1f Mbit/s; with %d messages (%.0f/s) sent to the xTR and the map server: %.1f Mbit/s (%.2f); file %v",
		quiet/1e6, n, float64(n)/floodFor.Seconds(), flooded/1e6, flooded/quiet, file)
	if flooded < 0.9*quiet {
		t.Errorf("the transfer fell to %.2f of its rate under the flood (bound 0.9)", flooded/quiet)
	}
	if !file.Intact {
		t.Errorf("the file crossed damaged under the flood: %v", file)
	}
	if float64(n) < 6000*floodFor.Seconds() { // 9 000 a second planned; the ticker lags on a busy machine
		t.Errorf("the attacker sent only %d messages: not the flood the test is about", n)
	}
	for _, c := range []struct {
		where, counter string
		d              uint64
	}{
		{"xtr2", xtr.DropSpoofedSource, x1[xtr.DropSpoofedSource] - x0[xtr.DropSpoofedSource]},
		{"xtr2", xtr.DropOuterSource, x1[xtr.DropOuterSource] - x0[xtr.DropOuterSource]},
		{"xtr2", xtr.DropECMSource, x1[xtr.DropECMSource] - x0[xtr.DropECMSource]},
		{"xtr2", xtr.DropControl, x1[xtr.DropControl] - x0[xtr.DropControl]},
		{"xtr2", xtr.DropUnexpected, x1[xtr.DropUnexpected] - x0[xtr.DropUnexpected]},
		{"map server", mapserver.DropBadAuth, ms1[mapserver.DropBadAuth] - ms0[mapserver.DropBadAuth]},
		{"map server", "replayed or stale registrations", ms1[mapserver.DropReplay] + ms1[mapserver.DropStale] - ms0[mapserver.DropReplay] - ms0[mapserver.DropStale]},
	} {
		t.Logf("%s %s +%d", c.where, c.counter, c.d)
		if c.d == 0 {
			t.Errorf("%s counted no %s during the flood", c.where, c.counter)
		}
	}
	// RLOC probes and forwarded requests naming the victim are answered within the limiter's
	// budget (100 a second per destination, burst 200; xtr1's own probes are answered too),
	// far below the flood's rate of them (2 000 a second).
	d := x1[xtr.CountRequestsIn] - x0[xtr.CountRequestsIn]
	t.Logf("xtr2 answered %d requests in %v of flood (%.0f/s)", d, floodFor.Round(time.Millisecond), float64(d)/floodFor.Seconds())
	if float64(d) > 250*floodFor.Seconds()+400 {
		t.Errorf("xtr2 answered %d requests in %v (%.0f/s): the victim is flooded", d, floodFor, float64(d)/floodFor.Seconds())
	}
	for _, r := range ll.MapServer.Registrations(time.Now()) {
		if r.Site != s2.Name {
			continue
		}
		for _, loc := range r.Locators {
			if loc.Address != s2.RLOCs[0] && loc.Address != s2.RLOCs[1] {
				t.Errorf("site 2's registration %v now names %v", r.Prefix, loc.Address)
			}
		}
	}
}

// dataPacket is a LISP data packet (header, then an IPv4 UDP datagram from src to dst).
func dataPacket(t *testing.T, src, dst netip.Addr) []byte {
	t.Helper()
	h := lisp.DataHeader{Flags: lisp.DataNonce, Nonce: 0xabcdef}
	inner := lisp.IPUDP{Src: netip.AddrPortFrom(src, 40000), Dst: netip.AddrPortFrom(dst, 5201), TTL: 64, PayloadLen: 64}
	b := make([]byte, lisp.DataHeaderLen+inner.Len()+64)
	h.Encode(b)
	inner.Encode(b[lisp.DataHeaderLen:])
	return b
}

// unknownType is a control message of a type braid takes nowhere (15), random after its
// first byte.
func unknownType() []byte {
	b := make([]byte, 64)
	rand.Read(b)
	b[0] = 0xf0 | b[0]&0x0f
	return b
}

// mapRequest is a Map-Request for prefix whose answer is to go to itr.
func mapRequest(t *testing.T, flags uint32, itr netip.Addr, prefix netip.Prefix) []byte {
	t.Helper()
	var nonce [8]byte
	rand.Read(nonce[:])
	m := lisp.MapRequest{Flags: flags, Nonce: binary.BigEndian.Uint64(nonce[:]), ITRRLOCs: []lisp.Addr{lisp.AddrFrom(itr)},
		Records: []lisp.RequestRecord{{MaskLen: uint8(prefix.Bits()), EID: lisp.AddrFrom(prefix.Addr())}}}
	b := make([]byte, m.Len())
	if m.Encode(b) != len(b) {
		t.Fatalf("map-request %+v does not encode", m)
	}
	return b
}

// ecm encapsulates msg with inner headers from src to dst.
func ecm(t *testing.T, src, dst netip.AddrPort, msg []byte) []byte {
	t.Helper()
	e := lisp.ECM{Inner: lisp.IPUDP{Src: src, Dst: dst, TTL: 64, PayloadLen: uint16(len(msg))}}
	b := make([]byte, e.Len()+len(msg))
	if e.Encode(b) != e.Len() {
		t.Fatal("ecm does not encode")
	}
	copy(b[e.Len():], msg)
	return b
}

// register is a Map-Register of every EID prefix of site s with locators, signed with key.
func register(t *testing.T, s roles.LispSite, locators []netip.Addr, key string, nonce uint64) []byte {
	t.Helper()
	m := lisp.MapRegister{Flags: lisp.RegWantNotify, Nonce: nonce, AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32)}
	for _, p := range s.EIDs {
		r := lisp.Record{TTL: 10, MaskLen: uint8(p.Bits()), EID: lisp.AddrFrom(p.Addr())}
		for _, a := range locators {
			r.Locators = append(r.Locators, lisp.Locator{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(a)})
		}
		m.Records = append(m.Records, r)
	}
	b := make([]byte, m.Len())
	if m.Encode(b) != len(b) {
		t.Fatal("map-register does not encode")
	}
	if err := lisp.Sign(b, []byte(key)); err != nil {
		t.Fatal(err)
	}
	return b
}
