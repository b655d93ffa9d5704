package path

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

const (
	ms  = int64(time.Millisecond)
	sec = int64(time.Second)
)

// sim drives one Estimator against a simulated path and peer, in simulated time.
type sim struct {
	t        *testing.T
	e        *Estimator
	now      int64
	rtt      int64
	hold     int64                 // the peer's hold time before answering
	delivers func(at int64) bool   // whether the link delivers a packet arriving at at; nil: always
	drop     func(seq uint32) bool // random loss of a probe's round trip; nil: none
	data     int64                 // interval of the peer's data packets on the path, 0: idle
	nextData int64
	replies  []simReply
	peer     Feedback
	changes  []simChange
	// checkDeadlines verifies at every step that nothing is due just before NextDeadline and
	// that something is due at it.
	checkDeadlines bool
}

type simReply struct {
	at             int64
	seq, ts, holdµ uint32
	fb             Feedback
}

type simChange struct {
	at    int64
	state State
}

func newSim(t *testing.T, c Config, rtt time.Duration) *sim {
	return &sim{t: t, e: New(c, 0), rtt: int64(rtt), checkDeadlines: true}
}

func (s *sim) ok(at int64) bool { return s.delivers == nil || s.delivers(at) }

// run advances simulated time to until, handling every event on the way.
func (s *sim) run(until int64) {
	s.t.Helper()
	same := 0
	for s.now < until {
		d := s.e.NextDeadline()
		t := min(until, d)
		if len(s.replies) > 0 {
			t = min(t, s.replies[0].at)
		}
		if s.data > 0 {
			if s.nextData < s.now {
				s.nextData = s.now
			}
			t = min(t, s.nextData)
		}
		t = max(t, s.now)
		if t == s.now {
			if same++; same > 100 {
				s.t.Fatalf("t=%v: no progress, deadline %v", time.Duration(s.now), time.Duration(d))
			}
		} else {
			same = 0
		}
		if s.checkDeadlines && t == d && d > s.now+1 {
			s.checkDeadline(d)
		}
		s.now = t
		for len(s.replies) > 0 && s.replies[0].at <= s.now {
			r := s.replies[0]
			s.replies = s.replies[1:]
			s.e.OnReceive(s.now, 64)
			s.e.OnReply(s.now, r.seq, r.ts, r.holdµ, r.fb)
		}
		if s.data > 0 && s.nextData <= s.now {
			if s.ok(s.now) {
				s.e.OnReceive(s.now, 1200)
			}
			s.nextData += s.data
		}
		if seq, ts, due := s.e.NextProbe(s.now); due {
			s.e.OnSend(s.now, 64)
			if s.ok(s.now+s.rtt/2) && (s.drop == nil || !s.drop(seq)) {
				s.peer.Packets++
				s.peer.Bytes += 64
				if at := s.now + s.rtt + s.hold; s.ok(at) {
					s.replies = append(s.replies, simReply{at, seq, ts, uint32(s.hold / 1000), s.peer})
				}
			}
		}
		if s.e.Tick(s.now) {
			s.changes = append(s.changes, simChange{s.now, s.e.State()})
		}
	}
}

// checkDeadline verifies NextDeadline on copies of the Estimator: no work at d-1, work at d.
func (s *sim) checkDeadline(d int64) {
	s.t.Helper()
	before := *s.e
	lost := before.lost
	if _, _, due := before.NextProbe(d - 1); due || before.Tick(d-1) || before.lost != lost {
		s.t.Fatalf("t=%v: work before NextDeadline %v", time.Duration(s.now), time.Duration(d))
	}
	at := *s.e
	_, _, due := at.NextProbe(d)
	if changed := at.Tick(d); !due && !changed && at.lost == lost {
		s.t.Fatalf("t=%v: no work at NextDeadline %v", time.Duration(s.now), time.Duration(d))
	}
}

// firstChange returns the time of the first change to state at or after from, or -1.
func (s *sim) firstChange(from int64, state State) int64 {
	for _, c := range s.changes {
		if c.at >= from && c.state == state {
			return c.at
		}
	}
	return -1
}

func (s *sim) changesAfter(from int64) int {
	n := 0
	for _, c := range s.changes {
		if c.at > from {
			n++
		}
	}
	return n
}

// blackhole returns a link that drops every packet arriving in [from, to).
func blackhole(from, to int64) func(int64) bool {
	return func(at int64) bool { return at < from || at >= to }
}

