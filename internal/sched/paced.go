package sched

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrPacedConfig is returned by PacedConfig.Validate.
var ErrPacedConfig = errors.New("sched: invalid paced config")

// PacedConfig tunes Paced. Zero fields take the values of Defaults.
type PacedConfig struct {
	// DefaultCapacity, in bit/s, stands in for a path whose Capacity is 0 (unknown). Pacing
	// needs a rate; 100 Mbit/s is a modest guess that the capacity estimator soon replaces.
	// glorytun instead never uses a path without a rate, which chokes mis-configured tunnels.
	DefaultCapacity float64
	// BurstTime and MinBurst size each path's bucket: the larger of BurstTime at the path's
	// rate and MinBurst bytes. The bucket must hold a TSO/GRO batch (64 KiB) or the sender
	// could never hand the socket a full batch; beyond that, the bigger the bucket the more a
	// shaped link's queue fills, so 2 ms worth.
	BurstTime time.Duration
	MinBurst  int
}

// Defaults returns c with zero fields set: 100 Mbit/s, 2 ms, 64 KiB.
func (c PacedConfig) Defaults() PacedConfig {
	if c.DefaultCapacity == 0 {
		c.DefaultCapacity = 100e6
	}
	if c.BurstTime == 0 {
		c.BurstTime = 2 * time.Millisecond
	}
	if c.MinBurst == 0 {
		c.MinBurst = 64 << 10
	}
	return c
}

// Validate reports whether c (after Defaults) is usable.
func (c PacedConfig) Validate() error {
	if !(c.DefaultCapacity > 0) || math.IsInf(c.DefaultCapacity, 0) {
		return fmt.Errorf("%w: DefaultCapacity %v", ErrPacedConfig, c.DefaultCapacity)
	}
	if c.BurstTime < 0 || c.MinBurst < 1 {
		return fmt.Errorf("%w: BurstTime %v, MinBurst %d", ErrPacedConfig, c.BurstTime, c.MinBurst)
	}
	return nil
}

// Paced is the default scheduler. Each path has a token bucket refilled at its PaceRate (else
// its Capacity, else DefaultCapacity) holding at most one burst, so over any interval of length t
// a path is sent at most burst + Capacity·t: a shaped link never builds a standing queue and
// never drops for lack of pacing. Among the Up paths whose bucket holds the packet, the one
// with the largest deficit is chosen: the deficit is smooth weighted round robin counted in
// bytes, each send adding size × share/Σshare to every Up path and taking size from the
// chosen one, with share = Weight, else Capacity, else DefaultCapacity. So below capacity the
// traffic splits in proportion to the shares (unequal paths aggregate instead of the fast
// path carrying everything), and at capacity the buckets decide and each path carries its
// rate. Deficits are clamped to ±one burst so that a path held back by its bucket does not
// build up a claim it would later spend in one go; a path that is down has its deficit reset.
//
// Paths that leave by one uplink also draw from the uplink's shared Bucket (Path.Uplink): a
// path's own rate is what the path can carry (configured, or measured end to end), and the
// uplink's bucket keeps the paths on it, together, within the uplink's capacity. Without it
// two paths on a 100 Mbit/s uplink, each paced at 100 Mbit/s, would feed the uplink 200.
//
// When no bucket holds the packet, Next reports the path whose buckets fill first and when.
type Paced struct {
	cfg     PacedConfig
	st      []pacedState // parallel to the last paths slice
	scratch []pacedState
	// Plan's run: the ID of the path the last packet sent now went on, and the bytes it has
	// been given in a row.
	runID    int
	runBytes float64
	running  bool
}

type pacedState struct {
	id      int
	tokens  float64 // bytes
	last    int64   // ns of the last refill
	deficit float64 // bytes
	rate    float64 // bytes per ns
	burst   float64 // bytes

	// Plan's walk: virtual tokens of the path and of its uplink's bucket (kept on ushare, the
	// first path on that uplink), its one-way delay in ns, and whether it can send now.
	vtokens, vutokens float64
	ushare            int
	owd               float64
	later             bool
	vflight           float64 // bytes in flight after the packets given so far
	vstart            int64   // when the path could send the packet being placed
	varrive           float64 // and when it would arrive
	// idle: Plan's last walk left the path a packet's worth of tokens that no packet took
	// (the queue held nothing more for it); the tokens it earns until the next walk are then
	// capped at idleBurst rather than the bucket.
	idle bool
}

