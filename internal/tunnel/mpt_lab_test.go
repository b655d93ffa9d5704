package tunnel_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/sock"
	"braid/internal/traffic"
	"braid/internal/tun"
	"braid/internal/tunnel"
)

// mptPort is the UDP port of both ends, MPT's sample configuration's.
const mptPort = 23456

// mptEnd is one side of an MPT connection under test.
type mptEnd struct {
	host   *lab.Host
	tunnel *tunnel.MPTTunnel
	conns  []*sock.Conn // the uplinks' sockets, one per link
	inner4 netip.Addr
	inner6 netip.Addr
}

// mptRecConn is an uplink socket that records the datagrams sent on it.
type mptRecConn struct {
	*sock.Conn
	mu   sync.Mutex
	sent [][]byte
}

func (c *mptRecConn) Send(b []byte, dst netip.AddrPort) error {
	err := c.Conn.Send(b, dst)
	if err == nil {
		c.mu.Lock()
		if len(c.sent) < 10000 {
			c.sent = append(c.sent, bytes.Clone(b))
		}
		c.mu.Unlock()
	}
	return err
}

func (c *mptRecConn) datagrams() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.sent...)
}

// startMPT runs an MPT connection between a and b over every link of l, outer IPv4, ip_ver 4,
// keepalive 100 ms and dead time 300 ms unless mutate says otherwise. Inner addresses as in
// startTunnels: a 10.255.0.1 / fd00:ff::1, b 10.255.0.2 / fd00:ff::2.
func startMPT(t *testing.T, l *lab.Lab, mutate func(side int, o *tunnel.MPTOptions, e *mptEnd)) [2]*mptEnd {
	t.Helper()
	var eps [2]*mptEnd
	for i, name := range []string{"a", "b"} {
		eps[i] = &mptEnd{host: l.Host(name),
			inner4: netip.MustParseAddr(fmt.Sprintf("10.255.0.%d", i+1)), inner6: netip.MustParseAddr(fmt.Sprintf("fd00:ff::%d", i+1))}
	}
	for i, ep := range eps {
		other := eps[1-i]
		o := tunnel.MPTOptions{
			MTU: 1400, IPVersion: 4,
			Routes:    []netip.Prefix{netip.PrefixFrom(other.inner4, 32), netip.PrefixFrom(other.inner6, 128)},
			Keepalive: 100 * time.Millisecond, DeadTime: 300 * time.Millisecond,
			LocalTunnelIP: ep.inner4, RemoteTunnelIP: other.inner4,
		}
		for j, lk := range l.Links() {
			local, remote := lk.Spec.A, lk.Spec.B
			if i == 1 {
				local, remote = remote, local
			}
			la, ra := pickFamily(local.Addrs, 4), pickFamily(remote.Addrs, 4)
			var c *sock.Conn
			if err := ep.host.NS.Do(func() (err error) {
				c, err = sock.Listen(netip.AddrPortFrom(la, mptPort), "")
				return err
			}); err != nil {
				t.Fatal(err)
			}
			ep.conns = append(ep.conns, c)
			name := fmt.Sprintf("up%d", j)
			o.Uplinks = append(o.Uplinks, tunnel.Uplink{Name: name, Conn: c})
			o.Paths = append(o.Paths, tunnel.MPTPath{Uplink: name, Remote: netip.AddrPortFrom(ra, mptPort)})
		}
		var dev *tun.Device
		if err := ep.host.NS.Do(func() (err error) { dev, err = tun.Open("mpt0"); return err }); err != nil {
			t.Fatal(err)
		}
		if err := tun.Configure(ep.host.NS.Netlink(), "mpt0", o.MTU, []netip.Prefix{netip.PrefixFrom(ep.inner4, 24), netip.PrefixFrom(ep.inner6, 64)}); err != nil {
			t.Fatal(err)
		}
		o.Device = dev
		if mutate != nil {
			mutate(i, &o, ep)
		}
		tn, err := tunnel.NewMPT(o)
		if err != nil {
			dev.Close()
			for _, c := range ep.conns {
				c.Close()
			}
			t.Fatal(err)
		}
		ep.tunnel = tn
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tn.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("mpt %s: %v", ep.host.Name, err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("mpt %s did not stop within 10 s", ep.host.Name)
			}
		})
	}
	return eps
}