func TestConfig(t *testing.T) {
	d := Config{}.WithDefaults()
	want := Config{ProbeInterval: 50 * time.Millisecond, FastProbeInterval: 10 * time.Millisecond, DownAfter: 250 * time.Millisecond, UpAfter: 3}
	if d != want {
		t.Fatalf("defaults %+v, want %+v", d, want)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c := (Config{ProbeInterval: time.Second, DownAfter: 5 * time.Second}).WithDefaults(); c.FastProbeInterval != 200*time.Millisecond || c.Validate() != nil {
		t.Fatalf("slow probing: %+v, %v", c, c.Validate())
	}
	if c := (Config{ProbeInterval: 5 * time.Millisecond}).WithDefaults(); c.FastProbeInterval != 4*time.Millisecond || c.Validate() != nil {
		t.Fatalf("fast probing: %+v, %v", c, c.Validate())
	}
	for _, tc := range []struct {
		name string
		c    Config
		err  error
	}{
		{"negative interval", Config{ProbeInterval: -1}, ErrProbeInterval},
		{"fast above interval", Config{ProbeInterval: 10 * time.Millisecond, FastProbeInterval: 20 * time.Millisecond}, ErrProbeInterval},
		{"fast too fast", Config{FastProbeInterval: time.Millisecond}, ErrProbeInterval},
		{"fast too fast for slow probing", Config{ProbeInterval: 2 * time.Second, FastProbeInterval: 10 * time.Millisecond, DownAfter: 10 * time.Second}, ErrProbeInterval},
		{"down after one probe", Config{DownAfter: 60 * time.Millisecond}, ErrDownAfter},
		{"negative down", Config{DownAfter: -1}, ErrDownAfter},
		{"up after negative", Config{UpAfter: -1}, ErrUpAfter},
		{"up after too many", Config{UpAfter: 65}, ErrUpAfter},
	} {
		err := tc.c.WithDefaults().Validate()
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("New with an invalid config did not panic")
		}
	}()
	New(Config{UpAfter: -1}, 0)
}

func TestIdleStaysUp(t *testing.T) {
	for _, rtt := range []time.Duration{time.Millisecond, 20 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond} {
		s := newSim(t, Config{}, rtt)
		s.run(10 * sec)
		snap := s.e.Snapshot()
		if snap.State != Up || snap.Transitions != 1 {
			t.Errorf("rtt %v: state %v after %d transitions, want up after 1", rtt, snap.State, snap.Transitions)
		}
		if d := snap.SRTT - rtt; d < -10*time.Microsecond || d > 10*time.Microsecond {
			t.Errorf("rtt %v: srtt %v", rtt, snap.SRTT)
		}
		if snap.MinRTT != rtt || snap.RTTVar > 10*time.Microsecond {
			t.Errorf("rtt %v: minrtt %v, rttvar %v", rtt, snap.MinRTT, snap.RTTVar)
		}
		// The first probes time out before the first RTT sample on a path slower than
		// 2 × ProbeInterval; after that, none may be lost.
		if rtt < 100*time.Millisecond && (snap.ProbesLost != 0 || snap.Loss != 0) {
			t.Errorf("rtt %v: %d probes lost, loss %v", rtt, snap.ProbesLost, snap.Loss)
		}
		if snap.Loss > 0.01 {
			t.Errorf("rtt %v: loss %v on a clean path", rtt, snap.Loss)
		}
		// 20 probes a second at the normal interval, plus a few while coming up.
		if snap.ProbesSent < 195 || snap.ProbesSent > 215 {
			t.Errorf("rtt %v: %d probes in 10 s", rtt, snap.ProbesSent)
		}
		up := s.firstChange(0, Up)
		if limit := int64(rtt) + 50*ms; up < 0 || up > limit {
			t.Errorf("rtt %v: up at %v, want <= %v", rtt, time.Duration(up), time.Duration(limit))
		}
	}
}

func TestBlackholeIdle(t *testing.T) {
	for _, tc := range []struct {
		name        string
		c           Config
		rtt, hold   time.Duration
		lo, hi      time.Duration // detection delay after the blackhole starts
		recoverBy   time.Duration // Up again after the blackhole ends
		expectProbe bool
	}{
		// The bound: a silent path is down within 300 ms with the defaults.
		{"defaults 20ms", Config{}, 20 * time.Millisecond, 0, 200 * time.Millisecond, 300 * time.Millisecond, 100 * time.Millisecond, true},
		{"defaults 1ms", Config{}, time.Millisecond, 0, 200 * time.Millisecond, 300 * time.Millisecond, 100 * time.Millisecond, true},
		{"defaults 100ms hold 5ms", Config{}, 100 * time.Millisecond, 5 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 180 * time.Millisecond, true},
		{"fast", Config{ProbeInterval: 10 * time.Millisecond, DownAfter: 50 * time.Millisecond}, 5 * time.Millisecond, 0, 40 * time.Millisecond, 60 * time.Millisecond, 40 * time.Millisecond, true},
		{"slow", Config{ProbeInterval: time.Second, DownAfter: 3 * time.Second, UpAfter: 2}, 20 * time.Millisecond, 0, 2 * time.Second, 3*time.Second + time.Second, 1300 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from, to := 10*sec, 20*sec
			s := newSim(t, tc.c, tc.rtt)
			s.hold = int64(tc.hold)
			s.delivers = blackhole(from, to)
			s.run(30 * sec)
			down := s.firstChange(from, Down)
			if d := time.Duration(down - from); down < 0 || d < tc.lo || d > tc.hi {
				t.Errorf("down %v after the blackhole, want %v..%v", d, tc.lo, tc.hi)
			}
			up := s.firstChange(to, Up)
			if d := time.Duration(up - to); up < 0 || d > tc.recoverBy {
				t.Errorf("up %v after the blackhole ended, want <= %v", d, tc.recoverBy)
			}
			t.Logf("down %v after the blackhole began, up %v after it ended", time.Duration(down-from), time.Duration(up-to))
			if n := len(s.changes); n != 3 {
				t.Errorf("%d transitions %v, want 3", n, s.changes)
			}
			snap := s.e.Snapshot()
			if snap.State != Up || snap.Since != up || snap.Transitions != 3 {
				t.Errorf("snapshot %+v", snap)
			}
			if snap.ProbesLost == 0 {
				t.Error("no probes lost in a blackhole")
			}
		})
	}
}

