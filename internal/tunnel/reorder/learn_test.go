package reorder

import (
	"testing"
	"time"
)

// shortGaps pushes ten seconds of traffic into b in which every tenth packet comes 2 ms after the
// one behind it, and checks that each pair is delivered in order; it returns the output slice,
// the next sequence number and the time after it.
func shortGaps(t *testing.T, b *Buffer[int]) (out []int, seq uint32, now int64) {
	t.Helper()
	out = b.Push(0, 0, 100, 0, nil)
	seq, now = 1, 10*ms
	for now < 10_000*ms {
		out = b.Push(now, seq+1, 100, 1, out[:0])
		out = b.Push(now+2*ms, seq, 100, 0, out)
		if len(out) != 2 || out[0] != 0 || out[1] != 1 {
			t.Fatalf("at %d ms delivered %v, want both in order", now/ms, out)
		}
		seq += 2
		now += 10 * ms
		b.Expire(now, out[:0])
	}
	return out, seq, now
}

// giveUp pushes seq+1 at now, with seq missing, and checks that Expire gives seq up 10 ms later
// (the hold is short, as shortGaps left it).
func giveUp(t *testing.T, b *Buffer[int], out []int, seq uint32, now int64) []int {
	t.Helper()
	out = b.Push(now, seq+1, 100, 1, out[:0])
	out = b.Expire(now+10*ms, out[:0])
	if len(out) != 1 || b.Stats().Lost != 1 {
		t.Fatalf("the gap was not given up after the short hold: out %v, stats %+v", out, b.Stats())
	}
	return out
}

// With Learn, gaps that fill within 2 ms bring the hold down from the ceiling to about what they
// need, a packet that comes after its gap was given up on puts it back to the ceiling, and without
// Learn the hold stays what SetHold set.
func TestLearnHoldFollowsReordering(t *testing.T) {
	for _, learn := range []bool{true, false} {
		b, err := New[int](Config{Learn: learn})
		if err != nil {
			t.Fatal(err)
		}
		b.SetHold(100 * time.Millisecond)
		if b.Hold() != 100*time.Millisecond {
			t.Fatalf("learn %v: hold %v before any packet, want the ceiling", learn, b.Hold())
		}
		out, seq, now := shortGaps(t, b)
		if !learn {
			if b.Hold() != 100*time.Millisecond {
				t.Errorf("without Learn the hold moved to %v", b.Hold())
			}
			continue
		}
		if h := b.Hold(); h < 3*time.Millisecond || h > 5*time.Millisecond {
			t.Errorf("hold %v after gaps that needed 2 ms, want 3.5 ms (5/4 of it and the margin)", h)
		}
		// A gap given up on (seq is lost, or so it seems) and its packet after all: late.
		out = giveUp(t, b, out, seq, now)
		out = b.Push(now+20*ms, seq, 100, 0, out[:0])
		if len(out) != 1 || b.Stats().Late != 1 {
			t.Fatalf("late packet: out %v, stats %+v", out, b.Stats())
		}
		if b.Hold() != 100*time.Millisecond {
			t.Errorf("hold %v after a late packet, want the ceiling back", b.Hold())
		}
	}
}

// A late packet whose gap a timeout gave up on raises the hold above the ceiling SetHold set, to
// what it showed it needed (the wait of the packet the timeout released plus the time since),
// and the raise fades like any learnt need; a late packet after an overflow released its gap
// does not (the buffer was short, not the hold).
func TestLearnLateBeyondCeiling(t *testing.T) {
	b, err := New[int](Config{Learn: true, MaxPackets: 4})
	if err != nil {
		t.Fatal(err)
	}
	b.SetHold(4 * time.Millisecond)
	out := b.Push(0, 0, 100, 0, nil)
	// Packet 2 waits for 1; the timeout gives 1 up after the 4 ms hold (Expire at 5 ms).
	out = b.Push(1*ms, 2, 100, 2, out[:0])
	out = b.Expire(5*ms, out[:0])
	if len(out) != 1 || b.Stats().Timeouts != 1 {
		t.Fatalf("timeout: out %v, stats %+v", out, b.Stats())
	}
	// 1 comes 7 ms after the give-up: it needed 4 + 7 = 11 ms.
	out = b.Push(12*ms, 1, 100, 1, out[:0])
	if len(out) != 1 || b.Stats().Late != 1 {
		t.Fatalf("late packet: out %v, stats %+v", out, b.Stats())
	}
	want := time.Duration(11*ms*5/4) + holdMargin
	if h := b.Hold(); h < want-100*time.Microsecond || h > want+100*time.Microsecond {
		t.Errorf("hold %v after a packet 7 ms later than a 4 ms hold allowed, want about %v", h, want)
	}
	// SetHold (the tunnel calls it every tick) keeps the raise.
	b.SetHold(4 * time.Millisecond)
	if h := b.Hold(); h < want-100*time.Microsecond {
		t.Errorf("hold %v after SetHold, want the raise (%v) kept", h, want)
	}
	// Ten half-lives later the hold is back within the ceiling.
	b.Expire(12*ms+10*int64(learnHalfLife), nil)
	if h := b.Hold(); h > 4*time.Millisecond {
		t.Errorf("hold %v ten half-lives on, want at most the ceiling 4ms", h)
	}
	// An overflow gives up a gap: a late packet after it counts only the ceiling.
	now := 12*ms + 10*int64(learnHalfLife)
	next := uint32(3)
	for i := range uint32(6) {
		out = b.Push(now, next+1+i, 100, 0, out[:0])
	}
	if b.Stats().Overflows == 0 {
		t.Fatalf("no overflow: stats %+v", b.Stats())
	}
	out = b.Push(now+50*ms, next, 100, 0, out[:0])
	if len(out) != 1 || b.Stats().Late != 2 {
		t.Fatalf("late packet after the overflow: out %v, stats %+v", out, b.Stats())
	}
	if h := b.Hold(); h != 4*time.Millisecond {
		t.Errorf("hold %v after a late packet of an overflow, want the ceiling 4ms", h)
	}
}