// waitMPTUp waits until every path of both ends is up and has received a keepalive.
func waitMPTUp(t *testing.T, eps [2]*mptEnd) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ok := true
		for _, ep := range eps {
			for _, p := range ep.tunnel.Status().Paths {
				ok = ok && p.State == "up" && p.KeepalivesReceived > 0
			}
		}
		if ok {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("mpt paths not up after 5 s: %+v / %+v", eps[0].tunnel.Status(), eps[1].tunnel.Status())
}

// mptTwoPaths is multiPath(2) with unequal delays (2 and 6 ms), so that packets sent
// alternately on the two paths arrive out of order.
func mptTwoPaths(rate uint64) *topo.Topology {
	tp := multiPath(2, topo.Shape{Rate: rate, Delay: 2 * time.Millisecond})
	slow := topo.Shape{Rate: rate, Delay: 6 * time.Millisecond}
	tp.Links[1].AB, tp.Links[1].BA = slow, slow
	return tp
}

// Two braid ends in mpt mode carry a 4 MiB file intact over two paths of unequal delay, with
// reordering off and with a 64-packet window, and both paths carry data.
func TestMPTIntegrity(t *testing.T) {
	for _, window := range []int{0, 64} {
		t.Run(fmt.Sprintf("reorder window %d", window), func(t *testing.T) {
			l := labtest.Up(t, mptTwoPaths(50e6))
			eps := startMPT(t, l, func(_ int, o *tunnel.MPTOptions, _ *mptEnd) {
				o.ReorderWindow, o.MaxBuffDelay = window, 20*time.Millisecond
			})
			waitMPTUp(t, eps)
			addr := serve(t, eps[1].host, eps[1].inner4)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			f, err := traffic.File(ctx, eps[0].host.Dial, addr, traffic.FileOptions{Size: 4 << 20, Seed: uint64(window) + 1})
			if err != nil {
				t.Fatalf("file: %v", err)
			}
			if !f.Intact {
				t.Errorf("file arrived corrupted: %v", f)
			}
			t.Logf("4 MiB in %v (%.1f Mbit/s)", f.Duration, f.Goodput/1e6)
			for i, ep := range eps {
				st := ep.tunnel.Status()
				for _, p := range st.Paths {
					if p.TxPackets <= p.KeepalivesSent || p.RxPackets <= p.KeepalivesReceived {
						t.Errorf("%s path %d carried no data: %+v", ep.host.Name, p.ID, p)
					}
				}
				for _, k := range []string{"drop_not_from_path", "drop_bad_gre", "drop_bad_inner", "drop_device", "drop_command"} {
					if n := st.Counters[k]; n != 0 {
						t.Errorf("side %d: %s = %d", i, k, n)
					}
				}
				if window > 0 && st.ReorderHold != 20*time.Millisecond {
					t.Errorf("reorder hold %v, want 20 ms", st.ReorderHold)
				}
			}
		})
	}
}

