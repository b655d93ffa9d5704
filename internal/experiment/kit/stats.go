package kit

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Median returns the median of v (the upper one of an even count), 0 for none.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// Percentile returns the p-th percentile (0..1, nearest rank) of v, 0 for none.
func Percentile(v []time.Duration, p float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// MeanCI returns the mean and the half-width of its 95 % confidence interval (Student t).
func MeanCI(xs []float64) (mean, half float64) {
	n := len(xs)
	if n == 0 {
		return 0, 0
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(n)
	if n < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	sd := math.Sqrt(ss / float64(n-1))
	return mean, tQuantile975(n-1) * sd / math.Sqrt(float64(n))
}

// tQuantile975 is the 97.5 % quantile of Student's t distribution with df degrees of freedom.
func tQuantile975(df int) float64 {
	table := []float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	switch {
	case df < 1:
		return math.Inf(1)
	case df < len(table):
		return table[df]
	case df < 60:
		return 2.01
	case df < 120:
		return 1.99
	}
	return 1.96
}