// A resend (PushResent) that comes after its gap was given up on is delivered late like any
// packet. Without a floor (the tunnel does not wait for resends: they cannot come within the
// longest hold) it leaves the learnt hold where the reordering put it; a plain late packet in
// the same place raises the hold (TestLearnHoldFollowsReordering). With a floor (resends can
// come in time) a late resend teaches like any late packet.
func TestLearnIgnoresResends(t *testing.T) {
	for _, floor := range []time.Duration{0, 2 * time.Millisecond} {
		b, err := New[int](Config{Learn: true})
		if err != nil {
			t.Fatal(err)
		}
		b.SetFloor(floor)
		b.SetHold(100 * time.Millisecond)
		out, seq, now := shortGaps(t, b) // the hold settles near 3.5 ms
		settled := b.Hold()
		if settled > 5*time.Millisecond {
			t.Fatalf("floor %v: hold %v after gaps that needed 2 ms, want about 3.5 ms", floor, settled)
		}
		// A loss: the gap is given up after the short hold, and the resend comes a round
		// trip (120 ms) later.
		out = giveUp(t, b, out, seq, now)
		out = b.PushResent(now+120*ms, seq, 100, 0, out[:0])
		if len(out) != 1 || b.Stats().Late != 1 {
			t.Fatalf("floor %v: late resend: out %v, stats %+v", floor, out, b.Stats())
		}
		switch h := b.Hold(); {
		case floor == 0 && h > settled+time.Millisecond:
			t.Errorf("without a floor: hold %v after a late resend, want it left near %v", h, settled)
		case floor > 0 && h != 100*time.Millisecond:
			t.Errorf("with a floor: hold %v after a late resend, want the ceiling back", h)
		}
	}
}

// After a stall, resends (PushResent) fill the stalled path's gaps, and then the path brings its
// originals: a run of look-alikes of consecutive numbers, all duplicates. None is delivered
// (taken as a restarted peer, the third of them was).
func TestResentOriginalsAreDuplicates(t *testing.T) {
	b, err := New[int](Config{Learn: true})
	if err != nil {
		t.Fatal(err)
	}
	b.SetHold(100 * time.Millisecond)
	out := b.Push(0, 0, 100, 0, nil)
	out = b.Push(1*ms, 9, 100, 9, out[:0]) // 1..8 stalled on a slow path
	var got []int
	for seq := uint32(1); seq <= 8; seq++ {
		got = append(got, b.PushResent(2*ms, seq, 100, int(seq), out[:0])...)
	}
	if len(got) != 9 || got[8] != 9 {
		t.Fatalf("resends delivered %v, want 1..9 in order", got)
	}
	for seq := uint32(1); seq <= 8; seq++ {
		if out = b.Push(50*ms, seq, 100, 100+int(seq), out[:0]); len(out) != 0 {
			t.Fatalf("the original of resent %d was delivered: %v (stats %+v)", seq, out, b.Stats())
		}
	}
	if st := b.Stats(); st.Duplicates != 8 || st.Resets != 0 {
		t.Errorf("stats %+v, want 8 duplicates and no reset", st)
	}
}

// The other order: a stalled path's originals come first (late, their gaps given up), then the
// resends of them, in a row. Every resend is a duplicate.
func TestResendsAfterOriginalsAreDuplicates(t *testing.T) {
	b, err := New[int](Config{Learn: true})
	if err != nil {
		t.Fatal(err)
	}
	b.SetHold(10 * time.Millisecond)
	out := b.Push(0, 0, 100, 0, nil)
	out = b.Push(1*ms, 9, 100, 9, out[:0])
	if out = b.Expire(20*ms, out[:0]); len(out) != 1 || b.Stats().Lost != 8 {
		t.Fatalf("the gap 1..8 was not given up: out %v, stats %+v", out, b.Stats())
	}
	for seq := uint32(1); seq <= 8; seq++ {
		if out = b.Push(30*ms, seq, 100, int(seq), out[:0]); len(out) != 1 {
			t.Fatalf("original %d not delivered late: %v", seq, out)
		}
	}
	for seq := uint32(1); seq <= 8; seq++ {
		if out = b.PushResent(40*ms, seq, 100, 100+int(seq), out[:0]); len(out) != 0 {
			t.Fatalf("the resend of %d was delivered after its original: %v (stats %+v)", seq, out, b.Stats())
		}
	}
	if st := b.Stats(); st.Duplicates != 8 || st.Resets != 0 {
		t.Errorf("stats %+v, want 8 duplicates and no reset", st)
	}
}