// NewPaced returns a Paced scheduler; zero fields of c take their defaults.
func NewPaced(c PacedConfig) (*Paced, error) {
	c = c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &Paced{cfg: c}, nil
}

// Pick implements Scheduler: Next, if the packet may go now. ok is false when no path is Up
// and also when every Up path is over its rate; use Next to learn when to try again.
func (s *Paced) Pick(now int64, paths []Path, size int) (int, bool) {
	i, at, ok := s.Next(now, paths, size)
	if !ok || at > now {
		return 0, false
	}
	return i, true
}

// Next chooses the path for a packet of size bytes and the time at which it may be sent. If
// at <= now the packet is taken as sent on that path (tokens and deficits are charged); if
// at > now nothing is charged and the caller should call again at at. ok is false when no
// path is Up.
func (s *Paced) Next(now int64, paths []Path, size int) (index int, at int64, ok bool) {
	s.sync(now, paths)
	size = max(size, 0)
	total := 0.0
	for i := range paths {
		st := &s.st[i]
		if !paths[i].Up {
			st.deficit = 0
			continue
		}
		s.refill(now, &paths[i], st)
		total += share(&paths[i], s.cfg.DefaultCapacity)
	}
	if total == 0 {
		return 0, 0, false
	}
	best, soonest := -1, -1
	var bestScore float64
	var soonestAt int64
	for i := range paths {
		if !paths[i].Up {
			continue
		}
		st := &s.st[i]
		// A packet bigger than the bucket waits for a full bucket and leaves it in debt.
		need := min(float64(size), st.burst)
		b := paths[i].Uplink
		if st.tokens+1e-6 >= need && b.holds(size) {
			score := st.deficit + float64(size)*share(&paths[i], s.cfg.DefaultCapacity)/total
			if best < 0 || score > bestScore {
				best, bestScore = i, score
			}
			continue
		}
		t := now
		if st.tokens+1e-6 < need {
			t += int64(math.Ceil((need - st.tokens) / st.rate))
		}
		t = max(t, b.readyAt(now, size))
		if soonest < 0 || t < soonestAt || (t == soonestAt && st.deficit > s.st[soonest].deficit) {
			soonest, soonestAt = i, t
		}
	}
	if best < 0 {
		return soonest, soonestAt, true
	}
	for i := range paths {
		if !paths[i].Up {
			continue
		}
		st := &s.st[i]
		st.deficit += float64(size) * share(&paths[i], s.cfg.DefaultCapacity) / total
		if i == best {
			st.deficit -= float64(size)
			st.tokens -= float64(size)
			if b := paths[i].Uplink; b.limits() {
				b.tokens -= float64(size)
			}
		}
		st.deficit = min(max(st.deficit, -st.burst), st.burst)
	}
	return best, now, true
}

// refill sets an Up path's rate (PaceRate, else Capacity, else DefaultCapacity, in bytes per
// ns) and burst, and adds the tokens it earned since its last refill, and its uplink's.
func (s *Paced) refill(now int64, p *Path, st *pacedState) {
	capacity := p.PaceRate
	if !(capacity > 0) || math.IsInf(capacity, 0) {
		capacity = p.Capacity
	}
	if !(capacity > 0) || math.IsInf(capacity, 0) {
		capacity = s.cfg.DefaultCapacity
	}
	st.rate = capacity / 8 / 1e9
	st.burst = max(st.rate*float64(s.cfg.BurstTime), float64(s.cfg.MinBurst))
	if now > st.last {
		st.tokens += float64(now-st.last) * st.rate
		st.last = now
	}
	st.tokens = min(st.tokens, st.burst)
	if st.idle {
		st.tokens = min(st.tokens, idleBurst(s.cfg, st.rate, p.MinRTT))
	}
	if b := p.Uplink; b != nil {
		b.refill(now, s.cfg)
	}
}