// The numbers: idle path, blackhole at t = 1 s, Down within 350 ms.
func TestBlackholeAtOneSecond(t *testing.T) {
	s := newSim(t, Config{}, 20*time.Millisecond)
	s.delivers = blackhole(sec, math.MaxInt64)
	s.run(3 * sec)
	down := s.firstChange(sec, Down)
	if down < 0 || down-sec > 350*ms {
		t.Fatalf("down at %v, want <= 1.35 s", time.Duration(down))
	}
	// A down path is still probed at ProbeInterval, to notice recovery.
	before := s.e.Snapshot().ProbesSent
	s.run(4 * sec)
	if n := s.e.Snapshot().ProbesSent - before; n != 20 {
		t.Errorf("%d probes in 1 s while down, want 20", n)
	}
}

func TestDataKeepsPathUp(t *testing.T) {
	s := newSim(t, Config{}, 20*time.Millisecond)
	s.run(sec)
	s.data = 5 * ms
	s.drop = func(seq uint32) bool { return s.now >= sec } // probes die, data arrives
	s.run(10 * sec)
	snap := s.e.Snapshot()
	if snap.State != Up || snap.Transitions != 1 {
		t.Fatalf("state %v after %d transitions, want up after 1", snap.State, snap.Transitions)
	}
	if snap.Loss < 0.99 {
		t.Errorf("loss %v with every probe lost", snap.Loss)
	}
	if snap.ProbesSent > 215 {
		t.Errorf("%d probes in 10 s: data should keep probing at the normal rate", snap.ProbesSent)
	}
	// When the data stops too, the path goes down DownAfter after the last packet.
	s.data = 0
	s.run(11 * sec)
	down := s.firstChange(10*sec, Down)
	if down < 0 || down-10*sec > 300*ms {
		t.Errorf("down at %v after data stopped at 10 s", time.Duration(down))
	}
	// Data alone does not bring it back: it proves only one direction.
	s.data = 5 * ms
	s.run(12 * sec)
	if st := s.e.State(); st != Down {
		t.Errorf("state %v with data but no probe replies, want down", st)
	}
	s.drop = nil
	s.run(12*sec + 100*ms)
	if st := s.e.State(); st != Up {
		t.Errorf("state %v after probes answered again, want up", st)
	}
}

func TestLossyPathStaysUp(t *testing.T) {
	s := newSim(t, Config{}, 10*time.Millisecond)
	s.run(sec)
	if s.e.State() != Up {
		t.Fatal("not up")
	}
	s.drop = func(seq uint32) bool { return seq%2 == 1 }
	s.run(61 * sec)
	snap := s.e.Snapshot()
	if snap.State != Up || snap.Transitions != 1 {
		t.Fatalf("state %v after %d transitions, want up after 1", snap.State, snap.Transitions)
	}
	if snap.Loss < 0.4 || snap.Loss > 0.6 {
		t.Errorf("loss %v, want about 0.5", snap.Loss)
	}
	// Half the probes answered is not UpAfter in a row: a lossy path that went down stays
	// down until it answers properly.
	s.delivers = blackhole(61*sec, 62*sec)
	s.run(64 * sec)
	if st := s.e.State(); st != Down {
		t.Errorf("state %v, want down: answering every other probe is not recovery", st)
	}
}

