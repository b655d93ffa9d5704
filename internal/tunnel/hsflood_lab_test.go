package tunnel_test

import (
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
	"braid/internal/wire/mpath"

	"golang.org/x/sys/unix"
)

// An attacker floods a tunnel's uplink with handshake initiations while a transfer runs (issue
// 18 item 11): random bytes, and initiations closed by a valid MAC (the attacker knows the
// responder's public key, which is no secret) but otherwise garbage, each of which would cost
// X25519 work. The responder, b, learns its peer's paths (no fixed remote), so the sender's
// address alone refuses nothing: the MAC drops the junk, and the handshake worker's budget
// bounds what the rest costs (under load, the cookie: TestTunnelHandshakeCookie). The transfer through the tunnel keeps at least 90 % of the rate it
// has beside the same flood sent to a port where nothing listens (the flood takes a share of the
// 50 Mbit/s link and of the CPU whoever receives it).
func TestTunnelHandshakeFlood(t *testing.T) {
	l := labtest.Up(t, kit.ParallelLinks("hsf", topo.Shape{Rate: 50e6, Delay: 2 * time.Millisecond}))
	eps := startTunnels(t, l, 4, func(side int, o *tunnel.Options) {
		if side == 1 {
			for i := range o.Peers[0].Paths {
				o.Peers[0].Paths[i].Remote = netip.AddrPort{}
			}
		}
	})
	waitUp(t, eps)
	addr := serve(t, eps[1].host, eps[1].inner4)
	ctx := t.Context()
	opts := traffic.BulkOptions{Duration: 8 * time.Second}

	// The attacker: another port on a's address, towards b.
	pc, err := eps[0].host.ListenPacket("udp", "10.9.0.1:5555")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	head := []byte{0x20, 0x00, 0x88, 0xb5, 0, 0, 0, 0} // GRE with key 0
	h := mpath.Header{Type: mpath.TypeHandshakeInit}
	hb := make([]byte, mpath.HeaderLen)
	h.Encode(hb)
	head = append(head, hb...)
	key := session.MAC1Key(eps[1].priv.Public())
	var junk, signed [][]byte
	for range 64 {
		body := make([]byte, session.InitLen+session.MAC1Len)
		rand.Read(body)
		junk = append(junk, append(append([]byte(nil), head...), body...))
		body = make([]byte, session.InitLen)
		rand.Read(body)
		signed = append(signed, append(append([]byte(nil), head...), session.AppendMAC1(body, &key)...))
	}
	// transfer runs the transfer under the flood sent to port of b: the tunnel's, or one where
	// nothing listens (the baseline, the flood's share of the link and of the CPU included).
	transfer := func(port uint16) (traffic.BulkResult, int) {
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("10.9.0.2"), port))
		stop := make(chan struct{})
		sent := make(chan int)
		go func() {
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
				for i := range 5 { // 10 a millisecond: 10 000 a second, half of them with a valid MAC
					pc.WriteTo(junk[(n+i)%len(junk)], to)
					pc.WriteTo(signed[(n+i)%len(signed)], to)
				}
				n += 10
			}
		}()
		res, err := traffic.Bulk(ctx, eps[0].host.Dial, addr, opts)
		close(stop)
		n := <-sent
		if err != nil {
			t.Fatal(err)
		}
		return res, n
	}
	quiet, _ := transfer(roles.TunnelPort + 1)
	before := eps[1].tunnel.Status().Counters
	flooded, n := transfer(roles.TunnelPort)
	after := eps[1].tunnel.Status().Counters
	d := func(k string) uint64 { return after[k] - before[k] }
	t.Logf("transfer beside the flood sent to a closed port %.1f Mbit/s; with the flood of %d initiations (%.0f/s) sent to the tunnel: %.1f Mbit/s (%.2f); b dropped %d on the MAC, %d over the budget, answered %d with a cookie, %d failed the handshake",
		quiet.Steady/1e6, n, float64(n)/opts.Duration.Seconds(), flooded.Steady/1e6, flooded.Steady/quiet.Steady,
		d("drop_handshake_mac"), d("drop_handshake_busy"), d("cookies_sent"), d("drop_handshake"))
	if flooded.Steady < 0.9*quiet.Steady {
		t.Errorf("the transfer fell to %.2f of its rate under the flood (bound 0.9)", flooded.Steady/quiet.Steady)
	}
	// Under load, initiations with a valid MAC are answered with cookie replies rather than
	// counted over the budget; either way they are kept from the worker.
	if d("drop_handshake_mac") == 0 || d("drop_handshake_busy")+d("cookies_sent") == 0 {
		t.Errorf("the flood was not sorted as it should be: drop_handshake_mac %d, drop_handshake_busy %d, cookies_sent %d", d("drop_handshake_mac"), d("drop_handshake_busy"), d("cookies_sent"))
	}
	if n < 3000*int(opts.Duration.Seconds()) {
		t.Errorf("the attacker sent only %d initiations in %v: not the flood the test is about", n, opts.Duration)
	}
}