// idleBurst is the most a path paced at rate bytes per ns, with base round trip minRTT, banks
// while the queue has nothing for it (BurstTime at its rate being the least): MinBurst, but no
// more than a quarter of its bandwidth-delay product once the round trip is known.
//
// The bucket holds MinBurst (64 KiB, 10 ms at 50 Mbit/s) so that a device reader woken a few
// ms late sends what it owes the path at once and keeps the path's rate: with a 2.6 ms bucket
// on a busy host, a 50 Mbit/s path's estimate stayed at 36-42 Mbit/s (its probes never
// reached their rate). But a bucket refilled while the traffic inside paused is a burst the
// path never owed: a link's queue is often about one bandwidth-delay product (a modem's 64
// packets: 15 ms at 50 Mbit/s), and 64 KiB sent at once on top of the 16 KB it held
// overflowed it; the losses, resent on the same path into the same full queue, reached the
// flow inside, whose window then stayed short of where the slower path is used
// (docs/scheduling.md, "Bursts into a short queue").
func idleBurst(c PacedConfig, rate float64, minRTT time.Duration) float64 {
	b := float64(c.MinBurst)
	if minRTT > 0 && minRTT <= time.Minute && rate > 0 {
		b = min(b, max(rate*float64(minRTT)/4, minBurstPackets*DefaultMSS))
	}
	return max(b, rate*float64(c.BurstTime))
}

// minBurstPackets is the least a path banks while idle: a few full packets.
const minBurstPackets = 4

// sync lines the per-path state up with paths, matching by ID. A path seen for the first
// time starts with a full bucket (set on its first refill); state of paths no longer listed
// is dropped.
func (s *Paced) sync(now int64, paths []Path) {
	same := len(paths) == len(s.st)
	for i := 0; same && i < len(paths); i++ {
		same = s.st[i].id == paths[i].ID
	}
	if same {
		return
	}
	s.scratch = s.scratch[:0]
	for i := range paths {
		st := pacedState{id: paths[i].ID, tokens: math.Inf(1), last: now}
		for _, old := range s.st {
			if old.id == paths[i].ID {
				st = old
				break
			}
		}
		s.scratch = append(s.scratch, st)
	}
	s.st, s.scratch = s.scratch, s.st
}

// Bucket is the token bucket of one uplink, shared by the Paced schedulers of every path that
// leaves by it (Path.Uplink). Its owner sets Rate, the uplink's capacity in bit/s counted in
// IP bytes on the wire; the burst follows the scheduler that refills it: the larger of
// BurstTime at Rate and MinBurst, like a path's. A Bucket starts full.
//
// A Bucket has no lock: every scheduler that shares it must be called from one goroutine (the
// tunnel's device reader is the only caller of its schedulers). A Rate of 0 or less, or a nil
// Bucket, limits nothing.
type Bucket struct {
	Rate float64 // bit/s

	tokens  float64 // bytes
	burst   float64 // bytes
	rate    float64 // bytes per ns, from Rate at the last refill
	last    int64   // ns of the last refill
	started bool
}

// NewBucket returns a full bucket for an uplink of rate bit/s.
func NewBucket(rate float64) *Bucket { return &Bucket{Rate: rate} }

// Tokens returns the bytes the bucket held at its last refill.
func (b *Bucket) Tokens() float64 { return b.tokens }

func (b *Bucket) limits() bool { return b != nil && b.Rate > 0 && !math.IsInf(b.Rate, 0) }

// refill adds the tokens earned since the last refill; calling it again at the same time
// changes nothing, so each scheduler that shares the bucket may refill it.
func (b *Bucket) refill(now int64, c PacedConfig) {
	if !b.limits() {
		return
	}
	b.rate = b.Rate / 8 / 1e9
	b.burst = max(b.rate*float64(c.BurstTime), float64(c.MinBurst))
	if !b.started {
		b.tokens, b.last, b.started = b.burst, now, true
	}
	if now > b.last {
		b.tokens += float64(now-b.last) * b.rate
		b.last = now
	}
	b.tokens = min(b.tokens, b.burst)
}

