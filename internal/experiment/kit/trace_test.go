package kit

import (
	"testing"
	"time"
)

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
