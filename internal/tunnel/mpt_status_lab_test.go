package tunnel_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/sock"
	"braid/internal/tun"
	"braid/internal/tunnel"
)

// mptCmdPort is both ends' command port, MPT's sample cmdport_local.
const mptCmdPort = 60456

// refPeer is the far end of an MPT connection written in the test from tunnels.md alone,
// without braid's codec: GRE data packets, the 44-byte keepalive, and the path-status exchange
// (0xA2) on the command port, built and parsed byte by byte. A path is up while the peer has
// heard a keepalive within the dead time and braid has not announced it down; a path braid
// announced down comes back only with braid's announcement of OK, so that a braid that does
// not speak the exchange fails the test the way MPT failed in issue 22.
type refPeer struct {
	t        *testing.T
	authType byte
	key      []byte
	dev      *tun.Device
	data     []*net.UDPConn // one per path
	cmd      *net.UDPConn
	local    []netip.Addr // the peer's address of each path
	remote   []netip.Addr // braid's
	replies  chan []byte  // rounds 2 and 4 of the peer's own exchanges

	// mptLike makes the peer act as MPT on a path's keepalive timeout: it announces PATH_DOWN
	// to braid, announces OK when a keepalive comes back, and gives the path up for good (no
	// keepalives, no data) if braid does not confirm the OK, as MPT did in issue 22.
	mptLike    atomic.Bool
	announceMu sync.Mutex

	mu        sync.Mutex
	dead      []bool // mptLike: the path timed out and was announced down
	disabled  []bool // mptLike: braid did not confirm the path's return
	lastKA    []time.Time
	announced []byte // the last status braid announced per path (0 = OK)
	dataTx    []int
	dataRx    []int
	seen      [][]byte // every command datagram braid sent, for the byte checks
	challenge [4]byte
	next      int
}

const refKeepalive, refDead = 100 * time.Millisecond, 300 * time.Millisecond

