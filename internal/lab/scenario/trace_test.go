package scenario

import (
	"testing"
	"time"
)

// Every second must be within 5 % of the trace: one second off in either direction fails.
func TestTraceBound(t *testing.T) {
	sec := func(delivered, trace int64) traceSecond { return traceSecond{delivered: delivered, trace: trace} }
	for _, tc := range []struct {
		name string
		secs []traceSecond
		ok   bool
	}{
		{"exact", []traceSecond{sec(1000, 1000), sec(3000, 3000)}, true},
		{"4 % either way", []traceSecond{sec(960, 1000), sec(3120, 3000)}, true},
		{"one second 6 % fast", []traceSecond{sec(1000, 1000), sec(1060, 1000)}, false},
		{"one second 6 % slow", []traceSecond{sec(940, 1000), sec(1000, 1000)}, false},
		{"a second with no trace", []traceSecond{sec(0, 0)}, false},
		{"nothing compared", nil, false},
	} {
		if worst, _, ok := traceBound(tc.secs); ok != tc.ok {
			t.Errorf("%s: worst %+.3f ok %v, want %v", tc.name, worst, ok, tc.ok)
		}
	}
}

// TraceShape finds the shipped traces from the package directory (lab/traces of the
// repository), as the accuracy check does.
func TestTraceShape(t *testing.T) {
	s, err := TraceShape("Verizon-LTE-short.up", 10*time.Second, 40*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if s.Trace == nil || s.Trace.Offset != 10*time.Second || s.Delay != 40*time.Millisecond || s.Rate != 0 {
		t.Errorf("TraceShape = %+v", s)
	}
	if m := s.MeanRate(); m < 5.9e6 || m > 6.1e6 {
		t.Errorf("mean rate %d, want about 6 Mbit/s", m)
	}
	if _, err := TraceShape("no-such-trace", 0, 0); err == nil {
		t.Error("a missing trace loaded")
	}
}