// holds reports whether the bucket lets a packet of size bytes go now (refilled).
func (b *Bucket) holds(size int) bool {
	return !b.limits() || b.tokens+1e-6 >= min(float64(size), b.burst)
}

// readyAt is when the bucket will hold a packet of size bytes: now if it does.
func (b *Bucket) readyAt(now int64, size int) int64 {
	if b.holds(size) {
		return now
	}
	return now + int64(math.Ceil((min(float64(size), b.burst)-b.tokens)/b.rate))
}

// Plan is Paced's queue scheduler, earliest arrival first: the packets waiting to be sent,
// whose wire sizes are sizes in the order the receiver must see them, are given, in that
// order, to the path by which each would arrive first, counting what the packets ahead of it
// already take of each path: a packet of size bytes given to path i leaves when i's bucket
// (and its uplink's) holds it, after those ahead of it on i, and arrives a one-way delay later
// (MinRTT/2, else SRTT/2; the bucket's time at the path's rate breaks ties towards the faster
// path). So a slower path is given only packets that arrive no later than they would by the
// faster ones: while the fast path keeps up it carries everything, and the slow one takes
// from further down the queue the packets the fast one would deliver after the slow one's
// delay. The inner flow then sees its packets arrive in order at about the fast path's delay,
// never a fast packet held behind a slow one, so adding a path never slows it below the fast
// path alone (docs/scheduling.md, "Unequal paths").
//
// A path with a CWnd takes data only while its InFlight (plus what the walk gives it) stays
// within it: the tunnel sets one on paths whose capacity is measured, so that the estimator's
// probing above an unknown rate overfills the path's queue by at most a window.
//
// out[k] is set for every packet: the index of the path to send it on now, its tokens
// charged, or -1 when it stays queued. wake is the earliest time a packet that stays could
// leave if the queue did not change (0 when none stays); ok is false when no path is Up.
// Paths that can send now and deliver within planSlack of the earliest arrival count as equal:
// among them the packet goes by the deficit of Next (shares by Weight, else Capacity), so equal
// paths share the traffic as they do under Next. Plan does not allocate once it has seen the
// largest path set it will be given.
func (s *Paced) Plan(now int64, paths []Path, sizes []int, out []int) (wake int64, ok bool) {
	s.sync(now, paths)
	up := 0
	for i := range paths {
		st := &s.st[i]
		if !paths[i].Up {
			st.deficit = 0
			continue
		}
		up++
		s.refill(now, &paths[i], st)
		// The virtual state of the walk: tokens after the packets given so far, with what
		// is given to a path beyond its bucket as debt.
		st.vtokens = st.tokens
		st.owd = oneWay(&paths[i])
		st.vflight = float64(paths[i].InFlight)
	}
	if up == 0 {
		for k := range out[:len(sizes)] {
			out[k] = -1
		}
		return 0, false
	}
	// Uplink buckets are shared: their virtual tokens live on the first path that names them.
	for i := range paths {
		if b := paths[i].Uplink; paths[i].Up && b.limits() {
			s.st[i].ushare = s.uplinkOwner(paths, i)
			if s.st[i].ushare == i {
				s.st[i].vutokens = b.tokens
			}
		}
	}
	pending := up // paths that may still send now
	for i := range paths {
		s.st[i].later = !paths[i].Up
	}
	total := 0.0
	for i := range paths {
		if paths[i].Up {
			total += share(&paths[i], s.cfg.DefaultCapacity)
		}
	}
	for k, size := range sizes {
		if pending == 0 {
			out[k] = -1
			continue
		}
		size = max(size, 0)
		// The earliest arrival, and among the paths that can send now and deliver within
		// planSlack of it, the one furthest behind its share: paths of about equal delay split
		// the traffic by their shares, as Next does, and a slower one waits its turn.
		best, bestStart := -1, int64(0)
		var bestArrive float64
		for i := range paths {
			if !paths[i].Up {
				continue
			}
			st := &s.st[i]
			st.vstart = s.startAt(now, paths, i, size)
			st.varrive = float64(st.vstart) + st.owd + float64(size)/st.rate
			if best < 0 || st.varrive < bestArrive {
				best, bestStart, bestArrive = i, st.vstart, st.varrive
			}
		}
		var bestScore float64
		chosen, run := -1, -1
		for i := range paths {
			st := &s.st[i]
			if !paths[i].Up || st.vstart > now || st.varrive > bestArrive+float64(planSlack) {
				continue
			}
			if score := st.deficit + float64(size)*share(&paths[i], s.cfg.DefaultCapacity)/total; chosen < 0 || score > bestScore {
				chosen, bestScore = i, score
			}
			if s.running && paths[i].ID == s.runID && s.runBytes+float64(size) <= min(maxRun, st.rate*float64(runTime)) {
				run = i
			}
		}
		// The path of the packet before keeps the next ones until its run is full:
		// consecutive packets then leave together, in one send of the path's batch, and
		// arrive together, in one receive, in order (see runTime).
		if run >= 0 {
			chosen = run
		}
		// No path of about the earliest arrival can send now: a path whose capacity is still
		// the guess takes the packet if it can send it now. A path is measured only by what
		// it carries, and by arrival time alone a slower one is given data only once the
		// faster ones' queue is deeper than the difference of the delays, which a flow whose
		// window was cut in its start-up may not reach for many seconds; until it is
		// measured, the path's start-up window bounds what it takes (docs/scheduling.md,
		// "A path is measured from the first flow").
		if chosen < 0 && bestStart > now {
			for i := range paths {
				if paths[i].Up && paths[i].Unmeasured && s.st[i].vstart <= now {
					chosen = i
					break
				}
			}
		}
		if chosen >= 0 {
			best, bestStart = chosen, now
		}
		st := &s.st[best]
		st.vtokens -= float64(size)
		st.vflight += float64(size)
		lim := paths[best].Uplink.limits()
		if lim {
			s.st[st.ushare].vutokens -= float64(size)
		}
		if bestStart <= now {
			out[k] = best
			if s.running && s.runID == paths[best].ID && best == run {
				s.runBytes += float64(size)
			} else {
				s.runID, s.runBytes, s.running = paths[best].ID, float64(size), true
			}
			st.tokens -= float64(size)
			if lim {
				paths[best].Uplink.tokens -= float64(size)
			}
			for i := range paths {
				if !paths[i].Up {
					continue
				}
				d := &s.st[i]
				d.deficit += float64(size) * share(&paths[i], s.cfg.DefaultCapacity) / total
				if i == best {
					d.deficit -= float64(size)
				}
				d.deficit = min(max(d.deficit, -d.burst), d.burst)
			}
			continue
		}
		out[k] = -1
		if wake == 0 || bestStart < wake {
			wake = bestStart
		}
		// Once no path can take a packet now, none of the rest goes now either.
		if !st.later {
			st.later = true
			pending--
		}
		for i := range paths {
			if !s.st[i].later && s.startAt(now, paths, i, DefaultMSS) > now {
				s.st[i].later = true
				pending--
			}
		}
	}
	for i := range paths {
		st := &s.st[i]
		st.idle = paths[i].Up && st.tokens >= min(float64(DefaultMSS), st.burst)
	}
	if pending == 0 {
		// The rest stayed without a look: they leave no earlier than the soonest path.
		for i := range paths {
			if paths[i].Up {
				if t := s.startAt(now, paths, i, DefaultMSS); wake == 0 || t < wake {
					wake = t
				}
			}
		}
	}
	return wake, true
}

