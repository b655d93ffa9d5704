package accuracy

import (
	"testing"
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
