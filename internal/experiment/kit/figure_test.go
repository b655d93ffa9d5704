package kit

import (
	"bytes"
	"errors"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"
)

func testChart() Chart {
	return Chart{Title: "Completion time per file size", XLabel: "file size (MB)", YLabel: "completion time (s)",
		Bars: "medians; bars: min to max of 3 runs", Series: []Series{
			{Name: "TCP", Color: Palette[0], X: []float64{1, 2, 3}, Y: []float64{2.2, 4.3, 6.1}, Lo: []float64{2, 4, 6}, Hi: []float64{2.5, 5, 7}},
			{Name: "A-MPTCP", Color: Palette[1], X: []float64{1, 2, 3}, Y: []float64{1.1, 2.1, 3.2}, Lo: []float64{1, 2, 3}, Hi: []float64{1.3, 2.4, 3.5}},
		}}
}

// The chart is a PNG of the asked size that shows every series in its colour, with its error
// bars (the colour reaches above and below the line), and a chart without data or with series
// that disagree is refused.
func TestChartPNG(t *testing.T) {
	c := testChart()
	var b bytes.Buffer
	if err := c.Write(&b, 7*vg.Inch, 4.5*vg.Inch, "png"); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if want := image.Rect(0, 0, 7*PNGDPI, 4.5*PNGDPI); img.Bounds() != want {
		t.Fatalf("bounds %v, want %v", img.Bounds(), want)
	}
	// Per series, the rows and columns where its colour is.
	for _, s := range c.Series {
		var n, top, bottom int
		top = img.Bounds().Dy()
		for y := 0; y < img.Bounds().Dy(); y++ {
			for x := 0; x < img.Bounds().Dx(); x++ {
				r, g, bl, _ := img.At(x, y).RGBA()
				if uint8(r>>8) == s.Color.R && uint8(g>>8) == s.Color.G && uint8(bl>>8) == s.Color.B {
					n++
					top, bottom = min(top, y), max(bottom, y)
				}
			}
		}
		if n < 300 {
			t.Errorf("series %s: %d pixels of its colour", s.Name, n)
		}
		// The whole series spans 1.0 to 7 s on an axis from 0: its colour covers most of the
		// plot's height only if the lines and bars are drawn.
		if bottom-top < img.Bounds().Dy()/4 {
			t.Errorf("series %s: colour spans rows %d to %d only", s.Name, top, bottom)
		}
	}
	if err := (Chart{Title: "empty"}).Write(&b, vg.Inch, vg.Inch, "png"); !errors.Is(err, ErrNoData) {
		t.Errorf("an empty chart: %v", err)
	}
	bad := testChart()
	bad.Series[1].Y = bad.Series[1].Y[:2]
	if err := bad.Write(&b, vg.Inch, vg.Inch, "png"); err == nil || !strings.Contains(err.Error(), "A-MPTCP") {
		t.Errorf("a series with fewer Y than X: %v", err)
	}
	bad = testChart()
	bad.Series[0].Lo[1] = 5
	if err := bad.Write(&b, vg.Inch, vg.Inch, "png"); err == nil || !strings.Contains(err.Error(), "does not hold") {
		t.Errorf("an interval that does not hold its value: %v", err)
	}
	bad = testChart()
	bad.LogX, bad.Series[0].X[0] = true, 0
	if err := bad.Write(&b, vg.Inch, vg.Inch, "png"); err == nil {
		t.Error("X 0 on a logarithmic axis was drawn")
	}
	bad = testChart()
	bad.LogY, bad.Series[0].Y[0], bad.Series[0].Lo[0] = true, 0, 0
	if err := bad.Write(&b, vg.Inch, vg.Inch, "png"); err == nil {
		t.Error("Y 0 on a logarithmic axis was drawn")
	}
	// An interval of a non-negative quantity reaching below 0 is drawn to 0, not below.
	neg := testChart()
	neg.Series[1].Lo[0] = -5
	p, err := neg.plot()
	if err != nil || p.Y.Min != 0 {
		t.Errorf("an interval below 0: axis from %v (%v), want 0", p.Y.Min, err)
	}
	// On a logarithmic Y axis an interval reaching 0 is drawn to the axis's bottom.
	logY := testChart()
	logY.LogY, logY.Series[1].Lo[0] = true, 0
	if err := logY.Write(&b, vg.Inch, vg.Inch, "png"); err != nil {
		t.Errorf("an interval reaching 0 on a logarithmic axis: %v", err)
	}
}

// The figure names what a reader needs: the title, the error bars' meaning, both axes with
// their units and each series in the legend (read from the SVG's text).
func TestChartLabels(t *testing.T) {
	c := testChart()
	c.LogX = true
	path := filepath.Join(t.TempDir(), "sub", "fig.svg")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{c.Title, c.Bars, c.XLabel, c.YLabel, "TCP", "A-MPTCP"} {
		if !bytes.Contains(svg, []byte(">"+want+"<")) {
			t.Errorf("the figure does not show %q", want)
		}
	}
	if err := c.Save(filepath.Join(t.TempDir(), "fig.gif")); err == nil {
		t.Error("a figure saved as .gif")
	}
}