func TestNoFlappingUnderRandomLoss(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 30))
		s := newSim(t, Config{}, 20*time.Millisecond)
		s.checkDeadlines = seed == 1
		s.drop = func(uint32) bool { return rng.Float64() < 0.3 }
		s.run(2 * sec)
		if s.e.State() != Up {
			t.Fatalf("seed %d: not up after 2 s", seed)
		}
		s.run(62 * sec)
		snap := s.e.Snapshot()
		if n := s.changesAfter(2 * sec); n != 0 {
			t.Errorf("seed %d: %d transitions in 60 s of 30 %% probe loss: %v", seed, n, s.changes)
		}
		if snap.Loss < 0.1 || snap.Loss > 0.55 {
			t.Errorf("seed %d: loss %v, want about 0.3", seed, snap.Loss)
		}
		if snap.SRTT != 20*time.Millisecond {
			t.Errorf("seed %d: srtt %v", seed, snap.SRTT)
		}
		t.Logf("seed %d: %d probes in 62 s, loss %.3f", seed, snap.ProbesSent, snap.Loss)
		// The fast probes while quiet cost some, not a flood.
		if snap.ProbesSent > 62*40 {
			t.Errorf("seed %d: %d probes in 62 s", seed, snap.ProbesSent)
		}
	}
}

func TestAdminAndLinkDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(e *Estimator, now int64, down bool) bool
		want State
	}{
		{"admin", (*Estimator).SetAdminDown, AdminDown},
		{"link", (*Estimator).SetLinkDown, LinkDown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Config{}, 20*time.Millisecond)
			s.run(sec)
			if s.e.State() != Up {
				t.Fatal("not up")
			}
			// Go down while a probe's reply is in flight: the probe is cancelled.
			for len(s.replies) == 0 {
				s.run(s.now + ms)
			}
			downAt := s.now
			lost := s.e.Snapshot().ProbesLost
			if !tc.set(s.e, s.now, true) || s.e.State() != tc.want {
				t.Fatalf("state %v, want %v at once", s.e.State(), tc.want)
			}
			if tc.set(s.e, s.now, true) {
				t.Error("setting twice reported a change")
			}
			if s.e.NextDeadline() != Never {
				t.Errorf("deadline %v while down, want Never", s.e.NextDeadline())
			}
			s.run(3 * sec)
			snap := s.e.Snapshot()
			if snap.State != tc.want || snap.Since != downAt || snap.Transitions != 2 {
				t.Errorf("snapshot after 2 s down: %+v", snap)
			}
			if snap.ProbesLost != lost || snap.RepliesIgnored != 1 {
				t.Errorf("cancelled probe: lost %d -> %d, ignored %d; want it ignored, not lost", lost, snap.ProbesLost, snap.RepliesIgnored)
			}
			sent := snap.ProbesSent
			if !tc.set(s.e, 3*sec, false) || s.e.State() != Down {
				t.Fatalf("state %v after lifting, want down (probing)", s.e.State())
			}
			if s.e.NextDeadline() != 3*sec {
				t.Errorf("deadline %v after lifting, want a probe at once", time.Duration(s.e.NextDeadline()))
			}
			if got := s.e.Snapshot().ProbesSent; got != sent {
				t.Errorf("%d probes sent while down", got-sent)
			}
			s.run(3*sec + 100*ms)
			if st := s.e.State(); st != Up {
				t.Errorf("state %v 100 ms after lifting, want up", st)
			}
		})
	}
	// Both at once: the operator's state wins, and the path is usable only when both lift.
	e := New(Config{}, 0)
	e.SetLinkDown(1, true)
	e.SetAdminDown(2, true)
	if e.State() != AdminDown {
		t.Errorf("state %v, want admin-down", e.State())
	}
	if !e.SetAdminDown(3, false) || e.State() != LinkDown {
		t.Errorf("state %v, want link-down", e.State())
	}
	if _, _, due := e.NextProbe(4); due {
		t.Error("probe due while the link is down")
	}
	if !e.SetLinkDown(5, false) || e.State() != Down {
		t.Errorf("state %v, want down", e.State())
	}
	if _, _, due := e.NextProbe(5); !due {
		t.Error("no probe due after the link came back")
	}
	if got := e.Snapshot().Transitions; got != 4 {
		t.Errorf("%d transitions, want 4", got)
	}
}

