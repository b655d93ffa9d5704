package path

import (
	"errors"
	"testing"
	"time"
)

// pmtuSim drives a PMTU search over a path that carries packets up to mtu bytes: probes that
// fit are acked at once, the others vanish.
type pmtuSim struct {
	m     *PMTU
	now   int64
	mtu   int
	acked []int
}

const pmtuTimeout = int64(100 * time.Millisecond)

func (s *pmtuSim) run(d time.Duration) {
	end := s.now + int64(d)
	for ; s.now < end; s.now += int64(10 * time.Millisecond) {
		seq, size, due := s.m.Next(s.now, pmtuTimeout)
		if due && size <= s.mtu {
			s.acked = append(s.acked, size)
			s.m.OnAck(s.now, seq, size)
		}
	}
}

func TestPMTUSearch(t *testing.T) {
	for _, tc := range []struct {
		max, mtu, want int
	}{
		{1500, 1500, 1500}, // the common case: one probe, no change
		{1500, 1400, 1400 - 7},
		{1500, 1280, 1280},
		{9000, 1500, 1500 - 7},
		{1500, 1000, 1280}, // below the floor: the floor (and the tunnel warns)
	} {
		s := &pmtuSim{m: NewPMTU(PMTUConfig{Max: tc.max}, 0), mtu: tc.mtu}
		if v := s.m.Value(); v != tc.max {
			t.Fatalf("max %d: value %d before any probe, want max", tc.max, v)
		}
		s.run(10 * time.Second)
		if s.m.Searching() {
			t.Fatalf("max %d mtu %d: still searching after 10 s", tc.max, tc.mtu)
		}
		v := s.m.Value()
		if v < tc.want || v > max(tc.mtu, 1280) {
			t.Errorf("max %d mtu %d: path MTU %d, want %d..%d", tc.max, tc.mtu, v, tc.want, tc.mtu)
		}
	}
}

// A path that settled below Max tries Max again after Raise, and takes it when it passes.
func TestPMTURaise(t *testing.T) {
	s := &pmtuSim{m: NewPMTU(PMTUConfig{Max: 1500, Raise: time.Minute}, 0), mtu: 1400}
	s.run(10 * time.Second)
	if v := s.m.Value(); v > 1400 || v < 1393 {
		t.Fatalf("path MTU %d, want about 1400", v)
	}
	s.mtu = 1500 // the route changed
	s.run(40 * time.Second)
	if v := s.m.Value(); v > 1400 {
		t.Fatalf("path MTU %d before the raise timer, want still 1400", v)
	}
	s.run(30 * time.Second)
	if v := s.m.Value(); v != 1500 {
		t.Fatalf("path MTU %d after the raise timer, want 1500", v)
	}
	probes, lost := s.m.Counts()
	if probes == 0 || lost == 0 {
		t.Fatalf("counts %d probes %d lost", probes, lost)
	}
}

// While Max is being found too big, and during the search, the path uses a size that passes.
func TestPMTUSafeWhileSearching(t *testing.T) {
	s := &pmtuSim{m: NewPMTU(PMTUConfig{Max: 1500}, 0), mtu: 1300}
	for s.m.Searching() && s.now < int64(10*time.Second) {
		s.run(10 * time.Millisecond)
		if s.m.Searching() && s.m.Value() != 1500 && s.m.Value() > 1300 {
			t.Fatalf("value %d during the search over a 1300-byte path", s.m.Value())
		}
	}
	if len(s.acked) == 0 {
		t.Fatal("no probe was acked")
	}
}

func TestPMTUReset(t *testing.T) {
	s := &pmtuSim{m: NewPMTU(PMTUConfig{Max: 1500}, 0), mtu: 1400}
	s.run(10 * time.Second)
	s.m.Reset(s.now)
	if !s.m.Searching() || s.m.Value() != 1500 {
		t.Fatalf("after Reset: searching %v value %d", s.m.Searching(), s.m.Value())
	}
	s.run(10 * time.Second)
	if v := s.m.Value(); v > 1400 || v < 1393 {
		t.Fatalf("path MTU %d after Reset, want about 1400", v)
	}
}

func TestPMTUConfigValidate(t *testing.T) {
	for _, c := range []PMTUConfig{{}, {Max: 70000}, {Max: 1500, Min: 1600}, {Max: 1500, Tries: 11},
		{Max: 1500, Raise: time.Millisecond}, {Max: 1500, Step: -1}} {
		if err := c.WithDefaults().Validate(); !errors.Is(err, ErrPMTUConfig) {
			t.Errorf("%+v: %v, want ErrPMTUConfig", c, err)
		}
	}
	if err := (PMTUConfig{Max: 1500}).WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}