// Charge counts size bytes sent on path i of the paths Plan was last given, outside the plan
// (a copy of a sparse flow's packet): they take the path's tokens, and its uplink's, as a
// planned packet's do, as debt when the bucket is short, so that what the path is fed stays
// at its rate. Unaccounted, 1 % more than the plan on a path paced at its capacity grows the
// link's queue until the packets the plan gave the path arrive later than it planned.
func (s *Paced) Charge(paths []Path, i, size int) {
	if i < 0 || i >= len(paths) || i >= len(s.st) || !paths[i].Up {
		return
	}
	s.st[i].tokens -= float64(size)
	if b := paths[i].Uplink; b.limits() {
		b.tokens -= float64(size)
	}
}

// planSlack is how much later than by its best path a packet may arrive by a path that can send
// it now, rather than wait: the device reader comes back no sooner than a few hundred µs, and
// paths whose delays differ by less than this count as equal (they split by their shares).
const planSlack = time.Millisecond

// Runs: paths that count as equal for a packet (planSlack) share the traffic by their deficits
// in runs of consecutive packets rather than packet by packet. Split one by one, every batch
// the device reader sends would go out as one short send per path (twice the system calls per
// byte over two paths), each uplink reader would receive every other packet (so the receiver's
// reorder buffer holds half of them and its writes to the device join shorter runs), and the
// inner TCP would see a reordering at every packet whose paths differ by a few µs. A path keeps
// the packets after its last one, while it can send them now and deliver them within planSlack
// of the best, until it has been given runTime at its rate (at most maxRun bytes); then the
// deficits choose the next run's path, so the shares over time are still the deficits' (the
// runs' deficit stays within a run, inside the ±burst clamp). A packet behind another path's
// run arrives at most runTime later than it could have: within planSlack, as for any two
// paths counted equal.
const (
	maxRun  = 64 << 10
	runTime = 500 * time.Microsecond
)

