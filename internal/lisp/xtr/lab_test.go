package xtr_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab/labtest"
	"braid/internal/lisp/mapserver"
	"braid/internal/lisp/xtr"
	"braid/internal/wire/lisp"
)

func startLisp(t *testing.T, adjust func(int, *xtr.Options)) *roles.LispLab {
	t.Helper()
	labtest.Require(t)
	l := labtest.Up(t, roles.LispTopology(2*time.Millisecond, 0))
	// The context bounds the whole run of the roles, not only their start.
	ll, err := roles.StartLisp(context.Background(), l, adjust)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ll.Close(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return ll
}

// TestLispLab: hosts at two multihomed sites reach each other through braid xTRs that learned
// the mappings from a braid map server; a registration with a wrong key changes nothing; a cut
// RLOC is left within the configured probe interval and down time.
func TestLispLab(t *testing.T) {
	ll := startLisp(t, func(_ int, o *xtr.Options) { o.Placement = true })
	l := ll.Lab
	h1, h2 := l.Host("h1"), l.Host("h2")
	ctx := context.Background()
	s1, s2 := roles.LispSites[0], roles.LispSites[1]

	t.Run("reach", func(t *testing.T) {
		for _, c := range []struct {
			from, to string
			addr     netip.Addr
		}{{"h1", "h2", s2.HostIP[0]}, {"h2", "h1", s1.HostIP[0]}, {"h1", "h2", s2.HostIP[1]}} {
			gap, err := kit.Ping(ctx, l.Host(c.from), l.Host(c.to), c.addr, 1500*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			// The first packets wait for the mapping; after that the echo must flow.
			if gap > time.Second {
				t.Errorf("%s -> %s %v: longest gap %v", c.from, c.to, c.addr, gap)
			}
		}
		st := ll.XTRs[0].Status()
		if st.Counters[xtr.CountTxPackets] == 0 || st.Counters[xtr.CountRequests] == 0 {
			t.Errorf("xtr1 counters %v", st.Counters)
		}
		found := false
		for _, e := range st.Cache {
			if e.Prefix == s2.EIDs[0] && len(e.Locators) == 2 && !e.Negative {
				found = true
			}
		}
		if !found {
			t.Errorf("xtr1 map-cache has no 2-RLOC entry for %v: %+v", s2.EIDs[0], st.Cache)
		}
	})

	t.Run("wrong key refused", func(t *testing.T) {
		before := ll.MapServer.Registrations(time.Now())
		c0 := ll.MapServer.Counters()
		// A host of site 1 claims site 2's prefix with its own address as the locator.
		m := lisp.MapRegister{Flags: lisp.RegWantNotify, Nonce: 12345, AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32),
			Records: []lisp.Record{{TTL: 10, MaskLen: 24, EID: lisp.AddrFrom(s2.EIDs[0].Addr()),
				Locators: []lisp.Locator{{Priority: 1, Weight: 100, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(s1.RLOCs[0])}}}}}
		b := make([]byte, m.Len())
		m.Encode(b)
		lisp.Sign(b, []byte("not-the-site2-key"))
		pc, err := h1.ListenPacket("udp4", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		if _, err := pc.WriteTo(b, net.UDPAddrFromAddrPort(roles.LispMapServer)); err != nil {
			t.Fatal(err)
		}
		pc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if n, _, err := pc.ReadFrom(make([]byte, 1500)); err == nil {
			t.Errorf("the map server answered a forged registration (%d bytes)", n)
		}
		c1 := ll.MapServer.Counters()
		if c1[mapserver.DropBadAuth] != c0[mapserver.DropBadAuth]+1 {
			t.Errorf("auth failures %d -> %d", c0[mapserver.DropBadAuth], c1[mapserver.DropBadAuth])
		}
		after := ll.MapServer.Registrations(time.Now())
		if len(after) != len(before) {
			t.Fatalf("registrations %d -> %d", len(before), len(after))
		}
		for i := range after {
			if after[i].Prefix == s2.EIDs[0] && after[i].Locators[0].Address != s2.RLOCs[0] && after[i].Locators[0].Address != s2.RLOCs[1] {
				t.Errorf("site 2's mapping changed: %+v", after[i])
			}
		}
	})

	t.Run("rloc failover", func(t *testing.T) {
		// Which of site 1's RLOCs carries h1 -> h2 now? Cut that one.
		gapc := make(chan time.Duration, 1)
		errc := make(chan error, 1)
		go func() {
			g, err := kit.Ping(ctx, h1, h2, s2.HostIP[0], 5*time.Second)
			gapc <- g
			errc <- err
		}()
		txBy := func() map[netip.Addr]uint64 {
			m := map[netip.Addr]uint64{}
			for _, p := range ll.XTRs[0].Status().Pairs {
				m[p.Local] += p.TxPackets
			}
			return m
		}
		time.Sleep(500 * time.Millisecond)
		tx0 := txBy()
		time.Sleep(500 * time.Millisecond)
		tx1 := txBy()
		used := -1
		var most uint64
		for j, r := range s1.RLOCs {
			if d := tx1[r] - tx0[r]; d > most {
				used, most = j, d
			}
		}
		if used < 0 {
			t.Fatal("no pair carries traffic")
		}
		link := l.Link(s1.Links[used])
		link.Cut()
		defer link.Restore()
		gap, err := <-gapc, <-errc
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("cut %s (RLOC %v): longest gap %v (probe interval 300ms, down after 1s)", s1.Links[used], s1.RLOCs[used], gap)
		if gap > 3*time.Second {
			t.Errorf("gap %v after cutting RLOC %v, want < 3s", gap, s1.RLOCs[used])
		}
		if gap < 300*time.Millisecond {
			t.Errorf("gap %v: the cut link was not carrying the pings", gap)
		}
		for _, p := range ll.XTRs[0].Status().Pairs {
			if p.Local == s1.RLOCs[used] && p.Up {
				t.Errorf("pair %v -> %v still up after the cut", p.Local, p.Remote)
			}
		}
	})

	t.Run("placement", func(t *testing.T) {
		// Pairs come back up with the first probe answered after the restore, at both sites
		// (placement is symmetric only when both sites see the same pairs alive).
		deadline := time.Now().Add(3 * time.Second)
		for {
			up := 0
			for _, x := range ll.XTRs {
				for _, p := range x.Status().Pairs {
					if p.Up {
						up++
					}
				}
			}
			if up == 8 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of 8 RLOC pairs up 3 s after the restore", up)
			}
			time.Sleep(50 * time.Millisecond)
		}
		placement(t, ll)
	})
}

// placement opens 4 TCP connections whose (sport + dport) mod 4 are 0..3, echoes 256 KiB over
// each in turn, and finds on the emulated links which RLOC pair carried each direction.
func placement(t *testing.T, ll *roles.LispLab) {
	l := ll.Lab
	s1, s2 := roles.LispSites[0], roles.LispSites[1]
	const dport = 5001
	ln, err := l.Host("h2").Listen("tcp", netip.AddrPortFrom(s2.HostIP[0], dport).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	type dirBytes [2][2]uint64 // [site][rloc] bytes leaving the site's xTR (0) or reaching it (1)
	snap := func() (d dirBytes, in dirBytes) {
		for si, s := range []roles.LispSite{s1, s2} {
			for j, name := range s.Links {
				d[si][j] = l.Link(name).Stats(0).Bytes  // xTR -> core
				in[si][j] = l.Link(name).Stats(1).Bytes // core -> xTR
			}
		}
		return d, in
	}
	busiest := func(a, b [2]uint64) int {
		i, most := -1, uint64(128<<10)
		for j := range a {
			if d := b[j] - a[j]; d > most {
				i, most = j, d
			}
		}
		return i
	}
	used := map[[2]int]int{}
	payload := bytes.Repeat([]byte("braid-lisp-placement"), 256<<10/20)
	for r := range 4 {
		sport := 40000
		for (sport+dport)%4 != r {
			sport++
		}
		var c net.Conn
		err := l.Host("h1").NS.Spawn(func() (err error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: s1.HostIP[0].AsSlice(), Port: sport}, Timeout: 5 * time.Second}
			c, err = d.Dial("tcp", netip.AddrPortFrom(s2.HostIP[0], dport).String())
			return err
		})
		if err != nil {
			t.Fatalf("dial from port %d: %v", sport, err)
		}
		out0, in0 := snap()
		go c.Write(payload)
		back := make([]byte, len(payload))
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, back); err != nil || !bytes.Equal(back, payload) {
			t.Fatalf("echo over port %d: %v", sport, err)
		}
		c.Close()
		out1, in1 := snap()
		fwd := [2]int{busiest(out0[0], out1[0]), busiest(in0[1], in1[1])} // h1 -> h2
		rev := [2]int{busiest(in0[0], in1[0]), busiest(out0[1], out1[1])} // h2 -> h1
		t.Logf("sport %d (residue %d): h1->h2 on RLOCs %v -> %v, h2->h1 on %v -> %v", sport, r,
			rloc(s1, fwd[0]), rloc(s2, fwd[1]), rloc(s2, rev[1]), rloc(s1, rev[0]))
		if fwd[0] < 0 || fwd[1] < 0 || fwd != rev {
			t.Errorf("sport %d: the two directions use different RLOC pairs (%v, %v)", sport, fwd, rev)
		}
		used[fwd]++
	}
	if len(used) != 4 {
		t.Errorf("4 subflows used %d RLOC pairs: %v", len(used), used)
	}
}

func rloc(s roles.LispSite, i int) any {
	if i < 0 {
		return "none"
	}
	return s.RLOCs[i]
}