func TestSeqWrap(t *testing.T) {
	s := newSim(t, Config{}, 20*time.Millisecond)
	start := uint32(math.MaxUint32 - 20)
	s.e.next, s.e.tail, s.e.runFloor = start, start, start
	var lost uint32
	s.drop = func(seq uint32) bool {
		if seq == math.MaxUint32 || seq == 0 {
			lost++
			return true
		}
		return false
	}
	s.run(5 * sec)
	snap := s.e.Snapshot()
	if s.e.next > 200 {
		t.Fatalf("sequence %d, did not wrap", s.e.next)
	}
	if snap.State != Up || snap.Transitions != 1 || snap.RepliesIgnored != 0 || snap.ProbesLost != 2 || lost != 2 {
		t.Errorf("after wrap: %+v", snap)
	}
	if snap.SRTT != 20*time.Millisecond {
		t.Errorf("srtt %v", snap.SRTT)
	}
	// Right across the wrap: replies to probes before it are still known.
	e := New(Config{}, 0)
	e.next, e.tail, e.runFloor = math.MaxUint32-1, math.MaxUint32-1, math.MaxUint32-1
	var seqs, tss [3]uint32
	for i := range 3 {
		now := int64(i) * 10 * ms
		e.lastProbeAt = now - sec
		var due bool
		seqs[i], tss[i], due = e.NextProbe(now)
		if !due {
			t.Fatal("probe not due")
		}
	}
	if seqs != [3]uint32{math.MaxUint32 - 1, math.MaxUint32, 0} {
		t.Fatalf("seqs %v", seqs)
	}
	for i := range 3 {
		e.OnReply(40*ms+int64(i)*10*ms, seqs[i], tss[i], 0, Feedback{})
	}
	e.Tick(60 * ms)
	if e.State() != Up || e.Snapshot().RepliesIgnored != 0 || e.Snapshot().SRTT != 40*time.Millisecond {
		t.Errorf("across the wrap: %+v", e.Snapshot())
	}
}

func TestRepliesIgnored(t *testing.T) {
	e := New(Config{}, 0)
	// Probes 0..299, the first 44 answered.
	var ts [300]uint32
	for i := range 300 {
		now := int64(i) * 10 * ms
		e.lastProbeAt = now - sec
		seq, t2, due := e.NextProbe(now)
		if !due || seq != uint32(i) {
			t.Fatalf("probe %d: seq %d due %v", i, seq, due)
		}
		ts[i] = t2
	}
	now := 300 * 10 * ms
	e.OnReply(now, 299, ts[299], 0, Feedback{})
	e.Tick(now) // the first RTT sample shortened the probe timeout
	base := e.Snapshot()
	for _, tc := range []struct {
		name          string
		seq, ts       uint32
		ignored, dups uint64
	}{
		{"never sent", 300, ts[299], 1, 0},
		{"far future", 1 << 31, 0, 1, 0},
		{"forgotten (ring wrapped)", 10, ts[10], 1, 0},
		{"just forgotten", 299 - ringSize, ts[299-ringSize], 1, 0},
		{"wrong timestamp", 298, ts[298] + 1, 1, 0},
		{"duplicate", 299, ts[299], 0, 1},
	} {
		e.OnReply(now, tc.seq, tc.ts, 0, Feedback{Bytes: 1 << 40, Packets: 100})
		snap := e.Snapshot()
		if snap.RepliesIgnored-base.RepliesIgnored != tc.ignored || snap.RepliesDuplicate-base.RepliesDuplicate != tc.dups {
			t.Errorf("%s: ignored %d, dups %d", tc.name, snap.RepliesIgnored-base.RepliesIgnored, snap.RepliesDuplicate-base.RepliesDuplicate)
		}
		if snap.SRTT != base.SRTT || snap.LastHeard != base.LastHeard || snap.DeliveryRate != 0 || snap.Loss != base.Loss {
			t.Errorf("%s: changed the estimates: %+v", tc.name, snap)
		}
		base = snap
	}
	// The oldest remembered probe still counts (as a late reply: it timed out long ago).
	e.OnReply(now, 300-ringSize, ts[300-ringSize], 0, Feedback{})
	if snap := e.Snapshot(); snap.RepliesLate != 1 || snap.RepliesIgnored != base.RepliesIgnored || snap.LastHeard != now {
		t.Errorf("oldest remembered probe: %+v", snap)
	}
}

