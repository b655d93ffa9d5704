package kit

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The reproductions' figures, drawn with gonum.org/v1/plot (its fonts, ticks, legend and
// error bars; PNG, SVG or PDF by the file's extension).

// Series is one curve: a value at each X (a median or a mean), and optionally the interval
// drawn around it as an error bar (Lo to Hi: the range of the runs, or a confidence interval).
type Series struct {
	Name   string
	Color  color.RGBA
	X, Y   []float64
	Lo, Hi []float64 // nil: no error bars
}

// Chart is a figure with one or more series. The labels carry the units ("time (s)"); Bars
// says what the error bars are ("bars: min to max of 5 runs") and is shown under the title.
type Chart struct {
	Title, XLabel, YLabel string
	Bars                  string
	LogX                  bool // a logarithmic X axis (sizes spanning decades)
	// LogY: a logarithmic Y axis (times spanning decades); an error bar that reaches 0 or
	// below is drawn to the bottom of the axis. On a linear axis, where every value is ≥ 0, an
	// error bar reaching below 0 is drawn to 0.
	LogY bool
	// XTick labels the X axis's major ticks ("10 kB" rather than 10000); nil: the numbers.
	XTick  func(v float64) string
	Series []Series
	Marks  []Mark
}

// denseSeries is the number of points above which a series is drawn as a line only.
const denseSeries = 40

// Mark is an event on the X axis (a link cut, its restore): a dashed vertical line, named in
// the legend.
type Mark struct {
	Name string
	X    float64
}

// Palette is the series colours, in order (distinguishable in print and by most colour-blind
// readers).
var Palette = []color.RGBA{{213, 94, 0, 255}, {0, 114, 178, 255}, {0, 158, 115, 255}, {204, 121, 167, 255}, {86, 180, 233, 255}, {230, 159, 0, 255}, {0, 0, 0, 255}}

// ErrNoData is returned for a chart that has no point to draw.
var ErrNoData = errors.New("chart has no data")

// check refuses a chart that has nothing to draw or whose series disagree in length.
func (c Chart) check() error {
	points := 0
	for _, s := range c.Series {
		if len(s.Y) != len(s.X) {
			return fmt.Errorf("chart %q, series %q: %d X values, %d Y values", c.Title, s.Name, len(s.X), len(s.Y))
		}
		if (s.Lo == nil) != (s.Hi == nil) || (s.Lo != nil && (len(s.Lo) != len(s.X) || len(s.Hi) != len(s.X))) {
			return fmt.Errorf("chart %q, series %q: error bars need Lo and Hi for every X", c.Title, s.Name)
		}
		for i := range s.X {
			if c.LogX && s.X[i] <= 0 {
				return fmt.Errorf("chart %q, series %q: X %v on a logarithmic axis", c.Title, s.Name, s.X[i])
			}
			if c.LogY && s.Y[i] <= 0 {
				return fmt.Errorf("chart %q, series %q: Y %v on a logarithmic axis", c.Title, s.Name, s.Y[i])
			}
			if s.Lo != nil && (s.Lo[i] > s.Y[i] || s.Hi[i] < s.Y[i]) {
				return fmt.Errorf("chart %q, series %q: at X %v the interval [%v, %v] does not hold %v", c.Title, s.Name, s.X[i], s.Lo[i], s.Hi[i], s.Y[i])
			}
		}
		points += len(s.X)
	}
	if points == 0 {
		return fmt.Errorf("chart %q: %w", c.Title, ErrNoData)
	}
	return nil
}

