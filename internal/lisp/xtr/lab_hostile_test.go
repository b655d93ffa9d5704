package xtr_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lisp/mapserver"
	"braid/internal/lisp/xtr"
	"braid/internal/wire/lisp"
)

// TestLispLabAttacker (issue 18, items 4, 6 and 7): the core router of the LISP lab acts as an
// attacker on the path between the sites and the map server, with its own addresses. It
// replays site 2's registration from its own address and asks for site 2's EID, injects
// encapsulated packets into site 2 with site 1's and site 2's EIDs as inner sources, and sends
// the map server large requests that name itself as the ITR-RLOC.
func TestLispLabAttacker(t *testing.T) {
	ll := startLisp(t, nil)
	l := ll.Lab
	core, h1, h2 := l.Host("core"), l.Host("h1"), l.Host("h2")
	s1, s2 := roles.LispSites[0], roles.LispSites[1]
	ctx := context.Background()
	attacker := netip.MustParseAddr("10.0.9.2") // core's address toward the map server
	if _, err := kit.Ping(ctx, h1, h2, s2.HostIP[0], 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	listen := func(port int) net.PacketConn {
		pc, err := core.ListenPacket("udp4", netip.AddrPortFrom(attacker, uint16(port)).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		return pc
	}
	ms := net.UDPAddrFromAddrPort(roles.LispMapServer)

	t.Run("replayed registration", func(t *testing.T) {
		// What a capture of site 2's registration holds: its EIDs and RLOCs, signed with its key.
		reg := lisp.MapRegister{Nonce: 0x5eed, AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32),
			Records: []lisp.Record{{TTL: 10, MaskLen: 24, Authoritative: true, EID: lisp.AddrFrom(s2.EIDs[0].Addr())}}}
		for _, r := range s2.RLOCs {
			reg.Records[0].Locators = append(reg.Records[0].Locators, lisp.Locator{Priority: 1, Weight: 50, Flags: lisp.LocReachable | lisp.LocLocal, Addr: lisp.AddrFrom(r)})
		}
		b := make([]byte, reg.Len())
		reg.Encode(b)
		lisp.Sign(b, []byte(s2.Key))
		ctl, answers := listen(lisp.ControlPort), listen(4343)
		c0 := ll.MapServer.Counters()
		if _, err := ctl.WriteTo(b, ms); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Second)
		for ll.MapServer.Counters()[mapserver.CountRegistered] == c0[mapserver.CountRegistered] && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		// The map server took it (random nonces: replay = "window"); now ask for site 2's EID.
		req := lisp.MapRequest{Nonce: 0xabc, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(attacker)},
			Records: []lisp.RequestRecord{{MaskLen: 32, EID: lisp.AddrFrom(s2.HostIP[0])}}}
		e := lisp.ECM{Inner: lisp.IPUDP{Src: netip.AddrPortFrom(attacker, 4343), Dst: netip.AddrPortFrom(s2.HostIP[0], lisp.ControlPort), TTL: 64, PayloadLen: uint16(req.Len())}}
		q := make([]byte, e.Len()+req.Len())
		req.Encode(q[e.Len():])
		e.Encode(q)
		if _, err := answers.WriteTo(q, ms); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 65536)
		ctl.SetReadDeadline(time.Now().Add(time.Second))
		if n, from, err := ctl.ReadFrom(buf); err == nil {
			t.Errorf("the map server forwarded a request for site 2 to the replaying host (%d bytes from %v)", n, from)
		}
		answers.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, from, err := answers.ReadFrom(buf)
		if err != nil {
			t.Fatalf("site 2's ETR did not answer: %v", err)
		}
		var rep lisp.MapReply
		src := from.(*net.UDPAddr).AddrPort().Addr().Unmap()
		if _, err := rep.Decode(buf[:n]); err != nil || rep.Nonce != 0xabc || (src != s2.RLOCs[0] && src != s2.RLOCs[1]) {
			t.Errorf("answer from %v: %+v %v", src, rep, err)
		}
	})

	t.Run("spoofed data", func(t *testing.T) {
		sink, err := h2.ListenPacket("udp4", netip.AddrPortFrom(s2.HostIP[0], 7777).String())
		if err != nil {
			t.Fatal(err)
		}
		defer sink.Close()
		data, err := core.ListenPacket("udp4", netip.AddrPortFrom(netip.MustParseAddr("10.0.3.2"), 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer data.Close()
		etr := net.UDPAddrFromAddrPort(netip.AddrPortFrom(s2.RLOCs[0], lisp.DataPort))
		c0 := ll.XTRs[1].Counters()
		sources := []netip.Addr{s1.HostIP[0], netip.MustParseAddr("192.168.2.9"), netip.MustParseAddr("192.168.77.7")}
		for round := range 5 {
			for i, src := range sources {
				payload := []byte("evil-" + src.String())
				u := lisp.IPUDP{Src: netip.AddrPortFrom(src, 5555), Dst: netip.AddrPortFrom(s2.HostIP[0], 7777), TTL: 64, PayloadLen: uint16(len(payload))}
				pkt := make([]byte, lisp.DataHeaderLen+u.Len()+len(payload))
				h := lisp.DataHeader{Flags: lisp.DataNonce | lisp.DataIID, Nonce: uint32(round*10 + i)}
				h.Encode(pkt)
				copy(pkt[lisp.DataHeaderLen+u.Len():], payload)
				u.Encode(pkt[lisp.DataHeaderLen:])
				if _, err := data.WriteTo(pkt, etr); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		// A legitimate datagram from h1 through the xTRs arrives.
		legit, err := h1.ListenPacket("udp4", netip.AddrPortFrom(s1.HostIP[0], 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer legit.Close()
		got := map[string]int{}
		buf := make([]byte, 1500)
		for try := 0; try < 20 && got["legit"] == 0; try++ {
			legit.WriteTo([]byte("legit"), net.UDPAddrFromAddrPort(netip.AddrPortFrom(s2.HostIP[0], 7777)))
			sink.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			for {
				n, _, err := sink.ReadFrom(buf)
				if err != nil {
					break
				}
				got[string(buf[:n])]++
			}
		}
		if got["legit"] == 0 {
			t.Fatal("the legitimate datagram did not arrive")
		}
		for k, n := range got {
			if strings.HasPrefix(k, "evil") {
				t.Errorf("%d injected datagrams %q delivered", n, k)
			}
		}
		c1 := ll.XTRs[1].Counters()
		t.Logf("xtr2: %d dropped for an own-EID inner source, %d for an outer source that is not a locator",
			c1[xtr.DropSpoofedSource]-c0[xtr.DropSpoofedSource], c1[xtr.DropOuterSource]-c0[xtr.DropOuterSource])
	})

	t.Run("reflection", func(t *testing.T) {
		victim := listen(4344)
		src := listen(0)
		req := lisp.MapRequest{Nonce: 1, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(attacker)}}
		for i := range 255 {
			a := s2.EIDs[0].Addr().As4()
			a[3] = byte(i)
			req.Records = append(req.Records, lisp.RequestRecord{MaskLen: 32, EID: lisp.AddrFrom(netip.AddrFrom4(a))})
		}
		e := lisp.ECM{Inner: lisp.IPUDP{Src: netip.AddrPortFrom(attacker, 4344), Dst: netip.AddrPortFrom(s2.HostIP[0], lisp.ControlPort), TTL: 64, PayloadLen: uint16(req.Len())}}
		q := make([]byte, e.Len()+req.Len())
		req.Encode(q[e.Len():])
		e.Encode(q)
		done := make(chan [2]int)
		go func() {
			buf := make([]byte, 65536)
			n, total := 0, 0
			for {
				victim.SetReadDeadline(time.Now().Add(time.Second))
				k, _, err := victim.ReadFrom(buf)
				if err != nil {
					done <- [2]int{n, total}
					return
				}
				n, total = n+1, total+k
			}
		}()
		const sent = 400
		start := time.Now()
		for range sent {
			src.WriteTo(q, ms)
			time.Sleep(time.Millisecond)
		}
		elapsed := time.Since(start)
		r := <-done
		factor := float64(r[1]) / float64(sent*len(q))
		perReply := 0.0
		if r[0] > 0 {
			perReply = float64(r[1]) / float64(r[0]) / float64(len(q))
		}
		t.Logf("%d requests of %d bytes in %v: %d replies, %d bytes (%.2fx per reply, %.2fx overall)", sent, len(q), elapsed.Round(time.Millisecond), r[0], r[1], perReply, factor)
		if r[0] == 0 {
			t.Fatal("no reply at all: the test does not measure anything")
		}
		if perReply > 3 {
			t.Errorf("a reply is %.1f times its request", perReply)
		}
		if limit := 200 + int(100*(elapsed+time.Second).Seconds()); r[0] > limit {
			t.Errorf("%d replies to one address, want at most %d", r[0], limit)
		}
	})
}