func TestRFC6298(t *testing.T) {
	e := New(Config{}, 0)
	samples := []time.Duration{100, 120, 80, 200, 50, 50, 50, 300, 90, 100}
	// RFC 6298 section 2, in floating point.
	var srtt, rttvar float64
	now := int64(0)
	for i, r := range samples {
		r *= time.Millisecond
		hold := uint32(i * 1000) // i ms of the round trip spent at the peer
		e.lastProbeAt = now - sec
		seq, ts, _ := e.NextProbe(now)
		now += int64(r) + int64(hold)*1000
		e.OnReply(now, seq, ts, hold, Feedback{})
		if i == 0 {
			srtt, rttvar = float64(r), float64(r)/2
		} else {
			rttvar = 0.75*rttvar + 0.25*math.Abs(srtt-float64(r))
			srtt = 0.875*srtt + 0.125*float64(r)
		}
		snap := e.Snapshot()
		if math.Abs(float64(snap.SRTT)-srtt) > 10 || math.Abs(float64(snap.RTTVar)-rttvar) > 10 {
			t.Errorf("sample %d (%v): srtt %v rttvar %v, want %v %v", i, r, snap.SRTT, snap.RTTVar, time.Duration(srtt), time.Duration(rttvar))
		}
		if i == 1 && (snap.SRTT != 102500*time.Microsecond || snap.RTTVar != 42500*time.Microsecond) {
			t.Errorf("after 100, 120 ms: srtt %v rttvar %v, want 102.5 ms 42.5 ms", snap.SRTT, snap.RTTVar)
		}
		if want := min(max(3*snap.SRTT, 100*time.Millisecond), time.Second); snap.ProbeTimeout != want {
			t.Errorf("probe timeout %v, want %v", snap.ProbeTimeout, want)
		}
		now += 10 * ms
	}
	if got := e.Snapshot().MinRTT; got != 50*time.Millisecond {
		t.Errorf("minrtt %v", got)
	}
	// A hold time longer than the round trip is impossible: no sample, but the path was heard.
	e.lastProbeAt = now - sec
	seq, ts, _ := e.NextProbe(now)
	before := e.Snapshot()
	e.OnReply(now+5*ms, seq, ts, 6000, Feedback{})
	if after := e.Snapshot(); after.SRTT != before.SRTT || after.LastHeard != now+5*ms {
		t.Errorf("impossible hold: %+v", after)
	}
}

func TestMinRTTForgets(t *testing.T) {
	s := newSim(t, Config{}, 10*time.Millisecond)
	s.run(5 * sec)
	s.rtt = 30 * ms // the short route is gone
	s.run(15 * sec)
	if got := s.e.Snapshot().MinRTT; got != 10*time.Millisecond {
		t.Errorf("minrtt %v 10 s after the route change, want 10 ms still", got)
	}
	s.run(30 * sec)
	if got := s.e.Snapshot().MinRTT; got != 30*time.Millisecond {
		t.Errorf("minrtt %v 25 s after the route change, want 30 ms", got)
	}
}

func TestDeliveryRate(t *testing.T) {
	e := New(Config{}, 0)
	var fb Feedback
	// 125 000 bytes every 50 ms: 20 Mbit/s.
	for i := int64(1); i <= 20; i++ {
		fb.Bytes += 125000
		fb.Packets += 100
		fb.Time = uint32(i * 50 * ms / 1000)
		// The replies come back with jitter: the window is timed by the peer's clock.
		e.OnFeedback(i*50*ms+(i%3)*7*ms, fb)
		want := 20e6
		if i < 3 {
			want = 0 // first feedback sets the baseline; then a window of 100 ms
		}
		if got := e.Snapshot().DeliveryRate; got != want {
			t.Fatalf("feedback %d: rate %v, want %v", i, got, want)
		}
	}
	// Feedback more often than the window (fast probing) is aggregated.
	for i := int64(0); i < 20; i++ {
		fb.Bytes += 50000 // 40 Mbit/s in 10 ms steps
		fb.Packets += 40
		fb.Time = uint32((sec + (i+1)*10*ms) / 1000)
		e.OnFeedback(sec+(i+1)*10*ms, fb)
	}
	if got := e.Snapshot().DeliveryRate; got != 40e6 {
		t.Errorf("rate %v, want 40e6", got)
	}
	if got := e.Snapshot().ForwardLoss; got != 0 {
		t.Errorf("forward loss %v", got)
	}
	// Loss from feedback: 90 received, 10 lost per feedback.
	for i := int64(0); i < 20; i++ {
		fb.Bytes += 90 * 1000
		fb.Packets += 90
		fb.Lost += 10
		fb.ReorderPackets, fb.ReorderKiB, fb.ReorderFreeKiB = uint32(i), uint32(2*i), uint32(200-2*i)
		fb.Time = uint32((2*sec + i*50*ms) / 1000)
		e.OnFeedback(2*sec+i*50*ms, fb)
	}
	snap := e.Snapshot()
	if math.Abs(snap.ForwardLoss-0.1) > 0.001 || snap.Loss != 0 {
		t.Errorf("forward loss %v, want 0.1; probe loss %v, want 0", snap.ForwardLoss, snap.Loss)
	}
	if snap.PeerReorderPackets != 19 || snap.PeerReorderKiB != 38 || snap.PeerReorderFreeKiB != 162 || snap.PeerFeedbackAt != 2*sec+19*50*ms {
		t.Errorf("reorder gauges %d %d %d at %d", snap.PeerReorderPackets, snap.PeerReorderKiB, snap.PeerReorderFreeKiB, snap.PeerFeedbackAt)
	}
}

