package pm_test

import (
	"context"
	"encoding/binary"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"braid/internal/experiment/amptcp"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/lisp/xtr"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
	"braid/internal/traffic"
)

// flowKey is a subflow as the wire shows it, from the client's side.
type flowKey struct{ client, server netip.AddrPort }

// rlocPair is the outer source and destination of a LISP-encapsulated packet.
type rlocPair struct{ src, dst netip.Addr }

func (p rlocPair) String() string { return p.src.String() + "->" + p.dst.String() }

// wire records, for each inner TCP flow between the two hosts, the RLOC pairs of the LISP data
// packets that carried its payload, as the core router sees them on its links.
type wire struct {
	mu    sync.Mutex
	seen  map[flowKey]map[rlocPair]int
	fd    int
	done  chan struct{}
	since time.Time
}

// capture opens a packet socket in host h (the core) and records until the test ends.
func capture(t *testing.T, h *lab.Host, client netip.Addr) *wire {
	t.Helper()
	w := &wire{seen: map[flowKey]map[rlocPair]int{}, done: make(chan struct{})}
	if err := h.NS.Do(func() (err error) {
		w.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_IP)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tv := unix.Timeval{Usec: 100000}
	if err := unix.SetsockoptTimeval(w.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	go func() {
		defer close(w.done)
		buf := make([]byte, 65536)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, from, err := unix.Recvfrom(w.fd, buf, 0)
			if err != nil {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue // each packet once: as it arrives at the core
			}
			w.packet(buf[:n], client)
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-w.done
		unix.Close(w.fd)
	})
	return w
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// packet takes an outer IPv4 packet; LISP data (UDP 4341) with an inner TCP segment carrying
// payload is recorded.
func (w *wire) packet(b []byte, client netip.Addr) {
	if len(b) < 20 || b[0]>>4 != 4 || b[9] != 17 {
		return
	}
	ihl := int(b[0]&15) * 4
	if len(b) < ihl+16+20 || binary.BigEndian.Uint16(b[ihl+2:]) != 4341 {
		return
	}
	src, dst := netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
	in := b[ihl+16:]
	if in[0]>>4 != 4 || in[9] != 6 {
		return
	}
	iihl := int(in[0]&15) * 4
	total := int(binary.BigEndian.Uint16(in[2:]))
	if len(in) < iihl+20 || total > len(in) {
		return
	}
	tcp := in[iihl:total]
	payload := len(tcp) - int(tcp[12]>>4)*4
	if payload <= 0 {
		return
	}
	is, id := netip.AddrFrom4([4]byte(in[12:16])), netip.AddrFrom4([4]byte(in[16:20]))
	sp, dp := binary.BigEndian.Uint16(tcp[0:]), binary.BigEndian.Uint16(tcp[2:])
	k := flowKey{netip.AddrPortFrom(is, sp), netip.AddrPortFrom(id, dp)}
	if id == client {
		k = flowKey{k.server, k.client}
	}
	w.mu.Lock()
	if w.seen[k] == nil {
		w.seen[k] = map[rlocPair]int{}
	}
	w.seen[k][rlocPair{src, dst}]++
	w.mu.Unlock()
}

// reset forgets what was seen.
func (w *wire) reset() {
	w.mu.Lock()
	w.seen = map[flowKey]map[rlocPair]int{}
	w.mu.Unlock()
}

// packets returns the payload packets seen of flow k.
func (w *wire) packets(k flowKey) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.seen[k] {
		n += c
	}
	return n
}

// pairsOf returns the RLOC pairs that carried each flow with more than a few packets.
func (w *wire) pairsOf() map[flowKey][]rlocPair {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[flowKey][]rlocPair{}
	for k, ps := range w.seen {
		for p, n := range ps {
			if n >= 5 {
				out[k] = append(out[k], p)
			}
		}
	}
	return out
}

// subflowsOf returns the subflows of the busiest connection the path manager follows, once
// every connection has want subflows, all up (within d). (A bulk test has a control
// connection beside its data connection; both are augmented.)
func subflowsOf(t *testing.T, d *pm.Daemon, w *wire, want int, within time.Duration) []core.SubflowStatus {
	t.Helper()
	deadline := time.Now().Add(within)
	var last pm.Status
	for time.Now().Before(deadline) {
		last = d.Status()
		ok := len(last.Connections) > 0
		for _, c := range last.Connections {
			up := 0
			for _, s := range c.Subflows {
				if s.State == "up" {
					up++
				}
			}
			ok = ok && up == want && len(c.Subflows) == want
		}
		if ok {
			best, most := 0, -1
			for i, c := range last.Connections {
				n := 0
				for _, s := range c.Subflows {
					n += w.packets(flowKey{netip.MustParseAddrPort(s.Local), netip.MustParseAddrPort(s.Remote)})
				}
				if n > most {
					best, most = i, n
				}
			}
			return last.Connections[best].Subflows
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("not %d subflows up within %v: %+v, amptcp %+v", want, within, last, last.AMPTCP)
	return nil
}

// checkPlacement asserts that each subflow's payload crossed the core on exactly one RLOC pair
// and that no two subflows shared one; it returns the pairs.
func checkPlacement(t *testing.T, w *wire, subs []core.SubflowStatus, client netip.Addr) map[rlocPair]bool {
	t.Helper()
	seen := w.pairsOf()
	used := map[rlocPair]bool{}
	for _, s := range subs {
		k := flowKey{netip.MustParseAddrPort(s.Local), netip.MustParseAddrPort(s.Remote)}
		ps := seen[k]
		// Only the data direction carries payload: acknowledgements are not counted.
		data := ps
		if len(data) != 1 {
			t.Errorf("subflow %v -> %v crossed the core on %d RLOC pairs: %v", k.client, k.server, len(data), data)
			continue
		}
		if used[data[0]] {
			t.Errorf("subflow %v -> %v shares RLOC pair %v with another", k.client, k.server, data[0])
		}
		used[data[0]] = true
	}
	return used
}

func startAMPTCPServer(t *testing.T, h *lab.Host) {
	t.Helper()
	ln, err := roles.MPTCPListen(h, "0.0.0.0:5201")
	if err != nil {
		t.Fatal(err)
	}
	srv := traffic.NewServer(ln, nil)
	go srv.Serve(context.Background())
	t.Cleanup(func() { srv.Close() })
}

// startAMPTCP brings up sites (a LispSitesTopology t), the map server and the xTRs, placement
// mode on those listed in placing, and braid pm --policy amptcp on the first site's host.
func startAMPTCP(t *testing.T, tp func() *lab.Lab, sites []roles.LispSite, resolver netip.AddrPort, placing ...int) (*roles.LispLab, *pm.Daemon) {
	t.Helper()
	l := tp()
	ll, err := roles.StartLispSites(context.Background(), l, sites, func(i int, o *xtr.Options) {
		amptcp.AMPTCPXTR(i, o)
		o.Placement = slices.Contains(placing, i)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ll.Close(); err != nil {
			t.Errorf("stop lisp: %v", err)
		}
	})
	if err := amptcp.PrepareAMPTCP(l, sites); err != nil {
		t.Fatal(err)
	}
	h1 := l.Host(sites[0].Host)
	up, err := roles.HostUplink(l, h1, sites[0].HostIP[0])
	if err != nil {
		t.Fatal(err)
	}
	d, stop, err := roles.StartPM(context.Background(), h1, roles.PMOptions{Uplinks: []core.Uplink{up}, Policy: &core.AMPTCP{},
		Resolvers: []netip.AddrPort{resolver}, MaxAge: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("pm: %v", err)
		}
	})
	startAMPTCPServer(t, l.Host(sites[1].Host))
	return ll, d
}

// The paper's testbed: a single-homed client, a data centre with 2 RLOCs. A download opens
// exactly 2 subflows, and the data centre sends each through a different RLOC (on the wire).
// Only the data centre's xTR, on the sending side, places flows (the paper's asymmetric case).
func TestLabAMPTCPTwoRLOCs(t *testing.T) {
	labtest.Require(t)
	sites := amptcp.AMPTCPSites()
	ll, d := startAMPTCP(t, func() *lab.Lab {
		return labtest.Up(t, amptcp.AMPTCPTopology(40e6, 20e6, 2*time.Millisecond))
	}, sites, roles.LispMapServer, 1)
	l := ll.Lab
	client := sites[0].HostIP[0]
	w := capture(t, l.Host("core"), client)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := traffic.Bulk(ctx, roles.MPTCPDial(l.Host(sites[0].Host), true), netip.AddrPortFrom(sites[1].HostIP[0], 5201).String(),
			traffic.BulkOptions{Duration: 6 * time.Second, Interval: time.Second, Reverse: true})
		done <- err
	}()
	subs := subflowsOf(t, d, w, 2, 5*time.Second)
	time.Sleep(500 * time.Millisecond)
	w.reset()
	time.Sleep(1500 * time.Millisecond)
	// Still exactly 2.
	subs = subflowsOf(t, d, w, 2, time.Second)
	used := checkPlacement(t, w, subs, client)
	srcs := map[netip.Addr]bool{}
	for p := range used {
		srcs[p.src] = true
	}
	if len(srcs) != 2 {
		t.Errorf("the data centre sent from %v, want both its RLOCs %v", srcs, sites[1].RLOCs)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := d.Status()
	if st.AMPTCP == nil || st.AMPTCP.Decisions.Placed == 0 || st.AMPTCP.Lookups.Replies < 2 {
		t.Errorf("amptcp status %+v", st.AMPTCP)
	}
	t.Logf("subflows %v; pairs %v; amptcp %+v", subs, used, st.AMPTCP)
}

// 2x2 RLOCs: 4 subflows on 4 different RLOC pairs; taking an RLOC of the client's site out of
// the mapping removes two, and the two left are on the two pairs still usable. Only the
// sending side (the client: path manager and placing xTR) runs braid's A-MPTCP parts; the
// server's site places by hash.
func TestLabAMPTCPFourPairsAndMappingChange(t *testing.T) {
	labtest.Require(t)
	sites := roles.LispSites[:]
	ll, d := startAMPTCP(t, func() *lab.Lab {
		shape := func(int, int) (up, down topo.Shape) {
			return topo.Shape{Rate: 20e6, Delay: 2 * time.Millisecond}, topo.Shape{Rate: 20e6, Delay: 2 * time.Millisecond}
		}
		return labtest.Up(t, roles.LispSitesTopology("amptcp4", sites, shape, topo.Shape{Delay: 2 * time.Millisecond}))
	}, sites, roles.LispMapServer, 0)
	l := ll.Lab
	client := sites[0].HostIP[0]
	w := capture(t, l.Host("core"), client)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		// An upload: the client's xTR places the data.
		_, err := traffic.Bulk(ctx, roles.MPTCPDial(l.Host(sites[0].Host), true), netip.AddrPortFrom(sites[1].HostIP[0], 5201).String(),
			traffic.BulkOptions{Duration: 9 * time.Second, Interval: time.Second})
		done <- err
	}()
	subs := subflowsOf(t, d, w, 4, 5*time.Second)
	time.Sleep(500 * time.Millisecond)
	w.reset()
	time.Sleep(time.Second)
	if used := checkPlacement(t, w, subflowsOf(t, d, w, 4, time.Second), client); len(used) != 4 {
		t.Errorf("4 subflows on %d RLOC pairs: %v", len(used), used)
	}
	// The client site takes its second RLOC out of the mapping (priority 255).
	if err := ll.XTRs[0].SetLocators([]xtr.Locator{{Priority: 1, Weight: 50}, {Priority: 255}}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	subs = subflowsOf(t, d, w, 2, 5*time.Second)
	t.Logf("2 subflows %v after the mapping change", time.Since(changed).Round(10*time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	w.reset()
	time.Sleep(time.Second)
	used := checkPlacement(t, w, subs, client)
	for p := range used {
		if p.src != sites[0].RLOCs[0] {
			t.Errorf("a subflow still leaves from %v, taken out of the mapping", p.src)
		}
	}
	if len(used) != 2 {
		t.Errorf("2 subflows on %d RLOC pairs: %v", len(used), used)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := d.Status()
	if st.Counters.Unwanted < 2 || st.AMPTCP.Decisions.MappingChanges == 0 {
		t.Errorf("counters %+v amptcp %+v", st.Counters, st.AMPTCP)
	}
	t.Logf("amptcp %+v", st.AMPTCP)
}

// A map-resolver that does not answer: the connection gets what the kernel's full mesh would
// give it (here its one subflow), the transfer is intact, and the reason is counted.
func TestLabAMPTCPSilentResolver(t *testing.T) {
	labtest.Require(t)
	sites := amptcp.AMPTCPSites()
	silent := netip.AddrPortFrom(roles.LispMapServer.Addr(), 4999) // nothing listens there
	ll, d := startAMPTCP(t, func() *lab.Lab {
		return labtest.Up(t, amptcp.AMPTCPTopology(40e6, 20e6, 2*time.Millisecond))
	}, sites, silent, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := roles.MPTCPDial(ll.Lab.Host(sites[0].Host), true)
	addr := netip.AddrPortFrom(sites[1].HostIP[0], 5201).String()
	// Long enough for the lookups to time out (3 requests of 300 ms) while the data flows.
	r, err := traffic.File(ctx, dial, addr, traffic.FileOptions{Size: 8 << 20, Reverse: true})
	if err != nil || !r.Intact {
		t.Fatalf("transfer: %v %v", r, err)
	}
	st := d.Status()
	if st.AMPTCP == nil || st.AMPTCP.Decisions.NoAnswer == 0 || st.AMPTCP.Decisions.Placed != 0 || st.AMPTCP.Lookups.Timeouts == 0 || st.Counters.Creates != 0 {
		t.Errorf("status %+v amptcp %+v", st.Counters, st.AMPTCP)
	}
	t.Logf("%v; amptcp %+v", r, st.AMPTCP)
}
