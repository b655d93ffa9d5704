package tunnel

// sendHistory remembers a path's send counters over the last second or two, so that a
// capacity sample can compare what the peer delivered over a window with what was sent for
// that window: the packets the peer received over its window left about one round trip
// before the feedback that reports them. Compared with what was sent over the same clock
// window, a path whose traffic grows (the slower of two, offered more as the flow inside
// grows into it; a path coming out of an idle spell) looks as if it had lost or queued what is
// merely still on its way: on a path of 50 ms one way, sampled every 100 ms in start-up,
// about half of a window's growth.
type sendHistory struct {
	at          [histLen]int64
	bytes, pkts [histLen]uint64
	n, next     int // entries filled, and the slot the next one goes to
}

// histLen entries at least histStep apart cover 2.5 s: a round trip of two seconds (a
// cellular link's queue under load) plus a capacity window. A lookup older than the oldest
// entry takes the oldest.
const (
	histLen  = 128
	histStep = int64(20e6) // 20 ms
)

// record notes the counters at now, unless the last entry is less than histStep old.
func (h *sendHistory) record(now int64, bytes, pkts uint64) {
	if h.n > 0 && now-h.at[(h.next+histLen-1)%histLen] < histStep {
		return
	}
	h.at[h.next], h.bytes[h.next], h.pkts[h.next] = now, bytes, pkts
	h.next = (h.next + 1) % histLen
	h.n = min(h.n+1, histLen)
}

// countersAt returns the counters as they were at time x, interpolated between the entries
// around it (the newest point is now, with the counters cur): the oldest entry when x is
// older than every entry, cur when x is not before now.
func (h *sendHistory) countersAt(x, now int64, curBytes, curPkts uint64) (bytes, pkts float64) {
	tb, tp, ta := float64(curBytes), float64(curPkts), now // the point after the one looked at
	if x >= now {
		return tb, tp
	}
	for k := 1; k <= h.n; k++ {
		i := (h.next - k + histLen) % histLen
		b, p, a := float64(h.bytes[i]), float64(h.pkts[i]), h.at[i]
		if a <= x {
			if ta <= a {
				return b, p
			}
			f := float64(x-a) / float64(ta-a)
			return b + f*(tb-b), p + f*(tp-p)
		}
		tb, tp, ta = b, p, a
	}
	return tb, tp
}