func TestFeedbackRestartAndWrap(t *testing.T) {
	e := New(Config{}, 0)
	// The peer's clock wraps too.
	fb := Feedback{Bytes: 1 << 40, Packets: math.MaxUint32 - 500, Lost: math.MaxUint32 - 5, Time: math.MaxUint32 - 120000}
	now := int64(0)
	step := func(bytes uint64, pkts, lost uint32) {
		now += 50 * ms
		fb.Time += 50000
		fb.Bytes += bytes
		fb.Packets += pkts
		fb.Lost += lost
		e.OnFeedback(now, fb)
	}
	for range 10 { // 10 Mbit/s; Packets, Lost and Time wrap on the way
		step(62500, 100, 1)
	}
	snap := e.Snapshot()
	if snap.DeliveryRate != 10e6 || snap.PeerRestarts != 0 || math.Abs(snap.ForwardLoss-0.0099) > 0.0005 {
		t.Fatalf("across the counter wrap: %+v", snap)
	}
	// A reordered, older feedback is skipped, not taken for a restart.
	stale := fb
	stale.Bytes -= 62500
	stale.Packets -= 100
	e.OnFeedback(now+10*ms, stale)
	step(62500, 100, 1)
	if snap := e.Snapshot(); snap.PeerRestarts != 0 || snap.DeliveryRate != 10e6 {
		t.Fatalf("stale feedback: %+v", snap)
	}
	// The peer restarts: its counters start again from zero.
	fb = Feedback{}
	step(62500, 100, 0)
	if snap := e.Snapshot(); snap.PeerRestarts != 0 || snap.DeliveryRate != 10e6 {
		t.Fatalf("first feedback after restart: %+v", snap)
	}
	for range 5 {
		step(62500, 100, 0)
		snap := e.Snapshot()
		if snap.PeerRestarts != 1 || snap.DeliveryRate < 0 || snap.DeliveryRate > 10e6 {
			t.Fatalf("after restart: %+v", snap)
		}
	}
	if snap := e.Snapshot(); snap.DeliveryRate != 10e6 || snap.ForwardLoss > 0.001 {
		t.Errorf("settled after restart: %+v", snap)
	}
	// More packets than bytes cannot be: treated as going backwards.
	before := e.Snapshot()
	bogus := fb
	bogus.Packets += 1000
	bogus.Bytes += 10
	e.OnFeedback(now+ms, bogus)
	if after := e.Snapshot(); after.DeliveryRate != before.DeliveryRate || after.ForwardLoss != before.ForwardLoss {
		t.Errorf("implausible feedback used: %+v", after)
	}
}

// Replies overtaken by newer ones carry older counters: their feedback is skipped.
func TestReplyFeedbackOrder(t *testing.T) {
	e := New(Config{}, 0)
	var seqs, tss [2]uint32
	for i := range 2 {
		e.lastProbeAt = -sec
		seqs[i], tss[i], _ = e.NextProbe(int64(i) * ms)
	}
	e.OnReply(10*ms, seqs[1], tss[1], 0, Feedback{Bytes: 2000, Packets: 2})
	e.OnReply(11*ms, seqs[0], tss[0], 0, Feedback{Bytes: 1000, Packets: 1})
	if e.fb.Bytes != 2000 || e.candHave {
		t.Errorf("older reply's feedback used: %+v", e.fb)
	}
}

func TestNextDeadline(t *testing.T) {
	e := New(Config{}, 7*ms)
	if d := e.NextDeadline(); d != 7*ms {
		t.Fatalf("new path: deadline %v, want a probe at once", time.Duration(d))
	}
	// A new path sends its first UpAfter probes 10 ms apart, then one every 50 ms.
	var seqs, tss [3]uint32
	for i := range 3 {
		now := 7*ms + int64(i)*10*ms
		if _, _, due := e.NextProbe(now - 1); due && i > 0 {
			t.Fatalf("probe %d before its time", i)
		}
		var due bool
		if seqs[i], tss[i], due = e.NextProbe(now); !due {
			t.Fatalf("probe %d not due at %v", i, time.Duration(now))
		}
	}
	if d := e.NextDeadline(); d != 77*ms {
		t.Fatalf("after the first probes: %v, want 77 ms (next probe)", time.Duration(d))
	}
	// Answered: the next probe comes fast, to confirm.
	e.OnReply(30*ms, seqs[0], tss[0], 0, Feedback{})
	if d := e.NextDeadline(); d != 37*ms {
		t.Fatalf("confirming: %v, want 37 ms", time.Duration(d))
	}
	e.OnReply(37*ms, seqs[1], tss[1], 0, Feedback{})
	if d := e.NextDeadline(); d != 37*ms {
		t.Fatalf("confirming: %v, want 37 ms", time.Duration(d))
	}
	now := int64(47 * ms)
	e.OnReply(now, seqs[2], tss[2], 0, Feedback{})
	// UpAfter answers: a transition is pending, Tick is due now.
	if d := e.NextDeadline(); d > now {
		t.Fatalf("pending up: deadline %v > now %v", time.Duration(d), time.Duration(now))
	}
	if !e.Tick(now) || e.State() != Up {
		t.Fatal("not up")
	}
	// Up: next probe 50 ms after the last, down 300 ms after the last reply.
	last := e.lastProbeAt
	if d := e.NextDeadline(); d != last+50*ms {
		t.Fatalf("up: %v, want %v", time.Duration(d), time.Duration(last+50*ms))
	}
	// Quiet for 75 ms: probes every 10 ms.
	e.lastProbeAt = now + 70*ms
	if d := e.NextDeadline(); d != now+80*ms {
		t.Fatalf("quiet: %v, want %v", time.Duration(d), time.Duration(now+80*ms))
	}
	e.lastProbeAt = now + 30*ms
	if d := e.NextDeadline(); d != now+75*ms {
		t.Fatalf("quiet: %v, want %v", time.Duration(d), time.Duration(now+75*ms))
	}
	// An outstanding probe times out at max(3 × srtt, 100 ms).
	e.lastProbeAt = now - sec
	e.NextProbe(now)
	e.lastProbeAt = now + sec
	if d := e.NextDeadline(); d != now+100*ms {
		t.Fatalf("probe timeout: %v, want %v", time.Duration(d), time.Duration(now+100*ms))
	}
	e.lastHeard = now - 200*ms
	if d := e.NextDeadline(); d != now+50*ms {
		t.Fatalf("silence: %v, want %v", time.Duration(d), time.Duration(now+50*ms))
	}
	e.SetAdminDown(now, true)
	if d := e.NextDeadline(); d != Never {
		t.Fatalf("admin down: %v", d)
	}
}

