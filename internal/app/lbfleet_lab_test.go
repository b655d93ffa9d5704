package app

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"braid/internal/experiment/mplb"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/lb/xdp"
	"braid/internal/mptcp/info"
)

// TestLBFleetECMP runs braid lb as a fleet: instances behind a router (BIRD) that spreads the
// VIP by ECMP over the 5-tuple, each instance announcing the VIP over BGP. First 2, then 4
// instances; 50 MPTCP clients with 2 subflows each download from 4 backends (stateless mode:
// the second subflow goes to its backend's own port, which every instance steers alike).
// Every join must reach its connection's backend (0 resets); killing one instance
// mid-transfer must stall only the subflows the router sent through it, which resume within
// 3 s, with every file intact; a drained instance must be withdrawn before it exits.
func TestLBFleetECMP(t *testing.T) {
	labtest.Require(t)
	bird, ok := labtest.Tool(t, "bird")
	if !ok {
		labtest.Skip(t, "bird (the routing daemon, Debian package bird2) is not installed: scripts/deps.sh installs it")
	}
	// Backends b0..b3 in service; b4 is added while connections live.
	const instances, backends, hosts, clients = 4, 4, 5, 50
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	// The servers pace their downloads (100 kB/s each), so that a 400 kB download lasts 4 s and
	// the instance dies mid-transfer, with no bottleneck whose losses would stall subflows too.
	// 25 ms each way on the client's links: a 100 ms round trip keeps every active subflow's
	// data in flight, so that the kill catches data in flight on the dead instance's subflows.
	l := labtest.Up(t, mplb.MPLBFleetTopology(instances, hosts, 0))
	for _, lk := range l.Links() {
		if lk.Spec.A.Host == "client" {
			lk.SetShape(0, topo.Shape{Delay: 25 * time.Millisecond})
			lk.SetShape(1, topo.Shape{Delay: 25 * time.Millisecond})
		}
	}
	if err := mplb.MPLBPrepare(l, hosts); err != nil {
		t.Fatal(err)
	}
	if err := mplb.MPLBStateless(ctx, l, hosts); err != nil {
		t.Fatal(err)
	}
	// The lab's kernels have no IP-in-IP device: the backends decapsulate with braid_decap.
	decap, err := xdp.Load(xdp.Options{Conns: 1024, Tokens: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer decap.Close()
	if err := mplb.MPLBDecap(l, hosts, decap); err != nil {
		t.Fatal(err)
	}
	srv, err := startPacedServers(l, hosts)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	self, _ := os.Executable()
	t.Setenv("BRAID_TEST_MAIN", "1") // the instances and the control commands run this binary as braid
	fleet, err := mplb.StartFleet(l, t.TempDir(), bird, []string{self}, []string{"BRAID_TEST_MAIN=1"}, instances, backends)
	if err != nil {
		t.Fatal(err)
	}
	var insts []*mplb.FleetInstance
	defer func() {
		if t.Failed() {
			t.Logf("bird:\n%s", fleetTail(fleet.BirdLog(), 40))
			for _, fi := range insts {
				t.Logf("instance %d:\n%s", fi.Index, fleetTail(fi.Log(), 30))
			}
		}
	}()
	startInst := func(i int) {
		t.Helper()
		fi, err := fleet.StartInstance(i, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		insts = append(insts, fi)
	}
	routeWait := func(want ...int) time.Duration {
		t.Helper()
		t0 := time.Now()
		wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
		defer wcancel()
		if err := fleet.WaitNextHops(wctx, want...); err != nil {
			t.Fatal(err)
		}
		return time.Since(t0)
	}

	// Two instances.
	startInst(0)
	startInst(1)
	d := routeWait(0, 1)
	t.Logf("2 instances announced over BGP, the router's route has both next hops (%.1f s after start)", d.Seconds())
	cs := fleetConnect(t, ctx, l, fleet, clients)
	// Both instances steered joins: the router spread the subflows over them.
	for i := range 2 {
		c, err := fleet.Counters(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("instance %d: %d packets forwarded, %d of them by the stateless table", i, c["forwarded"], c["stateless_forwarded"])
		if c["stateless_forwarded"] == 0 || c["drop_no_backend"] != 0 || c["drop_join_unknown_token"] != 0 {
			t.Errorf("instance %d: counters %v", i, c)
		}
	}

	// The instance's status shows its announcement and its session.
	out, err := l.Host("lb0").Run(ctx, self, "lb", "status", "--addr", "10.4.0.2:9476")
	if err != nil || !strings.Contains(string(out), "BGP: [10.100.0.1/32] announced") || !strings.Contains(string(out), "10.4.0.1  65000  established") {
		t.Errorf("braid lb status (%v):\n%s", err, out)
	}

	// Four instances, added while the 50 clients download: the router moves flows to them
	// mid-transfer, and they place those flows (mid-flow, by Maglev or by port) where they were.
	var wg sync.WaitGroup
	var added time.Duration
	wg.Go(func() {
		time.Sleep(300 * time.Millisecond)
		t0 := time.Now()
		for _, i := range []int{2, 3} {
			fi, err := fleet.StartInstance(i, 2*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			insts = append(insts, fi)
		}
		wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
		defer wcancel()
		if err := fleet.WaitNextHops(wctx, 0, 1, 2, 3); err != nil {
			t.Error(err)
		}
		added = time.Since(t0)
	})
	fleetDownloadAll(t, cs, 300<<10)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	fleetCheckSubflows(t, cs)
	fleetCheckResets(t, l, hosts)
	fleetCloseAll(cs)
	moved := uint64(0)
	for _, i := range []int{2, 3} {
		c, err := fleet.Counters(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		moved += c["forwarded"]
	}
	t.Logf("instances 2 and 3 started during the downloads, announced %.1f s later; they forwarded %d packets of the moved flows; every download intact", added.Seconds(), moved)
	if moved == 0 {
		t.Errorf("the added instances forwarded nothing: no flow moved to them mid-transfer")
	}

	cs = fleetConnect(t, ctx, l, fleet, clients)
	// Where the router sends each subflow (before the kill: the route changes after).
	const victim = 1
	onVictim := map[netip.AddrPort]bool{}
	for _, c := range cs {
		for _, sf := range c.subflows {
			i, err := fleet.InstanceOf(ctx, sf.Local, sf.Remote)
			if err != nil {
				t.Fatal(err)
			}
			onVictim[sf.Local] = i == victim
		}
	}
	nVictim := 0
	for _, v := range onVictim {
		if v {
			nVictim++
		}
	}
	t.Logf("%d of %d subflows go through instance %d", nVictim, len(onVictim), victim)
	if nVictim == 0 || nVictim == len(onVictim) {
		t.Fatalf("the router sends %d of %d subflows through instance %d: no ECMP spreading", nVictim, len(onVictim), victim)
	}
	mon := startSubflowMonitor(l, backends)
	var killAt time.Time
	var converged time.Duration
	wg.Go(func() {
		time.Sleep(1200 * time.Millisecond)
		killAt = time.Now()
		if err := fleet.Kill(victim); err != nil {
			t.Error(err)
			return
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		if err := fleet.WaitNextHops(wctx, 0, 2, 3); err != nil {
			t.Error(err)
			return
		}
		converged = time.Since(killAt)
	})
	fleetDownloadAll(t, cs, 400<<10)
	wg.Wait()
	mon.stop()
	t.Logf("instance %d killed %.2f s into the transfer; the router's route lost it %.0f ms later (its BGP session closed with the process)",
		victim, killAt.Sub(mon.start).Seconds(), float64(converged.Microseconds())/1000)
	// Per subflow: the longest time after the kill with data outstanding and no progress, and
	// for the subflows through the killed instance that had data in flight when it died, how
	// long until the backend saw their acknowledgements again (through another instance).
	var worstVictim, worstOther, worstResume time.Duration
	active := 0
	for sf, onV := range onVictim {
		s := mon.stallAfter(sf, killAt)
		if !onV {
			worstOther = max(worstOther, s)
			continue
		}
		worstVictim = max(worstVictim, s)
		if r, ok := mon.resumeAfter(sf, killAt); ok {
			active++
			worstResume = max(worstResume, r)
		}
	}
	t.Logf("after the kill: %d subflows through instance %d had data in flight; all acknowledged again within %d ms; longest stall with data in flight %d ms (the others: %d ms)",
		active, victim, worstResume.Milliseconds(), worstVictim.Milliseconds(), worstOther.Milliseconds())
	if active == 0 {
		t.Errorf("no subflow through the killed instance had data in flight: the kill hit no transfer")
	}
	if worstResume > 3*time.Second || worstVictim > 3*time.Second {
		t.Errorf("a subflow through the killed instance came back after %v (stalled %v; want within 3 s)", worstResume, worstVictim)
	}
	if worstOther > time.Second {
		t.Errorf("a subflow through a surviving instance stalled %v", worstOther)
	}
	fleetCheckSubflows(t, cs)
	fleetCheckResets(t, l, hosts)
	fleetCloseAll(cs)

	// Drain instance 2 while clients download: withdrawn over BGP before the process exits.
	cs = fleetConnect(t, ctx, l, fleet, clients)
	var withdrawnAt, exitedAt time.Time
	wg.Go(func() {
		time.Sleep(300 * time.Millisecond)
		drained := time.Now()
		if err := fleet.Drain(2); err != nil {
			t.Error(err)
			return
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		if err := fleet.WaitNextHops(wctx, 0, 3); err != nil {
			t.Error(err)
			return
		}
		withdrawnAt = time.Now()
		select {
		case <-insts[2].Done():
			exitedAt = time.Now()
			t.Errorf("instance 2 exited before its route was withdrawn")
			return
		default:
		}
		<-insts[2].Done()
		exitedAt = time.Now()
		t.Logf("drain: SIGTERM, route withdrawn %.0f ms later, process exited %.0f ms after that",
			float64(withdrawnAt.Sub(drained).Microseconds())/1000, float64(exitedAt.Sub(withdrawnAt).Microseconds())/1000)
	})
	fleetDownloadAll(t, cs, 200<<10)
	wg.Wait()
	if exitedAt.IsZero() || !exitedAt.After(withdrawnAt) {
		t.Errorf("drain: withdrawn %v, exited %v", withdrawnAt, exitedAt)
	}
	fleetCheckSubflows(t, cs)
	fleetCheckResets(t, l, hosts)
	fleetCloseAll(cs)

	// Backends change while connections live: on every instance b4 is added and b0 drained
	// during a wave of downloads. Established connections stay whole (each instance pins its
	// flows); new ones avoid b0 and reach b4, joins included.
	cs = fleetConnect(t, ctx, l, fleet, clients)
	wg.Go(func() {
		time.Sleep(500 * time.Millisecond)
		for _, i := range []int{0, 3} {
			rl, err := l.Host("rt").NS.Netlink().LinkByName(fmt.Sprintf("rl%d", i))
			if err != nil {
				t.Error(err)
				return
			}
			h := l.Host(fmt.Sprintf("lb%d", i))
			if out, err := h.Run(ctx, self, "lb", "add", "b4", "--mac", rl.Attrs().HardwareAddr.String(), "--address", "10.3.4.2",
				"--stateless-port", fmt.Sprint(mplb.MPLBStatelessPort(4))); err != nil {
				t.Errorf("instance %d: braid lb add b4: %v: %s", i, err, out)
			}
			if out, err := h.Run(ctx, self, "lb", "drain", "b0"); err != nil {
				t.Errorf("instance %d: braid lb drain b0: %v: %s", i, err, out)
			}
		}
	})
	fleetDownloadAll(t, cs, 200<<10)
	wg.Wait()
	fleetCheckSubflows(t, cs)
	fleetCheckResets(t, l, hosts)
	fleetCloseAll(cs)
	cs = fleetConnect(t, ctx, l, fleet, clients)
	per := make([]int, hosts)
	for _, c := range cs {
		per[c.backend]++
	}
	fleetCloseAll(cs)
	t.Logf("after adding b4 and draining b0 on every instance, new connections per backend: %v", per)
	if per[0] != 0 || per[4] == 0 {
		t.Errorf("new connections per backend %v: want none on the drained b0, some on the added b4", per)
	}

	// Its own health: an instance whose backends are all drained serves nothing and withdraws
	// the VIP; one backend back, it announces again.
	lb3 := l.Host("lb3")
	var t0 time.Time
	for k := range hosts {
		t0 = time.Now() // the last drain is the one that leaves the instance nothing to serve
		if out, err := lb3.Run(ctx, self, "lb", "drain", fmt.Sprintf("b%d", k)); err != nil {
			t.Fatalf("braid lb drain b%d: %v: %s", k, err, out)
		}
	}
	routeWait(0)
	d = time.Since(t0)
	t.Logf("instance 3 with every backend drained: withdrawn within %.0f ms", float64(d.Microseconds())/1000)
	t0 = time.Now()
	if out, err := lb3.Run(ctx, self, "lb", "weight", "b1", "1"); err != nil {
		t.Fatalf("braid lb weight b1 1: %v: %s", err, out)
	}
	routeWait(0, 3)
	d = time.Since(t0)
	t.Logf("one backend back: announced again within %.0f ms", float64(d.Microseconds())/1000)
	t.Logf("total %.1f s", time.Since(start).Seconds())
}

func fleetTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// fleetConn is one client connection: its backend and its subflows (client side).
type fleetConn struct {
	c        *net.TCPConn
	backend  int
	subflows []info.AddrPair
}

func fleetCloseAll(cs []*fleetConn) {
	for _, c := range cs {
		if c != nil && c.c != nil {
			c.c.Close()
		}
	}
}

// fleetConnect opens n MPTCP connections, asks each for its backend and waits until each has
// its second subflow to that backend's own port (the balancer's stateless table steers it).
func fleetConnect(t *testing.T, ctx context.Context, l *lab.Lab, fleet *mplb.Fleet, n int) []*fleetConn {
	t.Helper()
	cs := make([]*fleetConn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			c, err := mplb.MPLBDial(ctx, l)
			if err != nil {
				errs <- fmt.Errorf("dial %d: %w", i, err)
				return
			}
			cs[i] = &fleetConn{c: c}
			k, err := mplb.MPLBAsk(c)
			if err != nil {
				errs <- fmt.Errorf("connection %d: %w", i, err)
				return
			}
			cs[i].backend = k
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fleetCloseAll(cs)
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, fc := range cs {
		want := mplb.MPLBStatelessPort(fc.backend)
		for {
			sfs, err := establishedSubflows(fc.c)
			if err != nil {
				t.Fatal(err)
			}
			if len(sfs) == 2 && slices.ContainsFunc(sfs, func(a info.AddrPair) bool { return a.Remote.Port() == want }) {
				fc.subflows = sfs
				break
			}
			if time.Now().After(deadline) {
				fleetCloseAll(cs)
				t.Fatalf("connection on backend %d: subflows %+v, want 2 with one to port %d", fc.backend, sfs, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return cs
}

// fleetDownloadAll makes every connection download size bytes at once and checks each byte.
func fleetDownloadAll(t *testing.T, cs []*fleetConn, size int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(cs))
	for i, fc := range cs {
		wg.Go(func() {
			fc.c.SetDeadline(time.Now().Add(30 * time.Second))
			k, err := fleetDownload(fc.c, size)
			switch {
			case err != nil:
				errs <- fmt.Errorf("download %d (backend %d): %w", i, fc.backend, err)
			case k != fc.backend:
				errs <- fmt.Errorf("download %d: served by backend %d, the connection was on %d", i, k, fc.backend)
			}
		})
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d downloads failed", n, len(cs))
	}
}

// fleetDownload asks for size bytes and checks them: the servers send byte(offset).
func fleetDownload(c net.Conn, size int) (int, error) {
	req := make([]byte, 9)
	req[0] = 'D'
	binary.BigEndian.PutUint64(req[1:], uint64(size))
	if _, err := c.Write(req); err != nil {
		return -1, err
	}
	buf := make([]byte, 32<<10)
	off := 0
	for off < size {
		n, err := c.Read(buf[:min(len(buf), size-off)])
		for j := range n {
			if buf[j] != byte(off+j) {
				return -1, fmt.Errorf("byte %d is %d, want %d", off+j, buf[j], byte(off+j))
			}
		}
		off += n
		if err != nil {
			return -1, fmt.Errorf("after %d of %d bytes: %w", off, size, err)
		}
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return -1, err
	}
	return int(b[0]), nil
}

// establishedSubflows returns the connection's subflows in the established state (the
// subflow list also holds joins still waiting for their SYN/ACK).
func establishedSubflows(c *net.TCPConn) ([]info.AddrPair, error) {
	full, err := info.Full(c)
	if err != nil {
		return nil, err
	}
	var out []info.AddrPair
	for _, sf := range full.Subflows {
		if sf.TCP.State == 1 { // TCP_ESTABLISHED
			out = append(out, info.AddrPair{Local: sf.Local, Remote: sf.Remote})
		}
	}
	return out, nil
}

// fleetCheckSubflows checks that every connection still has both subflows established.
func fleetCheckSubflows(t *testing.T, cs []*fleetConn) {
	t.Helper()
	for i, fc := range cs {
		sfs, err := establishedSubflows(fc.c)
		if err != nil || len(sfs) != 2 {
			t.Errorf("connection %d: subflows %+v (%v), want its 2", i, sfs, err)
		}
	}
}

// fleetCheckResets checks that no join was refused: the client received no MP_TCPRST and no
// backend got a join for a connection it does not hold.
func fleetCheckResets(t *testing.T, l *lab.Lab, backends int) {
	t.Helper()
	get := func(h *lab.Host, group, name string) uint64 {
		var v uint64
		err := h.NS.Do(func() error {
			b, err := os.ReadFile("/proc/thread-self/net/netstat")
			if err != nil {
				return err
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			for i := 0; i+1 < len(lines); i += 2 {
				names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
				if len(names) != len(values) || len(names) == 0 || names[0] != group+":" {
					continue
				}
				for j := range names {
					if names[j] == name {
						fmt.Sscan(values[j], &v)
						return nil
					}
				}
			}
			return fmt.Errorf("no %s %s in netstat", group, name)
		})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if n := get(l.Host("client"), "MPTcpExt", "MPRstRx"); n != 0 {
		t.Errorf("the client received %d MP_TCPRST", n)
	}
	for k := range backends {
		if n := get(l.Host(fmt.Sprintf("b%d", k)), "MPTcpExt", "MPJoinNoTokenFound"); n != 0 {
			t.Errorf("backend %d got %d joins for connections it does not hold", k, n)
		}
	}
}

// subflowMonitor samples every backend's subflows (sock_diag) and records, per subflow, when
// its acknowledged bytes advanced and whether data was outstanding.
type subflowMonitor struct {
	start   time.Time
	done    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	samples map[netip.AddrPort][]sfSample // by the client's end of the subflow
}

type sfSample struct {
	at      time.Time
	acked   uint64
	unacked uint32
}

func startSubflowMonitor(l *lab.Lab, backends int) *subflowMonitor {
	m := &subflowMonitor{start: time.Now(), done: make(chan struct{}), samples: map[netip.AddrPort][]sfSample{}}
	m.wg.Go(func() {
		for {
			for k := range backends {
				dump, err := info.Dump(info.Options{NetNS: l.Host(fmt.Sprintf("b%d", k)).NS.Handle()})
				if err != nil {
					continue
				}
				now := time.Now()
				m.mu.Lock()
				for _, c := range dump {
					for _, sf := range c.Subflows {
						m.samples[sf.Remote] = append(m.samples[sf.Remote], sfSample{now, sf.TCP.BytesAcked, sf.TCP.Unacked})
					}
				}
				m.mu.Unlock()
			}
			select {
			case <-m.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	return m
}

func (m *subflowMonitor) stop() {
	close(m.done)
	m.wg.Wait()
}

// stallAfter returns the longest time after t during which the subflow (client end sf) had
// unacknowledged data and its acknowledged bytes did not advance.
func (m *subflowMonitor) stallAfter(sf netip.AddrPort, t time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var worst time.Duration
	var since time.Time // start of the current stall
	var last uint64
	for i, s := range m.samples[sf] {
		switch {
		case i > 0 && s.acked != last:
			if !since.IsZero() && s.at.After(t) {
				worst = max(worst, s.at.Sub(fleetMaxTime(since, t)))
			}
			since = time.Time{}
			if s.unacked > 0 {
				since = s.at
			}
		case s.unacked > 0 && since.IsZero():
			since = s.at
		case s.unacked == 0:
			since = time.Time{}
		}
		last = s.acked
	}
	if !since.IsZero() {
		// Still stalled at the end of sampling (the connection ended or never resumed).
		ss := m.samples[sf]
		end := ss[len(ss)-1].at
		if end.After(t) {
			worst = max(worst, end.Sub(fleetMaxTime(since, t)))
		}
	}
	return worst
}

func fleetMaxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// pacedServers are the backends' servers: each answers a byte with its backend number, and
// "D" + an 8-byte size with that many bytes, byte(offset) each, 4 kB every 40 ms, then the
// number.
type pacedServers struct {
	lns []net.Listener
	wg  sync.WaitGroup
	mu  sync.Mutex
	cs  []net.Conn
}

func startPacedServers(l *lab.Lab, n int) (*pacedServers, error) {
	s := &pacedServers{}
	for k := range n {
		var ln net.Listener
		err := l.Host(fmt.Sprintf("b%d", k)).NS.Do(func() error {
			var lc net.ListenConfig
			lc.SetMultipathTCP(true)
			var err error
			ln, err = lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(mplb.MPLBVIP, mplb.MPLBPort).String())
			return err
		})
		if err != nil {
			s.close()
			return nil, err
		}
		s.lns = append(s.lns, ln)
		s.wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				s.mu.Lock()
				s.cs = append(s.cs, c)
				s.mu.Unlock()
				s.wg.Go(func() { servePaced(c, byte(k)) })
			}
		})
	}
	return s, nil
}

func servePaced(c net.Conn, k byte) {
	req := make([]byte, 9)
	chunk := make([]byte, 4<<10)
	for {
		if _, err := io.ReadFull(c, req[:1]); err != nil {
			return
		}
		if req[0] == 'D' {
			if _, err := io.ReadFull(c, req[1:]); err != nil {
				return
			}
			size := int(binary.BigEndian.Uint64(req[1:]))
			for off := 0; off < size; off += len(chunk) {
				n := min(len(chunk), size-off)
				for j := range n {
					chunk[j] = byte(off + j)
				}
				if _, err := c.Write(chunk[:n]); err != nil {
					return
				}
				time.Sleep(40 * time.Millisecond)
			}
		}
		if _, err := c.Write([]byte{k}); err != nil {
			return
		}
	}
}

func (s *pacedServers) close() {
	for _, ln := range s.lns {
		ln.Close()
	}
	s.mu.Lock()
	for _, c := range s.cs {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// resumeAfter reports, for a subflow that had data in flight at t (its last sample before t
// shows unacknowledged bytes), how long after t its acknowledged bytes advanced (ok false if
// nothing was in flight); one that never advanced again counts as the whole sampling time
// after t.
func (m *subflowMonitor) resumeAfter(sf netip.AddrPort, t time.Time) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ss := m.samples[sf]
	var last *sfSample // the last sample at or before t
	for i := range ss {
		if ss[i].at.After(t) {
			break
		}
		last = &ss[i]
	}
	if last == nil || last.unacked == 0 {
		return 0, false
	}
	for _, s := range ss {
		if s.at.After(t) && s.acked > last.acked {
			return s.at.Sub(t), true
		}
	}
	return ss[len(ss)-1].at.Sub(t), true
}