// startAt is when path i's bucket, and its uplink's, hold a packet of size bytes after what the
// walk of Plan has given the path so far (the virtual tokens), and its window (CWnd, if set)
// has room for it.
func (s *Paced) startAt(now int64, paths []Path, i, size int) int64 {
	st := &s.st[i]
	need := min(float64(size), st.burst)
	t := now
	if st.vtokens+1e-6 < need {
		t += int64(math.Ceil((need - st.vtokens) / st.rate))
	}
	if w := float64(paths[i].CWnd); w > 0 && st.vflight+float64(size) > w {
		// The window opens as the data in flight arrives, at about the path's rate.
		t = max(t, now+int64(math.Ceil((st.vflight+float64(size)-w)/st.rate)))
	}
	if b := paths[i].Uplink; b.limits() {
		vt := s.st[st.ushare].vutokens
		if n := min(float64(size), b.burst); vt+1e-6 < n {
			t = max(t, now+int64(math.Ceil((n-vt)/b.rate)))
		}
	}
	return t
}

// uplinkOwner is the first Up path that leaves by path i's uplink.
func (s *Paced) uplinkOwner(paths []Path, i int) int {
	for j := range paths[:i] {
		if paths[j].Up && paths[j].Uplink == paths[i].Uplink {
			return j
		}
	}
	return i
}

// oneWay is a path's one-way delay in ns as Plan counts it: half its minimum RTT (else half its
// smoothed RTT, else 0) plus the queue its smoothed RTT shows beyond the minimum, where that is
// more than queueNoise: a path paced above what it now carries holds the excess in its queue,
// and what is sent on it arrives that much later.
func oneWay(p *Path) float64 {
	known := func(d time.Duration) bool { return d > 0 && d <= time.Minute }
	switch {
	case known(p.MinRTT) && known(p.SRTT):
		q := p.SRTT - p.MinRTT
		if q <= queueNoise {
			q = 0
		}
		return float64(p.MinRTT)/2 + float64(q)
	case known(p.MinRTT):
		return float64(p.MinRTT) / 2
	case known(p.SRTT):
		return float64(p.SRTT) / 2
	}
	return 0
}

// queueNoise is how far a smoothed RTT may stray above the minimum without counting as a
// queue: on a busy host the tunnel's own scheduling moves a short path's RTT by a few ms, and
// two equal paths would no longer share the traffic.
const queueNoise = 5 * time.Millisecond