// plot builds the gonum plot of c.
func (c Chart) plot() (*plot.Plot, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	p := plot.New()
	p.Title.Text = c.Title
	if c.Bars != "" {
		p.Title.Text += "\n" + c.Bars
	}
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.X.Label.Text, p.Y.Label.Text = c.XLabel, c.YLabel
	p.X.Label.TextStyle.Font.Size, p.Y.Label.TextStyle.Font.Size = vg.Points(12), vg.Points(12)
	p.X.Tick.Label.Font.Size, p.Y.Tick.Label.Font.Size = vg.Points(10), vg.Points(10)
	p.Add(plotter.NewGrid())
	if c.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if c.XTick != nil {
		p.X.Tick.Marker = relabel{p.X.Tick.Marker, c.XTick}
	}
	// Rates and times: the zero is part of the picture, unless the axis is logarithmic, where
	// it starts below the smallest value or interval.
	p.Y.Min = 0
	bottom := 0.0
	// Values that are all ≥ 0 (rates, times) keep the axis at 0: an interval reaching below
	// (a t interval of few runs) is drawn to 0.
	nonNegative := true
	for _, s := range c.Series {
		for _, v := range s.Y {
			nonNegative = nonNegative && v >= 0
		}
	}
	if c.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		bottom = math.Inf(1)
		for _, s := range c.Series {
			for i := range s.Y {
				bottom = math.Min(bottom, s.Y[i])
				if s.Lo != nil && s.Lo[i] > 0 {
					bottom = math.Min(bottom, s.Lo[i])
				}
			}
		}
		bottom = math.Pow(10, math.Floor(math.Log10(bottom/1.2)))
		p.Y.Min = bottom
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), -vg.Points(8)
	glyphs := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.PyramidGlyph{}, draw.RingGlyph{}, draw.BoxGlyph{}, draw.CrossGlyph{}}
	for k, s := range c.Series {
		xys := make(plotter.XYs, len(s.X))
		for i := range s.X {
			xys[i] = plotter.XY{X: s.X[i], Y: s.Y[i]}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, fmt.Errorf("chart %q, series %q: %w", c.Title, s.Name, err)
		}
		line.Color, line.Width = s.Color, vg.Points(1.5)
		points.Color, points.Shape, points.Radius = s.Color, glyphs[k%len(glyphs)], vg.Points(2.5)
		if len(s.X) > denseSeries {
			// A time series: markers on every sample would hide the line.
			p.Add(line)
			p.Legend.Add(s.Name, line)
		} else {
			p.Add(line, points)
			p.Legend.Add(s.Name, line, points)
		}
		if s.Lo != nil {
			lo := s.Lo
			if c.LogY || nonNegative {
				lo = make([]float64, len(s.Lo))
				for i, v := range s.Lo {
					if c.LogY {
						lo[i] = math.Max(v, bottom*1.01) // just above: on the axis, not below it by a rounding
					} else {
						lo[i] = math.Max(v, 0)
					}
				}
			}
			bars, err := plotter.NewYErrorBars(errorBars{xys, lo, s.Hi})
			if err != nil {
				return nil, fmt.Errorf("chart %q, series %q: %w", c.Title, s.Name, err)
			}
			bars.Color, bars.Width, bars.CapWidth = s.Color, vg.Points(1), vg.Points(6)
			p.Add(bars)
		}
	}
	// Room around the data, so that no marker or error bar's cap sits on the frame.
	if c.LogX {
		p.X.Min, p.X.Max = p.X.Min/1.25, p.X.Max*1.25
	} else {
		pad := (p.X.Max - p.X.Min) * 0.03
		p.X.Min, p.X.Max = p.X.Min-pad, p.X.Max+pad
	}
	if c.LogY {
		// Whole decades: the log ticks then all fall on the axis.
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(bottom)))
		p.Y.Max = math.Pow(10, math.Ceil(math.Log10(p.Y.Max*1.2)))
	} else {
		// Headroom for the legend, top left, above the data.
		p.Y.Max *= 1.05 + 0.07*float64(len(c.Series)+len(c.Marks))
	}
	for _, f := range []*font.Font{&p.Title.TextStyle.Font, &p.X.Label.TextStyle.Font, &p.Y.Label.TextStyle.Font,
		&p.X.Tick.Label.Font, &p.Y.Tick.Label.Font, &p.Legend.TextStyle.Font} {
		f.Variant = "Sans"
	}
	markStyles := [][]vg.Length{{vg.Points(5), vg.Points(3)}, {vg.Points(1.5), vg.Points(2.5)}, {vg.Points(8), vg.Points(3), vg.Points(2), vg.Points(3)}}
	for k, m := range c.Marks {
		if c.LogX && m.X <= 0 {
			return nil, fmt.Errorf("chart %q, mark %q: X %v on a logarithmic axis", c.Title, m.Name, m.X)
		}
		l, err := plotter.NewLine(plotter.XYs{{X: m.X, Y: p.Y.Min}, {X: m.X, Y: p.Y.Max}})
		if err != nil {
			return nil, fmt.Errorf("chart %q, mark %q: %w", c.Title, m.Name, err)
		}
		l.Color, l.Width, l.Dashes = color.Gray{Y: 60}, vg.Points(1.2), markStyles[k%len(markStyles)]
		p.Add(l)
		p.Legend.Add(m.Name, l)
	}
	return p, nil
}

// relabel names the major ticks of a ticker with its own labels.
type relabel struct {
	plot.Ticker
	label func(float64) string
}

func (r relabel) Ticks(min, max float64) []plot.Tick {
	ts := r.Ticker.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = r.label(ts[i].Value)
		}
	}
	return ts
}

// errorBars gives plotter.YErrorBars each point and its interval as offsets below and above.
type errorBars struct {
	plotter.XYs
	lo, hi []float64
}

func (e errorBars) YError(i int) (float64, float64) {
	return e.XYs[i].Y - e.lo[i], e.hi[i] - e.XYs[i].Y
}

// Write draws the chart, width × height points, in format ("png", "svg", "pdf").
func (c Chart) Write(w io.Writer, width, height vg.Length, format string) error {
	p, err := c.plot()
	if err != nil {
		return err
	}
	var wt io.WriterTo
	if format == "png" {
		// Rendered at PNGDPI rather than the library's 96, so that text stays sharp.
		cv := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(PNGDPI))
		p.Draw(draw.New(cv))
		wt = vgimg.PngCanvas{Canvas: cv}
	} else if wt, err = p.WriterTo(width, height, format); err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}

// PNGDPI is the resolution of PNG figures: the default size is 1050 × 675 pixels.
const PNGDPI = 150

// Default figure size: 7 × 4.5 inches.
const (
	FigureWidth  = 7 * vg.Inch
	FigureHeight = 4.5 * vg.Inch
)

// Save writes the chart to path at the default size, its format named by the extension
// (.png, .svg, .pdf), creating the directory.
func (c Chart) Save(path string) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	switch format {
	case "png", "svg", "pdf":
	default:
		return fmt.Errorf("figure %s: the extension names no format (png, svg, pdf)", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.Write(f, FigureWidth, FigureHeight, format); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// MinMax returns the smallest and the largest of v (0, 0 for none).
func MinMax(v []float64) (lo, hi float64) {
	if len(v) == 0 {
		return 0, 0
	}
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range v {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return lo, hi
}
