package tunnel

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"braid/internal/tunnel/reorder"
	"braid/internal/wire/mpath"
)

// The receiver reports each gap in a path's numbering once, as it first sees it, and nothing
// for packets in order, for a path that reorders, or for an outage or a restart.
func TestRxPathSeqGaps(t *testing.T) {
	type gap struct {
		first uint32
		count int
	}
	var r rxPathSeq
	steps := []struct {
		ps   uint32
		want gap
	}{
		{100, gap{}},                           // the first packet sets the numbering
		{101, gap{}},                           // in order
		{104, gap{102, 2}},                     // 102 and 103 lost
		{103, gap{}},                           // 103 came after all: reordered, not reported again
		{105, gap{}},                           // in order after the gap
		{105 + maxNackRun + 2, gap{}},          // an outage longer than a nack reports
		{105 + maxNackRun + 3, gap{}},          // in order after it
		{10, gap{}},                            // the peer restarted its numbering
		{11, gap{}},                            // in order in the new numbering
		{12 + maxNackRun, gap{12, maxNackRun}}, // the longest gap reported
	}
	for i, s := range steps {
		first, count := r.onData(s.ps, 0, 0, true)
		if count == 0 {
			first = 0
		}
		if (gap{first, count}) != s.want {
			t.Errorf("step %d, PathSeq %d: gap %d+%d, want %d+%d", i, s.ps, first, count, s.want.first, s.want.count)
		}
	}
	// A sparse flow's packet, sent ahead of its turn, still counts in the path's numbering
	// but says nothing of the data numbers the path may bring: the path's lowest still to
	// come stays where the ordered packets left it.
	p := &peer{}
	p.rxIDs = []uint8{0}
	q := &p.rxPath[0]
	q.onData(0, 500, 1, false)
	if _, ok := p.inFlightLocked(1, 1000); ok {
		t.Error("after a sparse packet alone, the path counts as delivering")
	}
	q.onData(1, 100, 2, true)
	q.onData(2, 900, 3, false)
	if first, count := q.onData(4, 101, 4, true); first != 3 || count != 1 {
		t.Errorf("a gap after a sparse packet: %d+%d, want 3+1", first, count)
	}
	if lowest, ok := p.inFlightLocked(5, 1000); !ok || lowest != 102 {
		t.Errorf("lowest still to come on the path %d (%v), want 102", lowest, ok)
	}
	var w rxPathSeq // the numbering wraps
	w.onData(1<<32-2, 0, 0, true)
	if first, count := w.onData(1, 0, 0, true); first != 1<<32-1 || count != 2 {
		t.Errorf("across the wrap: gap %d+%d, want %d+2", first, count, uint32(1<<32-1))
	}
}

// The sender resends a reported packet once, byte for byte, only while it keeps it, and no
// more than one per recoveryShare packets sent.
func TestRecoveryTake(t *testing.T) {
	r := newRecovery(true, 1400)
	if r.credit != recoveryBurst {
		t.Errorf("a new peer's resend budget: %v, want the whole bank (%d)", r.credit, recoveryBurst)
	}
	r.credit = 0 // what follows counts the budget earned by sending
	a, b := &peerPath{id: 0}, &peerPath{id: 1}
	pkt := func(seq uint32) []byte { return bytes.Repeat([]byte{byte(seq)}, 100+int(seq%7)) }
	// 64 packets alternate between the paths: each path numbers its own from 0.
	for seq := uint32(1000); seq < 1064; seq++ {
		pp := a
		if seq%2 == 1 {
			pp = b
		}
		if ps := r.record(pp, seq, pkt(seq), true); ps != (seq-1000)/2 {
			t.Fatalf("seq %d: PathSeq %d, want %d", seq, ps, (seq-1000)/2)
		}
	}
	dst := make([]byte, 1400)
	seq, n, out := r.take(b, 3, dst) // path b's 4th packet: seq 1007
	if out != resendOK || seq != 1007 || !bytes.Equal(dst[:n], pkt(1007)) {
		t.Fatalf("take(b, 3) = seq %d, %d bytes, outcome %d; want 1007, %d bytes, ok", seq, n, out, len(pkt(1007)))
	}
	if _, _, out := r.take(b, 3, dst); out != resendDone {
		t.Errorf("second take of the same packet: outcome %d, want resendDone", out)
	}
	if _, _, out := r.take(a, 40, dst); out != resendMissed {
		t.Errorf("take of a PathSeq never sent: outcome %d, want resendMissed", out)
	}
	// 64 packets earned 8 resends; one is spent.
	for ps := uint32(0); ps < 7; ps++ {
		if _, _, out := r.take(a, ps, dst); out != resendOK {
			t.Fatalf("resend %d within the budget: outcome %d", ps, out)
		}
	}
	if _, _, out := r.take(a, 7, dst); out != resendBudget {
		t.Errorf("resend beyond the budget: outcome %d, want resendBudget", out)
	}
	// A gap nack names data sequence numbers: the same packets, the same rules.
	r.credit = 2
	if n, out := r.takeSeq(1009, dst); out != resendOK || !bytes.Equal(dst[:n], pkt(1009)) {
		t.Fatalf("takeSeq(1009) = %d bytes, outcome %d; want %d bytes, ok", n, out, len(pkt(1009)))
	}
	if _, out := r.takeSeq(1007, dst); out != resendDone {
		t.Errorf("takeSeq of a packet resent for a nack: outcome %d, want resendDone", out)
	}
	if _, out := r.takeSeq(999, dst); out != resendMissed {
		t.Errorf("takeSeq of a number never sent: outcome %d, want resendMissed", out)
	}
	if _, out := r.takeSeq(1010, dst); out != resendDone {
		t.Errorf("takeSeq of a packet resent for a nack: outcome %d, want resendDone", out)
	}
	if _, out := r.takeSeq(1011, dst); out != resendOK {
		t.Errorf("takeSeq within the budget: outcome %d", out)
	}
	if _, out := r.takeSeq(1013, dst); out != resendBudget {
		t.Errorf("takeSeq beyond the budget: outcome %d, want resendBudget", out)
	}
	// After recoverySlots more packets the old ones are gone.
	for seq := uint32(2000); seq < 2000+recoverySlots; seq++ {
		r.record(a, seq, pkt(seq), true)
	}
	if _, _, out := r.take(b, 5, dst); out != resendMissed {
		t.Errorf("take of a packet no longer kept: outcome %d, want resendMissed", out)
	}
	// Off: numbers, keeps nothing.
	off, c := newRecovery(false, 1400), &peerPath{}
	if ps := off.record(c, 1, pkt(1), true); ps != 0 {
		t.Errorf("PathSeq with recovery off: %d", ps)
	}
	if _, _, out := off.take(c, 0, dst); out != resendMissed {
		t.Errorf("take with recovery off: outcome %d, want resendMissed", out)
	}
}