func startRefPeer(t *testing.T, h *lab.Host, l *lab.Lab, inner netip.Addr, authType byte, key []byte) *refPeer {
	t.Helper()
	p := &refPeer{t: t, authType: authType, key: key, replies: make(chan []byte, 16)}
	n := len(l.Links())
	p.lastKA, p.announced, p.dataTx, p.dataRx = make([]time.Time, n), make([]byte, n), make([]int, n), make([]int, n)
	p.dead, p.disabled = make([]bool, n), make([]bool, n)
	err := h.NS.Do(func() error {
		for _, lk := range l.Links() {
			la, ra := pickFamily(lk.Spec.B.Addrs, 4), pickFamily(lk.Spec.A.Addrs, 4)
			c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(la, mptPort)))
			if err != nil {
				return err
			}
			p.data, p.local, p.remote = append(p.data, c), append(p.local, la), append(p.remote, ra)
		}
		var err error
		if p.cmd, err = net.ListenUDP("udp4", &net.UDPAddr{Port: mptCmdPort}); err != nil {
			return err
		}
		p.dev, err = tun.Open("mpt0")
		return err
	})
	if err == nil {
		err = tun.Configure(h.NS.Netlink(), "mpt0", 1400, []netip.Prefix{netip.PrefixFrom(inner, 24)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		for _, c := range p.data {
			c.Close()
		}
		if p.cmd != nil {
			p.cmd.Close()
		}
		if p.dev != nil {
			p.dev.Close()
		}
		wg.Wait()
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range p.data {
		wg.Go(func() { p.readData(i) })
	}
	wg.Go(p.readCmd)
	wg.Go(p.readDev)
	wg.Go(func() {
		tick := time.NewTicker(refKeepalive)
		defer tick.Stop()
		for {
			for i := range p.data {
				p.mu.Lock()
				off := p.disabled[i]
				timedOut := !p.dead[i] && time.Since(p.lastKA[i]) > refDead
				if timedOut && p.mptLike.Load() {
					p.dead[i] = true
				}
				p.mu.Unlock()
				if timedOut && p.mptLike.Load() {
					wg.Go(func() { p.announce(i, 0x80) })
				}
				if !off {
					p.data[i].WriteToUDPAddrPort(p.keepalive(i), netip.AddrPortFrom(p.remote[i], mptPort))
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return p
}

// mapped writes a as the 16-byte ::ffff:a.b.c.d the reference shows.
func mapped(a netip.Addr) []byte { b := netip.AddrFrom16(a.As16()).As16(); return b[:] }

// keepalive is tunnels.md's 44-byte keepalive: GRE 00 00 08 00, A1, four zero bytes, ip_ver 4,
// two pad bytes, the local and remote tunnel IPs.
func (p *refPeer) keepalive(i int) []byte {
	b := []byte{0x00, 0x00, 0x08, 0x00, 0xA1, 0, 0, 0, 0, 4, 0, 0}
	b = append(b, mapped(netip.MustParseAddr("10.255.0.2"))...)
	return append(b, mapped(netip.MustParseAddr("10.255.0.1"))...)
}

func (p *refPeer) up(i int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.announced[i] == 0 && !p.disabled[i] && time.Since(p.lastKA[i]) <= refDead
}

func (p *refPeer) counts(i int) (tx, rx int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dataTx[i], p.dataRx[i]
}

func (p *refPeer) readData(i int) {
	b := make([]byte, 65536)
	for {
		n, src, err := p.data[i].ReadFromUDPAddrPort(b)
		if err != nil {
			return
		}
		if src.Addr().Unmap() != p.remote[i] || n < 4 {
			continue
		}
		if n > 4 && b[4] >= 0xA0 {
			want := p.keepalive(i)
			copy(want[12:], mapped(netip.MustParseAddr("10.255.0.1")))
			copy(want[28:], mapped(netip.MustParseAddr("10.255.0.2")))
			if !bytes.Equal(b[:n], want) {
				p.t.Errorf("path %d: keepalive % x, want % x", i+1, b[:n], want)
				continue
			}
			p.mu.Lock()
			p.lastKA[i] = time.Now()
			back := p.dead[i] && !p.disabled[i]
			p.dead[i] = false
			p.mu.Unlock()
			if back {
				go func() {
					if !p.announce(i, 0x00) {
						p.mu.Lock()
						p.disabled[i] = true
						p.mu.Unlock()
					}
				}()
			}
			continue
		}
		if !bytes.Equal(b[:4], []byte{0, 0, 8, 0}) {
			p.t.Errorf("path %d: GRE header % x", i+1, b[:4])
			continue
		}
		p.mu.Lock()
		p.dataRx[i]++
		p.mu.Unlock()
		p.dev.Write(b[4:n])
	}
}

func (p *refPeer) readDev() {
	b := make([]byte, 4+1500)
	copy(b, []byte{0, 0, 8, 0})
	for {
		n, err := p.dev.Read(b[4:])
		if err != nil {
			return
		}
		for range p.data { // round robin over the paths that are up
			p.next = (p.next + 1) % len(p.data)
			if i := p.next; p.up(i) {
				p.mu.Lock()
				p.dataTx[i]++
				p.mu.Unlock()
				p.data[i].WriteToUDPAddrPort(b[:4+n], netip.AddrPortFrom(p.remote[i], mptPort))
				break
			}
		}
	}
}

// a2 builds a 0xA2 as tunnels.md lays it out: cmd, status, auth_type, auth_len, auth (a 4-byte
// token, and with auth_type 2 SHA-256 of the message with zeros in its place, then the key),
// round, ip_ver, two pad bytes, the sender's and the receiver's address of the path.
func (p *refPeer) a2(status, round byte, token [4]byte, from, to netip.Addr, key []byte) []byte {
	authLen := map[byte]byte{0: 0, 1: 4, 2: 36}[p.authType]
	b := []byte{0xA2, status, p.authType, authLen}
	if authLen > 0 {
		b = append(b, token[:]...)
	}
	if authLen == 36 {
		b = append(b, make([]byte, 32)...)
	}
	b = append(b, round, 4, 0, 0)
	b = append(b, mapped(from)...)
	b = append(b, mapped(to)...)
	if authLen == 36 {
		sum := sha256.Sum256(append(bytes.Clone(b), key...))
		copy(b[8:40], sum[:])
	}
	return b
}

// parseA2 checks a 0xA2 from braid byte by byte and returns its status, round, token and path.
func (p *refPeer) parseA2(b []byte) (status, round byte, token [4]byte, path int, ok bool) {
	authLen := map[byte]int{0: 0, 1: 4, 2: 36}[p.authType]
	if len(b) != 40+authLen || b[0] != 0xA2 || b[2] != p.authType || int(b[3]) != authLen {
		p.t.Errorf("command from braid: % x (want 0xA2, auth_type %d, auth_len %d, %d bytes)", b, p.authType, authLen, 40+authLen)
		return
	}
	h := b[4+authLen:]
	copy(token[:], b[4:])
	path = -1
	for i := range p.data {
		if bytes.Equal(h[4:20], mapped(p.remote[i])) && bytes.Equal(h[20:36], mapped(p.local[i])) {
			path = i
		}
	}
	if h[1] != 4 || h[2] != 0 || h[3] != 0 || path < 0 {
		p.t.Errorf("command from braid: % x: ip_ver, padding or addresses wrong", b)
		return
	}
	if authLen == 36 {
		want := p.a2(b[1], h[0], token, p.remote[path], p.local[path], p.key)
		if !bytes.Equal(b, want) {
			p.t.Errorf("command from braid: % x: SHA-256 wrong, want % x", b, want)
			return
		}
	}
	return b[1], h[0], token, path, true
}

// readCmd answers braid's exchanges as the responder: round 1 gets round 2 with a challenge,
// round 3 with the challenge is applied and gets round 4.
func (p *refPeer) readCmd() {
	b := make([]byte, 2048)
	for {
		n, src, err := p.cmd.ReadFromUDPAddrPort(b)
		if err != nil {
			return
		}
		m := bytes.Clone(b[:n])
		p.mu.Lock()
		p.seen = append(p.seen, m)
		p.mu.Unlock()
		status, round, token, i, ok := p.parseA2(m)
		if !ok {
			continue
		}
		switch round {
		case 1:
			p.mu.Lock()
			rand.Read(p.challenge[:])
			ch := p.challenge
			p.mu.Unlock()
			p.cmd.WriteToUDPAddrPort(p.a2(status, 2, ch, p.local[i], p.remote[i], p.key), src)
		case 3:
			p.mu.Lock()
			good := p.authType == 0 || token == p.challenge
			if good {
				p.announced[i] = status
			}
			p.mu.Unlock()
			if !good {
				p.t.Errorf("round 3 from braid without the challenge: % x", m)
				continue
			}
			p.cmd.WriteToUDPAddrPort(p.a2(status, 4, token, p.local[i], p.remote[i], p.key), src)
		case 2, 4:
			p.replies <- m
		default:
			p.t.Errorf("round %d from braid", round)
		}
	}
}

// announce runs the exchange as the initiator, telling braid that path i's status is status;
// it reports whether braid answered both rounds correctly.
func (p *refPeer) announce(i int, status byte) bool {
	p.announceMu.Lock()
	defer p.announceMu.Unlock()
	var tok [4]byte
	rand.Read(tok[:])
	// To braid's address on another path: this one may be why the status changes.
	dst := netip.AddrPortFrom(p.remote[(i+1)%len(p.remote)], mptCmdPort)
	for _, round := range []byte{1, 3} {
		p.cmd.WriteToUDPAddrPort(p.a2(status, round, tok, p.local[i], p.remote[i], p.key), dst)
		select {
		case m := <-p.replies:
			st, r, tk, j, ok := p.parseA2(m)
			if !ok || st != status || r != round+1 || j != i || p.authType != 0 && round == 3 && tk != tok {
				p.t.Errorf("braid answered round %d with % x", round, m)
				return false
			}
			tok = tk
		case <-time.After(time.Second):
			p.t.Errorf("braid did not answer round %d", round)
			return false
		}
	}
	return true
}

// startBraidMPTCmd runs braid in mode mpt on a, against the reference peer on b, with the
// command port and the interfaces watched.
func startBraidMPTCmd(t *testing.T, l *lab.Lab, authType uint8, key []byte) *tunnel.MPTTunnel {
	t.Helper()
	h := l.Host("a")
	inner := netip.MustParseAddr("10.255.0.1")
	o := tunnel.MPTOptions{
		MTU: 1400, IPVersion: 4, Routes: []netip.Prefix{netip.MustParsePrefix("10.255.0.2/32")},
		Keepalive: refKeepalive, DeadTime: refDead,
		LocalTunnelIP: inner, RemoteTunnelIP: netip.MustParseAddr("10.255.0.2"),
		RemoteCmdPort: mptCmdPort, AuthType: authType, AuthKey: key,
	}
	var closers []func() error
	fail := func(err error) {
		for _, c := range closers {
			c()
		}
		t.Fatal(err)
	}
	for j, lk := range l.Links() {
		la, ra := pickFamily(lk.Spec.A.Addrs, 4), pickFamily(lk.Spec.B.Addrs, 4)
		var c *sock.Conn
		if err := h.NS.Do(func() (err error) { c, err = sock.Listen(netip.AddrPortFrom(la, mptPort), ""); return err }); err != nil {
			fail(err)
		}
		closers = append(closers, c.Close)
		name := fmt.Sprintf("up%d", j)
		o.Uplinks = append(o.Uplinks, tunnel.Uplink{Name: name, Conn: c})
		o.Paths = append(o.Paths, tunnel.MPTPath{Uplink: name, Remote: netip.AddrPortFrom(ra, mptPort), Interface: lk.Spec.A.Ifname})
	}
	var cmd *sock.Conn
	if err := h.NS.Do(func() (err error) {
		cmd, err = sock.Listen(netip.AddrPortFrom(netip.IPv4Unspecified(), mptCmdPort), "")
		return err
	}); err != nil {
		fail(err)
	}
	closers = append(closers, cmd.Close)
	o.Command = cmd
	var dev *tun.Device
	if err := h.NS.Do(func() (err error) { dev, err = tun.Open("mpt0"); return err }); err != nil {
		fail(err)
	}
	closers = append(closers, dev.Close)
	if err := tun.Configure(h.NS.Netlink(), "mpt0", o.MTU, []netip.Prefix{netip.PrefixFrom(inner, 24)}); err != nil {
		fail(err)
	}
	o.Device = dev
	tn, err := tunnel.NewMPT(o)
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tn.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("mpt: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("mpt did not stop within 10 s")
		}
	})
	return tn
}

// waitFor polls cond every 2 ms for up to d and returns how long it took, or -1.
func waitFor(d time.Duration, cond func() bool) time.Duration {
	start := time.Now()
	for time.Since(start) < d {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return -1
}

// TestMPTPathReturns: braid in mode mpt against a peer that speaks MPT's keepalives and
// path-status exchange as tunnels.md describes them. During a ping, braid's interface of path 2
// goes down: braid marks the path down at once and announces it, so the peer marks it down
// before its dead time; when the interface returns, both ends have the path up again within
// keepalive + dead time, and ping traffic uses it again. The peer's own announcements, braid's
// "path down|up" by hand, and command datagrams from a stranger and with a wrong key are
// checked too.
func TestMPTPathReturns(t *testing.T) {
	for _, auth := range []uint8{0, 1, 2} {
		t.Run(fmt.Sprintf("auth_type %d", auth), func(t *testing.T) { testMPTPathReturns(t, auth) })
	}
}

func testMPTPathReturns(t *testing.T, auth uint8) {
	key := []byte("a shared secret")
	l := labtest.Up(t, multiPath(2, topo.Shape{Rate: 20e6, Delay: 5 * time.Millisecond}))
	a, b := l.Host("a"), l.Host("b")
	peer := startRefPeer(t, b, l, netip.MustParseAddr("10.255.0.2"), auth, key)
	br := startBraidMPTCmd(t, l, auth, key)
	bothUp := func(i int) bool { return br.Status().Paths[i].State == "up" && peer.up(i) }
	if waitFor(5*time.Second, func() bool { return bothUp(0) && bothUp(1) }) < 0 {
		t.Fatalf("paths not up after 5 s: %+v", br.Status().Paths)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The ping: a UDP echo through the tunnel every 20 ms for 4 s (the lab has no ping binary).
	echo, err := b.ListenPacket("udp", "10.255.0.2:7007")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := echo.ReadFrom(buf)
			if err != nil {
				return
			}
			echo.WriteTo(buf[:n], from)
		}
	}()
	pinger, err := a.ListenPacket("udp", "10.255.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pinger.Close()
	pingOut := make(chan string, 1)
	go func() {
		var got int
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 1500)
			for {
				if _, _, err := pinger.ReadFrom(buf); err != nil {
					return
				}
				got++
			}
		}()
		dst := &net.UDPAddr{IP: net.IPv4(10, 255, 0, 2), Port: 7007}
		const sent = 200
		for i := range sent {
			pinger.WriteTo([]byte(fmt.Sprintf("ping %d", i)), dst)
			time.Sleep(20 * time.Millisecond)
		}
		pinger.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		<-done
		if got < sent*9/10 {
			t.Errorf("ping: %d of %d answered", got, sent)
		}
		pingOut <- fmt.Sprintf("%d sent, %d answered", sent, got)
	}()
	time.Sleep(500 * time.Millisecond)

	ifname := l.Links()[1].Spec.A.Ifname
	if out, err := a.Run(ctx, "ip", "link", "set", "dev", ifname, "down"); err != nil {
		t.Fatalf("ip link set down: %v: %s", err, out)
	}
	dBraid := waitFor(time.Second, func() bool { return br.Status().Paths[1].Status == "if_down" })
	dPeer := waitFor(time.Second, func() bool { return !peer.up(1) })
	t.Logf("interface down: braid marked the path down after %v, the peer after %v", dBraid, dPeer)
	if dBraid < 0 || dBraid > 50*time.Millisecond {
		t.Errorf("braid marked the path down after %v, want at once (50 ms)", dBraid)
	}
	peer.mu.Lock()
	announced := peer.announced[1]
	peer.mu.Unlock()
	if dPeer < 0 || announced != 0x80 {
		t.Errorf("the peer marked the path down after %v with announced status %#x, want 0x80 before the dead time", dPeer, announced)
	}
	if st := br.Status().Paths[0]; st.State != "up" {
		t.Errorf("the other path is %s", st.Status)
	}

	time.Sleep(time.Second)
	btx0 := br.Status().Paths[1]
	ptx0, _ := peer.counts(1)
	if out, err := a.Run(ctx, "ip", "link", "set", "dev", ifname, "up"); err != nil {
		t.Fatalf("ip link set up: %v: %s", err, out)
	}
	back := waitFor(3*time.Second, func() bool { return bothUp(1) })
	t.Logf("interface up: both ends had the path up after %v (braid %s)", back, br.Status().Paths[1].Status)
	if back < 0 || back > refKeepalive+refDead {
		t.Errorf("path up on both ends after %v, want within keepalive + dead time (%v); braid %+v",
			back, refKeepalive+refDead, br.Status().Paths[1])
	}
	out := <-pingOut
	t.Logf("ping: %s", out)
	btx1 := br.Status().Paths[1]
	ptx1, _ := peer.counts(1)
	if d := (btx1.TxPackets - btx1.KeepalivesSent) - (btx0.TxPackets - btx0.KeepalivesSent); d == 0 {
		t.Errorf("braid sent no data on the returned path")
	}
	if ptx1 == ptx0 {
		t.Errorf("the peer sent no data on the returned path")
	}

	// The peer announces path 1 down, then OK: braid answers both rounds and applies both.
	if !peer.announce(0, 0x80) {
		t.FailNow()
	}
	if s := br.Status().Paths[0].Status; s != "peer_down" {
		t.Errorf("after the peer's PATH_DOWN, braid's path 1 is %s", s)
	}
	if !peer.announce(0, 0x00) {
		t.FailNow()
	}
	if s := br.Status().Paths[0].Status; s != "ok" {
		t.Errorf("after the peer's OK, braid's path 1 is %s", s)
	}

	// braid tunnel path down|up: PATH_DOWN_MANUAL here, PATH_DOWN at the peer, then back.
	if !br.SetAdminDown(2, true) {
		t.Fatal("no path 2")
	}
	if waitFor(time.Second, func() bool { return !peer.up(1) }) < 0 {
		t.Errorf("path down by hand did not reach the peer")
	}
	br.SetAdminDown(2, false)
	if d := waitFor(time.Second, func() bool { return bothUp(1) }); d < 0 {
		t.Errorf("path up by hand did not bring the path back on both ends")
	}

	// A stranger's well-formed command, and one from the peer's address with the wrong key
	// (auth_type 2) or without the challenge (1 and 2), are refused, counted and unanswered.
	var stranger netip.Prefix
	for _, p := range l.Links()[0].Spec.B.Addrs {
		if p.Addr().Is4() {
			ip := p.Addr().As4()
			ip[3] = 250
			stranger = netip.PrefixFrom(netip.AddrFrom4(ip), p.Bits())
		}
	}
	if out, err := b.Run(ctx, "ip", "addr", "add", stranger.String(), "dev", l.Links()[0].Spec.B.Ifname); err != nil {
		t.Fatalf("ip addr add: %v: %s", err, out)
	}
	var sc *net.UDPConn
	if err := b.NS.Do(func() (err error) {
		sc, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(stranger.Addr(), 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	before := br.Status().Counters
	var tok [4]byte
	round1 := peer.a2(0x80, 1, tok, peer.local[0], peer.remote[0], key)
	sc.WriteToUDPAddrPort(round1, netip.AddrPortFrom(peer.remote[0], mptCmdPort))
	sc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, _, err := sc.ReadFromUDPAddrPort(make([]byte, 256)); err == nil {
		t.Errorf("braid answered a stranger with %d bytes", n)
	}
	after := br.Status().Counters
	if d := after["cmd_refused_source"] - before["cmd_refused_source"]; d != 1 {
		t.Errorf("cmd_refused_source grew by %d, want 1", d)
	}
	if auth != 0 {
		before = after
		round3 := peer.a2(0x80, 3, [4]byte{9, 9, 9, 9}, peer.local[0], peer.remote[0], key)
		peer.cmd.WriteToUDPAddrPort(round3, netip.AddrPortFrom(peer.remote[0], mptCmdPort))
		if auth == 2 {
			peer.cmd.WriteToUDPAddrPort(peer.a2(0x80, 1, tok, peer.local[0], peer.remote[0], []byte("wrong key")), netip.AddrPortFrom(peer.remote[0], mptCmdPort))
		}
		time.Sleep(200 * time.Millisecond)
		after = br.Status().Counters
		want := uint64(1)
		if auth == 2 {
			want = 2
		}
		if d := after["cmd_refused_auth"] - before["cmd_refused_auth"]; d != want {
			t.Errorf("cmd_refused_auth grew by %d, want %d", d, want)
		}
		select {
		case m := <-peer.replies:
			t.Errorf("braid answered a refused command with % x", m)
		default:
		}
	}
	if s := br.Status().Paths[0].Status; s != "ok" {
		t.Errorf("a refused command changed path 1 to %s", s)
	}
	if n := br.Status().Counters["cmd_refused_malformed"]; n != 0 {
		t.Errorf("cmd_refused_malformed = %d: the peer's commands did not decode", n)
	}

	// Issue 22's case: the link is cut silently (no interface goes down). Both ends find path 2
	// dead after the dead time; the peer, as MPT, announces it down, and OK when braid's
	// keepalives come back, and would give the path up if braid did not confirm.
	peer.mptLike.Store(true)
	l.Links()[1].Cut()
	dBraid = waitFor(2*time.Second, func() bool { return br.Status().Paths[1].State == "down" })
	dPeer = waitFor(2*time.Second, func() bool { return !peer.up(1) })
	waitFor(time.Second, func() bool { return br.Status().Paths[1].Status == "peer_down" })
	t.Logf("silent cut: braid found the path down after %v (%s), the peer after %v", dBraid, br.Status().Paths[1].Status, dPeer)
	if dBraid < 0 || dPeer < 0 {
		t.Fatalf("the cut path is not down on both ends: braid %v, peer %v", dBraid, dPeer)
	}
	if s := br.Status().Paths[1].Status; s != "peer_down" {
		t.Errorf("braid's cut path is %s, want peer_down after the peer's announcement", s)
	}
	time.Sleep(500 * time.Millisecond)
	l.Links()[1].Restore()
	back = waitFor(3*time.Second, func() bool { return bothUp(1) })
	t.Logf("silent cut restored: both ends had the path up after %v", back)
	if back < 0 || back > refKeepalive+refDead {
		t.Errorf("after the silent cut, path up on both ends after %v, want within %v; braid %+v", back, refKeepalive+refDead, br.Status().Paths[1])
	}
	time.Sleep(refDead)
	if !bothUp(1) {
		t.Errorf("the path did not stay up: braid %s, peer up %v", br.Status().Paths[1].Status, peer.up(1))
	}
}
