package tunnel_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"braid/internal/tunnel"
	"braid/internal/wire/mpt"
)

// mptPair is two mpt-mode sites over an in-memory network: a (192.0.2.1, inner 10.1.0.0/16,
// tunnel address 10.255.0.1) and b (192.0.2.2, inner 10.2.0.0/16, tunnel address 10.255.0.2),
// one path, keepalives every 20 ms, dead after 100 ms.
type mptPair struct {
	net        *memNet
	a, b       *tunnel.MPTTunnel
	devA, devB *memDev
	addrA      netip.AddrPort
	addrB      netip.AddrPort
}

func startMPTPair(t *testing.T) *mptPair {
	t.Helper()
	s := &mptPair{net: newMemNet(), devA: newMemDev(), devB: newMemDev(),
		addrA: netip.MustParseAddrPort("192.0.2.1:65010"), addrB: netip.MustParseAddrPort("192.0.2.2:65010")}
	mk := func(dev *memDev, self, peer netip.AddrPort, routes string, local, remote string) *tunnel.MPTTunnel {
		tn, err := tunnel.NewMPT(tunnel.MPTOptions{Device: dev, IPVersion: 4,
			Routes:    []netip.Prefix{netip.MustParsePrefix(routes)},
			Uplinks:   []tunnel.Uplink{{Name: "u", Conn: s.net.listen(self.String())}},
			Paths:     []tunnel.MPTPath{{Uplink: "u", Remote: peer}},
			Keepalive: 20 * time.Millisecond, DeadTime: 100 * time.Millisecond,
			LocalTunnelIP: netip.MustParseAddr(local), RemoteTunnelIP: netip.MustParseAddr(remote)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tn.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
		return tn
	}
	s.a = mk(s.devA, s.addrA, s.addrB, "10.2.0.0/16", "10.255.0.1", "10.255.0.2")
	s.b = mk(s.devB, s.addrB, s.addrA, "10.1.0.0/16", "10.255.0.2", "10.255.0.1")
	return s
}

// mptData is an MPT data datagram (no sequence number) carrying inner.
func mptData(inner []byte) []byte {
	b := make([]byte, mpt.HeaderLen, mpt.HeaderLen+len(inner))
	mpt.EncodeData(b, 4, 0, false)
	return append(b, inner...)
}

// An attacker who sends from b's address (mpt mode has no authentication) injects inner
// packets into a's networks (issue 18 item 13): one whose source is outside b's routes is
// dropped and counted (drop_spoofed); one from inside them is delivered, which mpt mode cannot
// tell from b's own (docs/security.md says so).
func TestMPTSpoofedInnerSource(t *testing.T) {
	s := startMPTPair(t)
	dst := "10.1.0.1"
	spoofed := ipv4("10.9.9.9", dst, []byte("spoofed source"))
	inside := ipv4("10.2.0.5", dst, []byte("inside the routes"))
	for range 10 {
		s.net.inject(s.addrB, s.addrA, mptData(spoofed))
	}
	s.net.inject(s.addrB, s.addrA, mptData(inside))
	deadline := time.After(2 * time.Second)
	for {
		select {
		case p := <-s.devA.out:
			if string(p[28:]) == "spoofed source" {
				t.Fatal("a packet with an inner source outside the peer's routes was delivered")
			}
			if string(p[28:]) != "inside the routes" {
				continue
			}
		case <-deadline:
			t.Fatal("the packet from inside the peer's routes was not delivered")
		}
		break
	}
	time.Sleep(20 * time.Millisecond)
	select {
	case p := <-s.devA.out:
		if string(p[28:]) == "spoofed source" {
			t.Fatal("a packet with an inner source outside the peer's routes was delivered")
		}
	default:
	}
	if n := s.a.Status().Counters["drop_spoofed"]; n != 10 {
		t.Errorf("drop_spoofed %d, want 10", n)
	}
}

// b's datagrams stop reaching a (the path is dead), and an attacker keeps sending from b's
// address what would once have kept the path up (issue 18 item 13): junk, commands, data with
// spoofed inner sources and keepalives that do not name the connection's tunnel addresses, every
// 10 ms. a must take the path down within its dead time plus a margin (100 + 200 ms) all the
// same; before, any datagram from the path's address counted as the peer alive.
func TestMPTSpoofedKeepalive(t *testing.T) {
	s := startMPTPair(t)
	up := func() bool { return s.a.Status().Paths[0].State == "up" }
	time.Sleep(200 * time.Millisecond)
	if !up() {
		t.Fatalf("the path is not up with both sites talking: %+v", s.a.Status().Paths[0])
	}
	s.net.mu.Lock()
	s.net.tap = func(from, to netip.AddrPort, b []byte) bool { return from != s.addrB } // b's packets are lost
	s.net.mu.Unlock()
	cut := time.Now()

	junk := [][]byte{
		mptData(ipv4("10.9.9.9", "10.1.0.1", []byte("x"))), // spoofed inner source
		mptData([]byte{0x45, 0, 0}),                        // no inner packet
		append(mptData(nil), 0xA2, 0, 0, 0),                // a command that is not a keepalive
		{0, 0},                                             // truncated GRE
		(&mpt.Keepalive{IPVer: 4, Local: netip.MustParseAddr("0.0.0.0"), Remote: netip.MustParseAddr("0.0.0.0")}).Append(mptData(nil)),
		(&mpt.Keepalive{IPVer: 4, Local: netip.MustParseAddr("10.0.0.2"), Remote: netip.MustParseAddr("10.0.0.1")}).Append(mptData(nil)),
	}
	var downAfter time.Duration
	for i := 0; time.Since(cut) < 600*time.Millisecond; i++ {
		s.net.inject(s.addrB, s.addrA, junk[i%len(junk)])
		if downAfter == 0 && !up() {
			downAfter = time.Since(cut)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c := s.a.Status().Counters
	t.Logf("path down %v after b went silent, under forged datagrams every 10 ms; drop_keepalive_mismatch %d, drop_spoofed %d, drop_command %d, drop_bad_gre %d, drop_bad_inner %d",
		downAfter.Round(time.Millisecond), c["drop_keepalive_mismatch"], c["drop_spoofed"], c["drop_command"], c["drop_bad_gre"], c["drop_bad_inner"])
	if downAfter == 0 || downAfter > 300*time.Millisecond {
		t.Errorf("forged datagrams held the dead path up (down after %v; dead time 100 ms, bound 300 ms)", downAfter)
	}
	if c["drop_keepalive_mismatch"] == 0 {
		t.Error("no forged keepalive was counted as such")
	}
}