// What goes on the wire is MPT's framing: data behind a 4-byte GRE header (8 with the S bit
// and the connection-wide sequence number when reordering), keepalives of exactly 44 bytes.
func TestMPTWireGolden(t *testing.T) {
	for _, window := range []int{0, 64} {
		t.Run(fmt.Sprintf("reorder window %d", window), func(t *testing.T) {
			l := labtest.Up(t, multiPath(2, topo.Shape{Delay: time.Millisecond}))
			var rec *mptRecConn
			eps := startMPT(t, l, func(side int, o *tunnel.MPTOptions, e *mptEnd) {
				o.ReorderWindow = window
				if side == 0 {
					rec = &mptRecConn{Conn: e.conns[0]}
					o.Uplinks[0].Conn = rec
				}
			})
			waitMPTUp(t, eps)
			c, err := eps[0].host.Dial(context.Background(), "udp", netip.AddrPortFrom(eps[1].inner4, 9).String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for range 10 {
				if _, err := c.Write([]byte("golden")); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(2 * time.Second)
			for eps[1].tunnel.Status().Counters["delivered"] < 10 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if d := eps[1].tunnel.Status().Counters["delivered"]; d < 10 {
				t.Fatalf("b delivered %d of 10 packets", d)
			}

			wantKA, _ := hex.DecodeString("00000800" + "a1" + "00000000" + "04" + "0000" +
				"00000000000000000000ffff0aff0001" + "00000000000000000000ffff0aff0002")
			var kas, data int
			var lastSeq uint32
			for _, d := range rec.datagrams() {
				if len(d) > 4 && d[4] == 0xA1 {
					kas++
					if !bytes.Equal(d, wantKA) {
						t.Errorf("keepalive (%d bytes)\n% x\nwant\n% x", len(d), d, wantKA)
					}
					continue
				}
				data++
				inner := d[4:]
				if window == 0 {
					if !bytes.HasPrefix(d, []byte{0x00, 0x00, 0x08, 0x00, 0x45}) {
						t.Errorf("data datagram starts % x, want 00 00 08 00 45", d[:min(len(d), 9)])
					}
				} else {
					if len(d) < 9 || !bytes.HasPrefix(d, []byte{0x10, 0x00, 0x08, 0x00}) || d[8] != 0x45 {
						t.Errorf("data datagram starts % x, want 10 00 08 00 <seq> 45", d[:min(len(d), 9)])
						continue
					}
					seq := binary.BigEndian.Uint32(d[4:])
					if seq == 0 || seq <= lastSeq {
						t.Errorf("sequence %d after %d", seq, lastSeq)
					}
					lastSeq = seq
					inner = d[8:]
				}
				if n := int(binary.BigEndian.Uint16(inner[2:])); n != len(inner) {
					t.Errorf("inner packet of %d bytes in a datagram carrying %d", n, len(inner))
				}
			}
			if kas == 0 || data == 0 {
				t.Errorf("recorded %d keepalives and %d data datagrams on path 1, want some of each", kas, data)
			}
		})
	}
}

// A cut path (keepalive 100 ms, dead time 300 ms) is declared down within 500 ms on both
// ends, data keeps flowing on the other path, and the path comes back when the link does.
func TestMPTPathCut(t *testing.T) {
	l := labtest.Up(t, multiPath(2, topo.Shape{Rate: 20e6, Delay: 5 * time.Millisecond}))
	eps := startMPT(t, l, nil)
	waitMPTUp(t, eps)
	addr := serve(t, eps[1].host, eps[1].inner4)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// A transfer runs across the cut.
	fileDone := make(chan traffic.FileResult, 1)
	go func() {
		f, err := traffic.File(ctx, eps[0].host.Dial, addr, traffic.FileOptions{Size: 4 << 20, Seed: 7})
		if err != nil {
			t.Errorf("transfer across the cut: %v", err)
		}
		fileDone <- f
	}()
	time.Sleep(200 * time.Millisecond)
	l.Links()[1].Cut()
	cut := time.Now()
	var down [2]time.Duration
	for time.Since(cut) < 2*time.Second && (down[0] == 0 || down[1] == 0) {
		for i, ep := range eps {
			if down[i] == 0 && ep.tunnel.Status().Paths[1].State == "down" {
				down[i] = time.Since(cut)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i, d := range down {
		if d == 0 || d > 500*time.Millisecond {
			t.Errorf("%s declared the cut path down after %v, want within 500 ms", eps[i].host.Name, d)
		}
		// The last keepalive may have come in up to one interval before the cut.
		if d > 0 && d < 200*time.Millisecond-2*mptTestSlack {
			t.Errorf("%s declared the cut path down after %v, before the dead time", eps[i].host.Name, d)
		}
	}
	t.Logf("cut path down after %v (a) and %v (b)", down[0], down[1])
	if f := <-fileDone; !f.Intact {
		t.Errorf("transfer across the cut: %v", f)
	}

	// Once it is down, the cut path carries nothing and the other path everything.
	before := eps[0].tunnel.Status()
	f, err := traffic.File(ctx, eps[0].host.Dial, addr, traffic.FileOptions{Size: 1 << 20, Seed: 8})
	if err != nil || !f.Intact {
		t.Fatalf("transfer on the remaining path: %v, %v", f, err)
	}
	after := eps[0].tunnel.Status()
	if d := after.Paths[1].TxPackets - after.Paths[1].KeepalivesSent - (before.Paths[1].TxPackets - before.Paths[1].KeepalivesSent); d != 0 {
		t.Errorf("%d data packets sent on the down path", d)
	}
	if after.Paths[0].TxPackets-before.Paths[0].TxPackets < 500 {
		t.Errorf("the remaining path sent %d packets for 1 MiB", after.Paths[0].TxPackets-before.Paths[0].TxPackets)
	}
	if s := after.Paths[0].State; s != "up" {
		t.Errorf("the remaining path is %s", s)
	}

	l.Links()[1].Restore()
	restored := time.Now()
	for time.Since(restored) < 2*time.Second {
		if eps[0].tunnel.Status().Paths[1].State == "up" && eps[1].tunnel.Status().Paths[1].State == "up" {
			t.Logf("path back up after %v", time.Since(restored))
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Errorf("the path did not come back within 2 s of the restore")
}

// mptTestSlack is the timers' granularity, allowed on either side of a deadline.
const mptTestSlack = 5 * time.Millisecond

// Datagrams from an address that is no path's remote are counted and never delivered; the
// same datagram from the path's own address is (the control).
func TestMPTUnknownSource(t *testing.T) {
	l := labtest.Up(t, multiPath(1, topo.Shape{Delay: time.Millisecond}))
	var rec *mptRecConn
	eps := startMPT(t, l, func(side int, o *tunnel.MPTOptions, e *mptEnd) {
		if side == 0 {
			rec = &mptRecConn{Conn: e.conns[0]}
			o.Uplinks[0].Conn = rec
		}
	})
	waitMPTUp(t, eps)
	pc, err := eps[1].host.ListenPacket("udp", netip.AddrPortFrom(eps[1].inner4, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	forged := append([]byte{0x00, 0x00, 0x08, 0x00}, mptUDPPacket(eps[0].inner4, eps[1].inner4, 7001, 7000, []byte("forged"))...)
	pathRemote := netip.AddrPortFrom(pickFamily(l.Links()[0].Spec.B.Addrs, 4), mptPort)

	var stranger *sock.Conn
	if err := eps[0].host.NS.Do(func() (err error) {
		stranger, err = sock.Listen(netip.AddrPortFrom(pickFamily(l.Links()[0].Spec.A.Addrs, 4), 9999), "")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	before := eps[1].tunnel.Status().Counters
	const n = 5
	for range n {
		if err := stranger.Send(forged, pathRemote); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	pc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if m, _, err := pc.ReadFrom(buf); err == nil {
		t.Fatalf("a datagram from an unknown source was delivered: %q", buf[:m])
	}
	after := eps[1].tunnel.Status().Counters
	if d := after["drop_not_from_path"] - before["drop_not_from_path"]; d != n {
		t.Errorf("drop_not_from_path grew by %d, want %d", d, n)
	}
	if d := after["delivered"] - before["delivered"]; d != 0 {
		t.Errorf("delivered grew by %d", d)
	}
	if p := eps[1].tunnel.Status().Paths[0]; p.RxPackets != uint64(p.KeepalivesReceived) {
		t.Errorf("the path counted the stranger's datagrams: %+v", p)
	}

	// The control: the same bytes from the path's own socket are delivered.
	if err := rec.Conn.Send(forged, pathRemote); err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(2 * time.Second))
	m, _, err := pc.ReadFrom(buf)
	if err != nil || string(buf[:m]) != "forged" {
		t.Fatalf("the control datagram from the path's address was not delivered: %q, %v", buf[:m], err)
	}
}

// mptUDPPacket builds an IPv4/UDP packet (UDP checksum 0, which IPv4 allows).
func mptUDPPacket(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0], p[8], p[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	s4, d4 := src.As4(), dst.As4()
	copy(p[12:], s4[:])
	copy(p[16:], d4[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(p[10:], ^uint16(sum))
	binary.BigEndian.PutUint16(p[20:], sport)
	binary.BigEndian.PutUint16(p[22:], dport)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// mptFakeDev is a device fed from a channel, for the allocation test.
type mptFakeDev struct {
	in     chan []byte
	closed chan struct{}
	once   sync.Once
}

func (d *mptFakeDev) Read(b []byte) (int, error) {
	select {
	case p := <-d.in:
		return copy(b, p), nil
	case <-d.closed:
		return 0, io.EOF
	}
}
func (d *mptFakeDev) Write(b []byte) (int, error) { return len(b), nil }
func (d *mptFakeDev) Close() error                { d.once.Do(func() { close(d.closed) }); return nil }

// mptFakeConn reports each datagram's length on sent and receives nothing.
type mptFakeConn struct {
	sent   chan int
	closed chan struct{}
	once   sync.Once
}

func (c *mptFakeConn) ReadFromUDPAddrPort([]byte) (int, netip.AddrPort, error) {
	<-c.closed
	return 0, netip.AddrPort{}, net.ErrClosed
}
func (c *mptFakeConn) Send(b []byte, _ netip.AddrPort) error { c.sent <- len(b); return nil }
func (c *mptFakeConn) Close() error                          { c.once.Do(func() { close(c.closed) }); return nil }

// The send path does not allocate: header written in the headroom, scheduler and sequence
// reused, with reordering off and on.
func TestMPTSendNoAllocs(t *testing.T) {
	for _, window := range []int{0, 64} {
		dev := &mptFakeDev{in: make(chan []byte), closed: make(chan struct{})}
		var conns [2]*mptFakeConn
		o := tunnel.MPTOptions{Device: dev, IPVersion: 4, ReorderWindow: window,
			Routes: []netip.Prefix{netip.MustParsePrefix("10.255.0.0/24")}}
		for i := range conns {
			conns[i] = &mptFakeConn{sent: make(chan int, 1), closed: make(chan struct{})}
			name := fmt.Sprintf("up%d", i)
			o.Uplinks = append(o.Uplinks, tunnel.Uplink{Name: name, Conn: conns[i]})
			o.Paths = append(o.Paths, tunnel.MPTPath{Uplink: name, Remote: netip.MustParseAddrPort(fmt.Sprintf("192.0.2.%d:23456", i+1)), Weight: i + 1})
		}
		tn, err := tunnel.NewMPT(o)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tn.Run(ctx) }()
		pkt := mptUDPPacket(netip.MustParseAddr("10.255.0.1"), netip.MustParseAddr("10.255.0.2"), 1, 2, make([]byte, 1000))
		hdr := 4
		if window > 0 {
			hdr = 8
		}
		var got [2]int
		one := func() {
			dev.in <- pkt
			select {
			case n := <-conns[0].sent:
				got[0]++
				if n != hdr+len(pkt) {
					t.Errorf("sent %d bytes, want %d", n, hdr+len(pkt))
				}
			case <-conns[1].sent:
				got[1]++
			}
		}
		for range 10 {
			one() // warm up
		}
		if a := testing.AllocsPerRun(300, one); a != 0 {
			t.Errorf("window %d: %v allocations per packet sent, want 0", window, a)
		}
		// Weights 1 and 2 share the packets 1:2 (up to the unfinished last round).
		if d := got[1] - 2*got[0]; d < -2 || d > 2 {
			t.Errorf("window %d: paths got %d and %d packets, want 1:2", window, got[0], got[1])
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}
