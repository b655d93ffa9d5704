package scenario

import (
	"math"
	"testing"

	"braid/internal/lb/maglev"
	"braid/internal/lb/xdp"
)

// The unaware balancer of the MPLB repro must split the client's two addresses, or the
// comparison would measure nothing.
func TestMPLBUnawareSeedSplits(t *testing.T) {
	seed := MPLBUnawareSeed()
	table := maglev.Table([]maglev.Backend{{Name: "b0", ID: 0, Weight: 1}, {Name: "b1", ID: 1, Weight: 1}}, xdp.TableSize)
	a := table[xdp.FlowHash(MPLBClient[0], MPLBVIP, 0, 0, seed, true)%xdp.TableSize]
	b := table[xdp.FlowHash(MPLBClient[1], MPLBVIP, 0, 0, seed, true)%xdp.TableSize]
	if a == b {
		t.Fatalf("seed %d sends both client addresses to backend %d", seed, a)
	}
}

func TestMeanCI(t *testing.T) {
	m, h := meanCI([]float64{1, 2, 3, 4, 5})
	// sd = 1.5811, t(4) = 2.776, half = 2.776 * 1.5811 / sqrt(5) = 1.963
	if m != 3 || math.Abs(h-1.963) > 0.001 {
		t.Fatalf("mean %v ± %v", m, h)
	}
	if _, h := meanCI([]float64{7}); h != 0 {
		t.Fatalf("one sample: ± %v", h)
	}
	if tQuantile975(29) != 2.045 || tQuantile975(1000) != 1.96 {
		t.Fatal("t quantiles")
	}
}
