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
}

type pacedState struct {
	id      int
	tokens  float64 // bytes
	last    int64   // ns of the last refill
	deficit float64 // bytes
	rate    float64 // bytes per ns
	burst   float64 // bytes
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
		capacity := paths[i].PaceRate
		if !(capacity > 0) || math.IsInf(capacity, 0) {
			capacity = paths[i].Capacity
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
		if b := paths[i].Uplink; b != nil {
			b.refill(now, s.cfg)
		}
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
