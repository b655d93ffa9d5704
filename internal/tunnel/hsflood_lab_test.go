package tunnel_test

import (
	"crypto/rand"
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/lab/labtest"
	"braid/internal/lab/scenario"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
	"braid/internal/wire/mpath"
)

// An attacker floods a tunnel's uplink with handshake initiations while a transfer runs (issue
// 18 item 11): random bytes, and initiations closed by a valid MAC (the attacker knows the
// responder's public key, which is no secret) but otherwise garbage, each of which would cost
// X25519 work. The responder, b, learns its peer's paths (no fixed remote), so the sender's
// address alone refuses nothing: the MAC drops the junk, and the handshake worker's budget
// bounds what the rest costs. The transfer through the tunnel keeps at least 90 % of the rate it
// has beside the same flood sent to a port where nothing listens (the flood takes a share of the
// 50 Mbit/s link and of the CPU whoever receives it).
func TestTunnelHandshakeFlood(t *testing.T) {
	l := labtest.Up(t, scenario.ParallelLinks("hsf", topo.Shape{Rate: 50e6, Delay: 2 * time.Millisecond}))
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
	quiet, _ := transfer(scenario.TunnelPort + 1)
	before := eps[1].tunnel.Status().Counters
	flooded, n := transfer(scenario.TunnelPort)
	after := eps[1].tunnel.Status().Counters
	d := func(k string) uint64 { return after[k] - before[k] }
	t.Logf("transfer beside the flood sent to a closed port %.1f Mbit/s; with the flood of %d initiations (%.0f/s) sent to the tunnel: %.1f Mbit/s (%.2f); b dropped %d on the MAC, %d over the budget, %d failed the handshake",
		quiet.Steady/1e6, n, float64(n)/opts.Duration.Seconds(), flooded.Steady/1e6, flooded.Steady/quiet.Steady,
		d("drop_handshake_mac"), d("drop_handshake_busy"), d("drop_handshake"))
	if flooded.Steady < 0.9*quiet.Steady {
		t.Errorf("the transfer fell to %.2f of its rate under the flood (bound 0.9)", flooded.Steady/quiet.Steady)
	}
	if d("drop_handshake_mac") == 0 || d("drop_handshake_busy") == 0 {
		t.Errorf("the flood was not sorted as it should be: drop_handshake_mac %d, drop_handshake_busy %d", d("drop_handshake_mac"), d("drop_handshake_busy"))
	}
	if n < 3000*int(opts.Duration.Seconds()) {
		t.Errorf("the attacker sent only %d initiations in %v: not the flood the test is about", n, opts.Duration)
	}
}
