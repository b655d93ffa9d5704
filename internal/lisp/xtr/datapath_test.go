package xtr

import (
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"braid/internal/lab/netns"
	"braid/internal/wire/lisp"
)

// countDevice counts what is written to it.
type countDevice struct {
	nullDevice
	pkts, bytes int
}

func (d *countDevice) WriteBatch(pkts [][]byte) error {
	for _, p := range pkts {
		d.pkts++
		d.bytes += len(p)
	}
	return nil
}

// dataPair runs two xTRs' real sockets in a namespace of their own: site 1 (192.168.1.0/24) on
// RLOC 127.0.0.1 and site 2 (192.168.2.0/24) on 127.0.0.2, each with the other's mapping;
// site 2 writes to dev.
func dataPair(t *testing.T, dev Device) [2]*XTR {
	ns, err := netns.Create(fmt.Sprintf("braid-xtrdata-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close(); netns.Delete(ns.Name) })
	rlocs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}
	eids := []string{"192.168.1.0/24", "192.168.2.0/24"}
	var xs [2]*XTR
	for i := range 2 {
		var u *Uplink
		if err := ns.Do(func() (err error) { u, err = OpenUplink(rlocs[i], ""); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { u.Close() })
		var d Device = nullDevice{}
		if i == 1 {
			d = dev
		}
		x, err := New(Options{Device: d, EIDs: []netip.Prefix{netip.MustParsePrefix(eids[i])}, Uplinks: []*Uplink{u},
			Locators: []Locator{{Priority: 1, Weight: 1}}, Resolvers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.9:4342")}})
		if err != nil {
			t.Fatal(err)
		}
		rec := record(eids[1-i], 10, rlocs[1-i].String())
		x.mu.Lock()
		x.installLocked(time.Now(), &rec)
		x.mu.Unlock()
		xs[i] = x
	}
	return xs
}

// TestXtrDataPathAllocs (issue 19, item 1): the batched data path allocates nothing per packet.
// Two xTRs in a namespace of their own, RLOCs 127.0.0.1 and 127.0.0.2 on its loopback: the
// first encapsulates a train of 40 packets (the segments of a super-packet) and sends it in
// one system call on its real sockets; the second reads it (recvmmsg, UDP GRO), checks each
// packet's sources and writes them to its device in one batch. Every packet arrives, and the
// whole round allocates nothing.
func TestXtrDataPathAllocs(t *testing.T) {
	dev := &countDevice{}
	xs := dataPair(t, dev)
	const n = 40
	pkt := ipUDP(t, "192.168.1.1:1000", "192.168.2.1:80")
	pkt = append(pkt, make([]byte, 1200)...)
	u := lisp.IPUDP{Src: netip.MustParseAddrPort("192.168.1.1:1000"), Dst: netip.MustParseAddrPort("192.168.2.1:80"), TTL: 64, PayloadLen: uint16(len(pkt) - 28)}
	u.Encode(pkt)
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, headroom+len(pkt))
	}
	r, err := newRxSocket(xs[1].o.Uplinks[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	tr := new(train)
	out := make([][]byte, 0, rxBatch*maxBatch)
	var reads, msgs int
	round := func() {
		now := time.Now()
		for _, b := range bufs {
			copy(b[headroom:], pkt) // the device's read
			xs[0].encapTo(tr, nil, now, b, len(pkt))
		}
		tr.flush(xs[0])
		for got := dev.pkts; dev.pkts-got < n; {
			xs[1].o.Uplinks[0].Data.SetReadDeadline(now.Add(2 * time.Second))
			m, err := r.read()
			if err != nil {
				t.Fatalf("after %d of %d packets: %v", dev.pkts-got, n, err)
			}
			reads++
			msgs += m
			out = xs[1].decapBatch(now, 0, r, m, out)
		}
	}
	allocs := testing.AllocsPerRun(50, round)
	c0, c1 := xs[0].Counters(), xs[1].Counters()
	t.Logf("%v allocations per round of %d packets; %d recvmmsg calls, %d messages, for %d packets; sent %d, delivered %d",
		allocs, n, reads, msgs, dev.pkts, c0[CountTxPackets], c1[CountRxPackets])
	if allocs != 0 {
		t.Errorf("%v allocations per round of %d packets, want 0", allocs, n)
	}
	if c0[CountTxPackets] != uint64(dev.pkts) || c1[CountRxPackets] != uint64(dev.pkts) || dev.pkts != 51*n || dev.bytes != dev.pkts*len(pkt) {
		t.Errorf("sent %d, delivered %d, device got %d packets (%d bytes), want %d of %d bytes", c0[CountTxPackets], c1[CountRxPackets],
			dev.pkts, dev.bytes, 51*n, len(pkt))
	}
}

// TestXtrBatchedETRChecks (issue 19, item 1): the ETR's source checks hold on the batched path.
// Site 1 sends site 2 trains of packets whose inner source is site 2's own EID, and of packets
// from an EID whose mapping does not list the sending RLOC: none reaches the device, each is
// counted where it is dropped; a train of good packets beside them arrives whole.
func TestXtrBatchedETRChecks(t *testing.T) {
	dev := &countDevice{}
	xs := dataPair(t, dev)
	// 192.168.3.0/24 is mapped to an RLOC that is not 127.0.0.1.
	rec := record("192.168.3.0/24", 10, "127.0.0.7")
	xs[1].mu.Lock()
	xs[1].installLocked(time.Now(), &rec)
	xs[1].mu.Unlock()
	r, err := newRxSocket(xs[1].o.Uplinks[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	u := xs[0].o.Uplinks[0]
	send := func(src string, k int) {
		pkt := ipUDP(t, src, "192.168.2.1:80")
		var tr train
		for range k {
			b := make([]byte, headroom+len(pkt))
			copy(b[headroom:], pkt)
			tr.add(xs[0], u.tx[0], netip.MustParseAddrPort("127.0.0.2:4341"), 64, xs[0].pairs[pairKey{0, netip.MustParseAddr("127.0.0.2")}], encapsulate(b, len(pkt)))
		}
		tr.flush(xs[0])
	}
	send("192.168.2.9:53", 10) // site 2's own EID as inner source
	send("192.168.3.9:53", 10) // mapped, but not to 127.0.0.1
	send("192.168.1.9:53", 10) // good
	out := make([][]byte, 0, rxBatch*maxBatch)
	deadline := time.Now().Add(2 * time.Second)
	for c := xs[1].Counters(); c[DropSpoofedSource]+c[DropOuterSource]+c[CountRxPackets] < 30; c = xs[1].Counters() {
		xs[1].o.Uplinks[0].Data.SetReadDeadline(deadline)
		m, err := r.read()
		if err != nil {
			t.Fatalf("counters %v: %v", c, err)
		}
		out = xs[1].decapBatch(time.Now(), 0, r, m, out)
	}
	c := xs[1].Counters()
	if c[DropSpoofedSource] != 10 || c[DropOuterSource] != 10 || c[CountRxPackets] != 10 || dev.pkts != 10 {
		t.Fatalf("own-EID source dropped %d, wrong outer source dropped %d, delivered %d (device %d), want 10 each",
			c[DropSpoofedSource], c[DropOuterSource], c[CountRxPackets], dev.pkts)
	}
}

// superDevice hands out reads of k copies of pkt (the segments of a super-packet), reads
// times; then it has nothing, and calls idle.
type superDevice struct {
	nullDevice
	pkt      []byte
	k, reads int
}

func (d *superDevice) ReadBatchIdle(bufs [][]byte, off int, sizes []int, idle func()) (int, error) {
	if d.reads == 0 {
		idle()
		return 0, nil
	}
	d.reads--
	for i := range d.k {
		sizes[i] = copy(bufs[i][off:], d.pkt)
	}
	return d.k, nil
}

// TestXtrTrainsAcrossReads (issue 19): a train gathers segments across device reads. Reads of
// 46 segments of 1464 bytes (a 64 KiB TCP super-packet at the xTR's MTU) are more than one
// train carries (44 datagrams of 1472 bytes in at most 65 507): sent read by read they took two
// trains each, the second of 2 datagrams. Read by the ITR's loop (two sets of buffers, the
// train sent when full, before a read into the set it holds, and when the device has nothing),
// 10 reads leave in 11 trains, every packet arrives whole at the other xTR, and a
// round allocates nothing.
func TestXtrTrainsAcrossReads(t *testing.T) {
	dev := &countDevice{}
	xs := dataPair(t, dev)
	const k, reads, size = 46, 10, 1464
	pkt := ipUDP(t, "192.168.1.1:1000", "192.168.2.1:80")
	pkt = append(pkt, make([]byte, size-len(pkt))...)
	u := lisp.IPUDP{Src: netip.MustParseAddrPort("192.168.1.1:1000"), Dst: netip.MustParseAddrPort("192.168.2.1:80"), TTL: 64, PayloadLen: uint16(size - 28)}
	u.Encode(pkt)
	sd := &superDevice{pkt: pkt, k: k}
	xs[0].o.Device = sd
	ir := xs[0].newITRReader()
	r, err := newRxSocket(xs[1].o.Uplinks[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]byte, 0, rxBatch*maxBatch)
	var rounds, msgs int
	round := func() {
		rounds++
		sd.reads = reads
		for sd.reads > 0 || ir.tr.n > 0 {
			if err := ir.next(xs[0]); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now()
		for got := dev.pkts; dev.pkts-got < k*reads; {
			xs[1].o.Uplinks[0].Data.SetReadDeadline(now.Add(2 * time.Second))
			m, err := r.read()
			if err != nil {
				t.Fatalf("after %d of %d packets: %v", dev.pkts-got, k*reads, err)
			}
			msgs += m
			out = xs[1].decapBatch(now, 0, r, m, out)
		}
	}
	allocs := testing.AllocsPerRun(20, round)
	perRound := float64(msgs) / float64(rounds)
	t.Logf("%v allocations per round of %d reads of %d segments; %.1f trains per round", allocs, reads, k, perRound)
	if allocs != 0 {
		t.Errorf("%v allocations per round, want 0", allocs)
	}
	if want := (k*reads*(size+lisp.DataHeaderLen) + maxUDPPayload - 1) / maxUDPPayload; perRound != float64(want) {
		t.Errorf("%.1f trains per round, want %d", perRound, want)
	}
	if c := xs[0].Counters(); dev.pkts != rounds*k*reads || c[CountTxPackets] != uint64(dev.pkts) || dev.bytes != dev.pkts*size {
		t.Errorf("sent %d, device got %d packets (%d bytes), want %d of %d bytes", c[CountTxPackets], dev.pkts, dev.bytes, rounds*k*reads, size)
	}
}

// TestXtrRoutesPerFlow (issue 19): the ITR looks up once a flow and read, and the ETR checks
// once a message and inner addresses, yet every packet gets its own flow's outcome. A read
// that mixes flows to the mapped site, to the site's own EIDs and to another host of the mapped
// site sends and drops packet by packet as the lookups say; one train whose inner sources
// alternate between a host of site 1 and site 2's own EID delivers the first and drops the
// second at site 2, each counted.
func TestXtrRoutesPerFlow(t *testing.T) {
	dev := &countDevice{}
	xs := dataPair(t, dev)
	good := ipUDP(t, "192.168.1.1:1000", "192.168.2.1:80")
	own := ipUDP(t, "192.168.1.1:1000", "192.168.1.5:80")
	other := ipUDP(t, "192.168.1.1:1000", "192.168.2.2:80")
	var tr train
	var rt route
	now := time.Now()
	for range 3 {
		for _, p := range [][]byte{good, good, own, own, good, other, other} {
			b := make([]byte, headroom+len(p))
			copy(b[headroom:], p)
			xs[0].encapTo(&tr, &rt, now, b, len(p))
		}
	}
	tr.flush(xs[0])
	if c := xs[0].Counters(); c[CountTxPackets] != 15 || c[DropOwnEID] != 6 {
		t.Errorf("sent %d, dropped as own EID %d, want 15 and 6", c[CountTxPackets], c[DropOwnEID])
	}

	u := xs[0].o.Uplinks[0]
	srcs := []string{"192.168.1.9:53", "192.168.2.9:53"}
	for i := range 10 {
		p := ipUDP(t, srcs[i%2], "192.168.2.1:80")
		b := make([]byte, headroom+len(p))
		copy(b[headroom:], p)
		tr.add(xs[0], u.tx[0], netip.MustParseAddrPort("127.0.0.2:4341"), 64, xs[0].pairs[pairKey{0, netip.MustParseAddr("127.0.0.2")}], encapsulate(b, len(p)))
	}
	tr.flush(xs[0])
	r, err := newRxSocket(xs[1].o.Uplinks[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]byte, 0, rxBatch*maxBatch)
	deadline := time.Now().Add(2 * time.Second)
	for c := xs[1].Counters(); c[DropSpoofedSource]+c[CountRxPackets] < 25; c = xs[1].Counters() {
		xs[1].o.Uplinks[0].Data.SetReadDeadline(deadline)
		m, err := r.read()
		if err != nil {
			t.Fatalf("counters %v: %v", c, err)
		}
		out = xs[1].decapBatch(time.Now(), 0, r, m, out)
	}
	if c := xs[1].Counters(); c[CountRxPackets] != 20 || c[DropSpoofedSource] != 5 || dev.pkts != 20 {
		t.Errorf("delivered %d (device %d), dropped as spoofed %d, want 20 and 5", c[CountRxPackets], dev.pkts, c[DropSpoofedSource])
	}
}
