package kit

import (
	"bytes"
	"image"
	"image/png"
	"testing"
)

func TestNiceStep(t *testing.T) {
	for _, c := range []struct {
		span float64
		n    int
		want float64
	}{{7.5, 8, 1}, {16, 6, 5}, {1.2, 6, 0.2}, {100, 5, 20}, {0, 5, 1}, {31, 6, 10}} {
		if got := niceStep(c.span, c.n); got != c.want {
			t.Errorf("niceStep(%v, %d) = %v, want %v", c.span, c.n, got, c.want)
		}
	}
}

// The chart is a PNG of the asked size that shows every series in its colour, and a chart
// without data is refused.
func TestChartPNG(t *testing.T) {
	c := Chart{Title: "Completion time (s)", XLabel: "file size (MB)", YLabel: "time (s)", Series: []Series{
		{Name: "TCP", Color: Palette[0], X: []float64{1, 2, 3}, Min: []float64{2, 4, 6}, Med: []float64{2.2, 4.3, 6.1}, Max: []float64{2.5, 5, 7}},
		{Name: "A-MPTCP", Color: Palette[2], X: []float64{1, 2, 3}, Min: []float64{1, 2, 3}, Med: []float64{1.1, 2.1, 3.2}, Max: []float64{1.3, 2.4, 3.5}},
	}}
	var b bytes.Buffer
	if err := c.WritePNG(&b, 800, 500); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds() != image.Rect(0, 0, 800, 500) {
		t.Fatalf("bounds %v", img.Bounds())
	}
	count := map[[3]uint32]int{}
	for y := 0; y < 500; y++ {
		for x := 0; x < 800; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			count[[3]uint32{r >> 8, g >> 8, b >> 8}]++
		}
	}
	for _, s := range c.Series {
		if n := count[[3]uint32{uint32(s.Color.R), uint32(s.Color.G), uint32(s.Color.B)}]; n < 200 {
			t.Errorf("series %s: %d pixels of its colour", s.Name, n)
		}
	}
	if count[[3]uint32{0, 0, 0}] < 1000 {
		t.Errorf("axes and labels: %d black pixels", count[[3]uint32{0, 0, 0}])
	}
	if err := (Chart{Title: "empty"}).WritePNG(&b, 100, 100); err == nil {
		t.Error("an empty chart was drawn")
	}
}