// BenchmarkRecoveryRecord is the sender's cost per data packet of numbering it on its path and
// keeping a copy for resending (1400-byte packets into a peer's ring of recoverySlots), against
// numbering alone (recovery off); docs/tunnel-profile.md has the share it takes of a profile.
func BenchmarkRecoveryRecord(b *testing.B) {
	for _, on := range []bool{true, false} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			r, pp := newRecovery(on, 1400), &peerPath{}
			inner := make([]byte, 1400)
			b.SetBytes(int64(len(inner)))
			for i := range b.N {
				r.record(pp, uint32(i), inner, true)
			}
		})
	}
}

// What the reorder buffer may still expect: the lowest of the numbers after the highest each
// path that delivered lately has brought (a path's numbers may go down, by resends); a path
// quiet for longer than live counts for nothing.
func TestInFlightFromPathsStillDelivering(t *testing.T) {
	const live = 100
	p := &peer{}
	deliver := func(id uint8, ps, seq uint32, now int64) {
		if !p.rxPath[id].started {
			p.rxIDs = append(p.rxIDs, id)
		}
		p.rxPath[id].onData(ps, seq, now, true)
	}
	if _, ok := p.inFlightLocked(0, live); ok {
		t.Fatal("in flight before any data")
	}
	deliver(1, 7, 10, 0)  // fast path
	deliver(2, 50, 8, 10) // slow path
	deliver(1, 8, 12, 20)
	deliver(2, 51, 5, 30) // a resend of 5: the slow path's highest stays 8
	if lo, ok := p.inFlightLocked(40, live); !ok || lo != 9 {
		t.Fatalf("inFlight = %d, %v; want 9 (after the slow path's 8), true", lo, ok)
	}
	deliver(1, 9, 14, 120)
	if lo, ok := p.inFlightLocked(135, live); !ok || lo != 15 {
		t.Fatalf("inFlight = %d, %v; want 15 once the slow path is quiet past live, true", lo, ok)
	}
	if _, ok := p.inFlightLocked(500, live); ok {
		t.Fatal("in flight with every path quiet past live")
	}
	if len(p.rxIDs) != 2 {
		t.Fatalf("rxIDs %v: want each path once", p.rxIDs)
	}
}

// The receiver asks once for each number missing behind packets that waited longer than gaps
// usually take, packs the numbers into gap nacks of 64, and holds their gaps for the resends.
func TestOverdueGapNacks(t *testing.T) {
	rb, err := reorder.New[*packetBuf](reorder.Config{Hold: 20 * time.Millisecond, Learn: true})
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{rb: rb}
	const ms = int64(time.Millisecond)
	var out []*packetBuf
	out = rb.Push(1, 100, 1000, nil, out)
	// The numbers from 101 to 200 arrive but 102, 140 and 180 to 182 (a stalled path's).
	for seq := uint32(101); seq <= 200; seq++ {
		if seq != 102 && seq != 140 && (seq < 180 || seq > 182) {
			out = rb.Push(2*ms, seq, 1000, nil, out)
		}
	}
	gaps, ks := p.overdueLocked(5*ms, 30*ms, nil, nil)
	if len(ks) != 0 {
		t.Fatalf("after 3 ms: gap nacks %+v, want none (gaps usually take longer)", ks)
	}
	now := 2*ms + int64(rb.Usual()) + 1
	gaps, ks = p.overdueLocked(now, 30*ms, gaps, ks[:0])
	want := []mpath.GapNack{
		{First: 102, Missing: 1<<63 | 1<<(63-38)},
		{First: 180, Missing: 1<<63 | 1<<62 | 1<<61},
	}
	if !slices.Equal(gaps, []uint32{102, 140, 180, 181, 182}) || !slices.Equal(ks, want) {
		t.Fatalf("overdue %v, gap nacks %+v; want 102, 140, 180-182 in %+v", gaps, ks, want)
	}
	if _, ks = p.overdueLocked(now+ms, 30*ms, gaps, ks[:0]); len(ks) != 0 {
		t.Fatalf("asked again: %+v", ks)
	}
	// Held past the hold for the resends, given up when they do not come.
	if out = rb.Expire(now+25*ms, out[:0]); len(out) != 0 {
		t.Fatalf("released %d packets while the resends may still come", len(out))
	}
	if out = rb.Expire(now+30*ms, out[:0]); len(out) != 94 || rb.Stats().Rescued != 5 {
		t.Fatalf("released %d packets (want the 94 held), %d gaps rescued (want 5)", len(out), rb.Stats().Rescued)
	}
}