// An attacker who knows the responder's public key floods it, from addresses where it does not
// receive (its sockets never read: what comes back to them is lost, as for a spoofed source),
// with initiations closed by a valid mac1, far more than the handshake worker's budget (issue
// 18 item 11, the cookie). A legitimate peer then starts, four times: each time the responder
// must have done its handshake within 1.5 s (one retry after the cookie reply: about 0.5 s),
// and the peer's session must come up. Without the cookie its initiations are among the flood's,
// each copy taken with a chance of budget/flood (about 1 in 20 at 10 000 a second), and a
// handshake takes several seconds; with it, the responder under load answers every initiation
// without mac2 with a cookie reply, the peer, which receives at its address, closes its next
// initiation with mac2, and only those are worked on.
func TestTunnelHandshakeCookie(t *testing.T) {
	l := labtest.Up(t, kit.ParallelLinks("hsc", topo.Shape{Rate: 1e9, Delay: 2 * time.Millisecond}))
	eps := newEndpoints(t, l)
	stopB := startSide(t, l, eps, 1, func(o *tunnel.Options) {
		for i := range o.Peers[0].Paths {
			o.Peers[0].Paths[i].Remote = netip.AddrPort{}
		}
	})
	t.Cleanup(func() {
		if err := stopB(); err != nil {
			t.Errorf("tunnel in b: %v", err)
		}
	})

	var conns []net.PacketConn
	for i := range 4 {
		pc, err := eps[0].host.ListenPacket("udp", fmt.Sprintf("10.9.0.1:%d", 5555+i))
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		conns = append(conns, pc)
	}
	head := []byte{0x20, 0x00, 0x88, 0xb5, 0, 0, 0, 0} // GRE with key 0
	h := mpath.Header{Type: mpath.TypeHandshakeInit}
	hb := make([]byte, mpath.HeaderLen)
	h.Encode(hb)
	head = append(head, hb...)
	key := session.MAC1Key(eps[1].priv.Public())
	var signed [][]byte
	for range 64 {
		body := make([]byte, session.InitLen)
		rand.Read(body)
		signed = append(signed, append(append([]byte(nil), head...), session.AppendMAC1(body, &key)...))
	}
	to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("10.9.0.2"), roles.TunnelPort))
	stop := make(chan struct{})
	sent := make(chan int)
	// The flood is smooth (paced every 100 µs, not in bursts a millisecond apart), as a sender
	// at line rate is: bursts would leave the budget's refill between them to whoever comes.
	flooding := time.Now()
	go func() {
		n := 0
		pause := unix.NsecToTimespec(int64(100 * time.Microsecond))
		for {
			select {
			case <-stop:
				sent <- n
				return
			default:
			}
			for want := int(time.Since(flooding).Seconds() * 10000); n < want; n++ { // 10 000 a second
				conns[n%len(conns)].WriteTo(signed[n%len(signed)], to)
			}
			unix.Nanosleep(&pause, nil)
		}
	}()
	defer func() {
		if stop != nil {
			close(stop)
			<-sent
		}
	}()
	time.Sleep(500 * time.Millisecond)

	// Each round: the time until b has done a handshake for a (junk never completes one), the
	// responder's part that the cookie protects, and the time until a's session is up, which
	// also needs b's response to reach a before a's next retry (500 ms later).
	var worked, up []time.Duration
	for round := range 4 {
		before := eps[1].tunnel.Status().Counters["handshakes_done"]
		started := time.Now()
		stopA := startSide(t, l, eps, 0, nil)
		var w, u time.Duration = -1, -1
		for time.Since(started) < 8*time.Second && (w < 0 || u < 0) {
			if w < 0 && eps[1].tunnel.Status().Counters["handshakes_done"] > before {
				w = time.Since(started)
			}
			if st := eps[0].tunnel.Status(); u < 0 && len(st.Peers) == 1 && st.Peers[0].Session {
				u = time.Since(started)
			}
			time.Sleep(5 * time.Millisecond)
		}
		ca := eps[0].tunnel.Status().Counters
		if err := stopA(); err != nil {
			t.Errorf("tunnel in a: %v", err)
		}
		worked, up = append(worked, w), append(up, u)
		t.Logf("round %d: b did a's handshake after %v, a's session up after %v (-1: not within 8 s); a sent %d initiations, received %d cookies",
			round, w.Round(time.Millisecond), u.Round(time.Millisecond), ca["handshakes_sent"], ca["cookies_received"])
	}
	close(stop)
	n := <-sent
	stop = nil
	rate := float64(n) / time.Since(flooding).Seconds()
	cb := eps[1].tunnel.Status().Counters
	t.Logf("flood: %d initiations (%.0f/s); b: %d cookie replies sent, %d over the budget, %d limited per source, %d handshakes done",
		n, rate, cb["cookies_sent"], cb["drop_handshake_busy"], cb["drop_handshake_rate"], cb["handshakes_done"])
	for i := range worked {
		if worked[i] < 0 || worked[i] > 1500*time.Millisecond {
			t.Errorf("round %d: b did the legitimate peer's handshake after %v under the flood (bound 1.5 s)", i, worked[i])
		}
		if up[i] < 0 {
			t.Errorf("round %d: the legitimate peer's session was not up within 8 s", i)
		}
	}
	if cb["cookies_sent"] == 0 {
		t.Error("b sent no cookie reply: the flood did not put it under load")
	}
	if rate < 8000 {
		t.Errorf("the attacker sent only %.0f initiations a second: not the flood the test is about", rate)
	}
}
