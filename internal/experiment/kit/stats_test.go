package kit

import (
	"math"
	"testing"
)

func TestMeanCI(t *testing.T) {
	m, h := MeanCI([]float64{1, 2, 3, 4, 5})
	// sd = 1.5811, t(4) = 2.776, half = 2.776 * 1.5811 / sqrt(5) = 1.963
	if m != 3 || math.Abs(h-1.963) > 0.001 {
		t.Fatalf("mean %v ± %v", m, h)
	}
	if _, h := MeanCI([]float64{7}); h != 0 {
		t.Fatalf("one sample: ± %v", h)
	}
	if tQuantile975(29) != 2.045 || tQuantile975(1000) != 1.96 {
		t.Fatal("t quantiles")
	}
}