func TestAllocs(t *testing.T) {
	e := New(Config{}, 0)
	now := int64(0)
	fb := Feedback{}
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"NextProbe+OnReply", func() {
			now += 50 * ms
			seq, ts, _ := e.NextProbe(now)
			fb.Bytes += 1000
			fb.Packets++
			e.OnReply(now+20*ms, seq, ts, 100, fb)
		}},
		{"OnReceive", func() { now += ms; e.OnReceive(now, 1200) }},
		{"OnSend", func() { e.OnSend(now, 1200) }},
		{"Tick", func() { now += ms; e.Tick(now) }},
		{"NextDeadline", func() { e.NextDeadline() }},
		{"OnFeedback", func() { now += ms; fb.Bytes += 1e4; fb.Packets += 10; e.OnFeedback(now, fb) }},
		{"Snapshot", func() { _ = e.Snapshot() }},
	} {
		if n := testing.AllocsPerRun(1000, tc.f); n != 0 {
			t.Errorf("%s: %v allocs per run", tc.name, n)
		}
	}
}

func BenchmarkProbeRound(b *testing.B) {
	e := New(Config{}, 0)
	now := int64(0)
	var fb Feedback
	for b.Loop() {
		now += 50 * ms
		seq, ts, _ := e.NextProbe(now)
		fb.Bytes += 1000
		fb.Packets++
		e.OnReceive(now+20*ms, 64)
		e.OnReply(now+20*ms, seq, ts, 100, fb)
		e.Tick(now + 20*ms)
		e.NextDeadline()
	}
}

// A probe overdue while no later one has come back is a stall; one followed by an answered
// probe is a loss, not a stall.
func TestStalled(t *testing.T) {
	e := New(Config{}, 0)
	var ts [20]uint32
	var at [20]int64
	send := func(i int) {
		t.Helper()
		now := int64(i) * 50 * ms
		e.lastProbeAt = now - sec
		seq, t2, due := e.NextProbe(now)
		if !due || seq != uint32(i) {
			t.Fatalf("probe %d: seq %d due %v", i, seq, due)
		}
		ts[i], at[i] = t2, now
	}
	answer := func(i int) { e.OnReply(at[i]+40*ms, uint32(i), ts[i], 0, Feedback{}) }
	stalled := func(want bool, seq, after uint32) {
		t.Helper()
		s, a, sent, ok := e.Stalled()
		if ok != want || (ok && (s != seq || a != after || sent != at[seq])) {
			t.Fatalf("Stalled() = %d, %d, %v, %v; want %d, %d, %v", s, a, time.Duration(sent), ok, seq, after, want)
		}
	}
	send(0)
	stalled(false, 0, 0) // nothing answered yet: no reference
	answer(0)
	for i := 1; i < 10; i++ {
		send(i)
		answer(i)
	}
	stalled(false, 0, 0)
	send(10) // lost
	send(11)
	answer(11)
	stalled(false, 0, 0)
	send(12)
	send(13)
	stalled(true, 12, 11)
	answer(12)
	stalled(true, 13, 12)
	e.Tick(at[13] + 5*sec) // 13 times out: a stall still, nothing later came back
	stalled(true, 13, 12)
	answer(13) // late
	stalled(false, 0, 0)
}
