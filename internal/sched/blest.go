package sched

import (
	"math"
	"time"
)

// BLEST is the blocking-estimation scheduler (Ferlin et al., IFIP Networking 2016): when the
// MinRTT choice s is not the fastest path f (f's window is full), it estimates how much f
// could send while s's packet is in flight and sends on s only if that much would still fit
// in the receiver's window beside s's data; otherwise it sends nothing and waits for f.
//
// For a packet on s: q = its in-flight packets + 1; s's linger time is
// T = max(srtt_s, q ≥ cwnd_s ? max_srtt_s : min_srtt_s + (max_srtt_s − min_srtt_s)·q/cwnd_s);
// f gets n = T/((min_srtt_f + max_srtt_f)/2) + 1 rounds, in which congestion avoidance sends
// (cwnd_f + (n−1)/2)·n packets; scaled by λ and f's MSS that is fast_bytes. s is used when
// fast_bytes ≤ Avail − (size + InFlight_s). λ starts at 1.2 within [1.0, 1.3] and moves at
// most once per min_srtt_s: +0.04 if the window blocked the sender since the last move
// (Conn.Avail below one packet), −0.01 otherwise. The running min and max SRTT of each path
// are kept here (keyed by Path.ID). Without a known Avail BLEST is MinRTT.
type BLEST struct {
	MinWindow int // as MinRTT's
	lambda    float64
	lastMove  int64
	blocked   bool
	rtts      rttRanges
}

// Pick implements Scheduler for an unbounded receiver: MinRTT.
func (b *BLEST) Pick(now int64, paths []Path, size int) (int, bool) {
	return b.PickConn(now, Conn{}, paths, size)
}

// PickConn implements ConnScheduler.
func (b *BLEST) PickConn(now int64, c Conn, paths []Path, size int) (int, bool) {
	b.rtts.observe(paths)
	if b.lambda == 0 {
		b.lambda = 1.2
	}
	if c.AvailKnown && c.Avail < size {
		b.blocked = true
	}
	s := minRTTPick(paths, b.MinWindow, nil)
	if s < 0 {
		return 0, false
	}
	f := fastest(paths)
	if f < 0 || f == s || !c.AvailKnown || paths[s].SRTT <= 0 {
		return s, true
	}
	ps, pf := &paths[s], &paths[f]
	rs, rf := b.rtts.get(ps.ID), b.rtts.get(pf.ID)
	if rs.min > 0 && now-b.lastMove >= int64(rs.min) {
		if b.blocked {
			b.lambda = min(b.lambda+0.04, 1.3)
		} else {
			b.lambda = max(b.lambda-0.01, 1.0)
		}
		b.blocked, b.lastMove = false, now
	}
	mw := minWindow(b.MinWindow)
	mssS, mssF := float64(ps.mss()), float64(pf.mss())
	cwndS := packetsIn(ps, mw)
	q := float64(ps.InFlight)/mssS + 1
	var linger float64
	if q >= cwndS {
		linger = rs.max.Seconds()
	} else {
		linger = rs.min.Seconds() + (rs.max-rs.min).Seconds()*q/cwndS
	}
	linger = max(linger, ps.SRTT.Seconds())
	avgF := (rf.min + rf.max).Seconds() / 2
	if avgF <= 0 {
		avgF = pf.SRTT.Seconds()
	}
	n := math.Floor(linger/avgF) + 1
	cwndF := packetsIn(pf, mw)
	fastBytes := (cwndF + (n-1)/2) * n * mssF * b.lambda
	avail := max(0, float64(c.Avail-size-ps.InFlight))
	if fastBytes > avail {
		return 0, false
	}
	return s, true
}

// Lambda returns the current scaling factor.
func (b *BLEST) Lambda() float64 { return b.lambda }

// packetsIn is p's window in packets; an unbounded window counts as what is in flight (at
// least the minimum window), which is what the path has shown it carries.
func packetsIn(p *Path, minWin float64) float64 {
	w := pathWindow(p, minWin)
	if math.IsInf(w, 0) {
		w = max(float64(p.InFlight), minWin)
	}
	return max(w/float64(p.mss()), 1)
}

// fastest is the Up, non-backup path with the lowest known SRTT; -1 if none.
func fastest(paths []Path) int {
	f := -1
	for i := range paths {
		p := &paths[i]
		if !p.Up || p.Backup || p.SRTT <= 0 {
			continue
		}
		if f < 0 || p.SRTT < paths[f].SRTT {
			f = i
		}
	}
	return f
}

// rttRanges keeps each path's running minimum and maximum SRTT, keyed by Path.ID. Paths no
// longer listed are dropped when the list changes.
type rttRanges struct {
	r []rttRange
}

type rttRange struct {
	id       int
	min, max time.Duration
}

func (t *rttRanges) observe(paths []Path) {
	same := len(paths) == len(t.r)
	for i := 0; same && i < len(paths); i++ {
		same = t.r[i].id == paths[i].ID
	}
	if !same {
		old := t.r
		t.r = make([]rttRange, len(paths))
		for i := range paths {
			t.r[i].id = paths[i].ID
			for _, o := range old {
				if o.id == paths[i].ID {
					t.r[i] = o
				}
			}
		}
	}
	for i := range paths {
		s := paths[i].SRTT
		if s <= 0 {
			continue
		}
		r := &t.r[i]
		if r.min == 0 || s < r.min {
			r.min = s
		}
		r.max = max(r.max, s)
	}
}

func (t *rttRanges) get(id int) rttRange {
	for _, r := range t.r {
		if r.id == id {
			return r
		}
	}
	return rttRange{}
}
