package kit

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strings"
)

// A small chart writer for the reproductions' figures: medians joined by lines, min–max error
// bars, axes with ticks and labels in a 5x7 bitmap font. Standard library only.

// Series is one curve: at each X the minimum, median and maximum of the measurements.
type Series struct {
	Name          string
	Color         color.RGBA
	X             []float64
	Min, Med, Max []float64
}

// Chart is a figure with one or more series.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
}

var (
	black = color.RGBA{0, 0, 0, 255}
	grey  = color.RGBA{220, 220, 220, 255}
	white = color.RGBA{255, 255, 255, 255}
	// Palette is the series colours, in order.
	Palette = []color.RGBA{{200, 30, 30, 255}, {30, 90, 200, 255}, {20, 150, 60, 255}, {200, 120, 0, 255}, {120, 40, 160, 255}}
)

// niceStep returns a round tick step (1, 2 or 5 × 10^k) that cuts span into about n parts.
func niceStep(span float64, n int) float64 {
	if span <= 0 {
		return 1
	}
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// WritePNG draws the chart, width × height pixels, as a PNG.
func (c Chart) WritePNG(w io.Writer, width, height int) error {
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), white)
	const scale = 2 // font scale
	left, right, top, bottom := 110, 30, 60, 90
	plot := image.Rect(left, top, width-right, height-bottom)
	xmax, ymax := 0.0, 0.0
	for _, s := range c.Series {
		for i := range s.X {
			xmax = math.Max(xmax, s.X[i])
			ymax = math.Max(ymax, s.Max[i])
		}
	}
	if xmax == 0 || ymax == 0 {
		return fmt.Errorf("scenario: chart %q has no data", c.Title)
	}
	xstep, ystep := niceStep(xmax, 8), niceStep(ymax*1.05, 6)
	xtop, ytop := math.Ceil(xmax/xstep)*xstep, math.Ceil(ymax*1.05/ystep)*ystep
	px := func(x float64) int { return plot.Min.X + int(math.Round(x/xtop*float64(plot.Dx()))) }
	py := func(y float64) int { return plot.Max.Y - int(math.Round(y/ytop*float64(plot.Dy()))) }
	// Grid, axes, ticks.
	for y := 0.0; y <= ytop+ystep/2; y += ystep {
		yy := py(y)
		line(img, plot.Min.X, yy, plot.Max.X, yy, grey)
		line(img, plot.Min.X-6, yy, plot.Min.X, yy, black)
		lbl := trimFloat(y)
		text(img, plot.Min.X-10-textWidth(lbl, scale), yy-7*scale/2, lbl, black, scale)
	}
	for x := 0.0; x <= xtop+xstep/2; x += xstep {
		xx := px(x)
		line(img, xx, plot.Min.Y, xx, plot.Max.Y, grey)
		line(img, xx, plot.Max.Y, xx, plot.Max.Y+6, black)
		lbl := trimFloat(x)
		text(img, xx-textWidth(lbl, scale)/2, plot.Max.Y+12, lbl, black, scale)
	}
	line(img, plot.Min.X, plot.Min.Y, plot.Min.X, plot.Max.Y, black)
	line(img, plot.Min.X, plot.Max.Y, plot.Max.X, plot.Max.Y, black)
	text(img, (width-textWidth(c.Title, scale))/2, 16, c.Title, black, scale)
	text(img, plot.Min.X+(plot.Dx()-textWidth(c.XLabel, scale))/2, height-40, c.XLabel, black, scale)
	textUp(img, 20, plot.Min.Y+(plot.Dy()+textWidth(c.YLabel, scale))/2, c.YLabel, black, scale)
	// Series: error bars (dodged a little so that they do not hide each other), lines, markers.
	for k, s := range c.Series {
		dodge := (k - len(c.Series)/2) * 3
		for i := range s.X {
			x := px(s.X[i]) + dodge
			line(img, x, py(s.Min[i]), x, py(s.Max[i]), s.Color)
			line(img, x-3, py(s.Min[i]), x+3, py(s.Min[i]), s.Color)
			line(img, x-3, py(s.Max[i]), x+3, py(s.Max[i]), s.Color)
			if i > 0 {
				line(img, px(s.X[i-1])+dodge, py(s.Med[i-1]), x, py(s.Med[i]), s.Color)
			}
			fill(img, image.Rect(x-3, py(s.Med[i])-3, x+4, py(s.Med[i])+4), s.Color)
		}
	}
	// Legend, top left inside the plot.
	lx, ly := plot.Min.X+14, plot.Min.Y+12
	lw := 0
	for _, s := range c.Series {
		lw = max(lw, textWidth(s.Name, scale))
	}
	box := image.Rect(lx-8, ly-8, lx+40+lw+8, ly+len(c.Series)*24+2)
	fill(img, box, white)
	rect(img, box, black)
	for k, s := range c.Series {
		y := ly + k*24 + 7
		line(img, lx, y, lx+28, y, s.Color)
		fill(img, image.Rect(lx+11, y-3, lx+18, y+4), s.Color)
		text(img, lx+38, y-7, s.Name, black, scale)
	}
	return png.Encode(w, img)
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func rect(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	line(img, r.Min.X, r.Min.Y, r.Max.X, r.Min.Y, c)
	line(img, r.Min.X, r.Max.Y, r.Max.X, r.Max.Y, c)
	line(img, r.Min.X, r.Min.Y, r.Min.X, r.Max.Y, c)
	line(img, r.Max.X, r.Min.Y, r.Max.X, r.Max.Y, c)
}

// line draws a 2-pixel-wide line (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for {
		for _, d := range [][2]int{{0, 0}, {1, 0}, {0, 1}} {
			if image.Pt(x0+d[0], y0+d[1]).In(img.Bounds()) {
				img.SetRGBA(x0+d[0], y0+d[1], c)
			}
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func textWidth(s string, scale int) int { return len(s) * 6 * scale }

// text draws s with its top left corner at (x, y); lower case is drawn as upper case.
func text(img *image.RGBA, x, y int, s string, c color.RGBA, scale int) {
	for i, r := range strings.ToUpper(s) {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs['?']
		}
		for row, bits := range g {
			for col := range 5 {
				if bits[col] == '#' {
					fill(img, image.Rect(x+(i*6+col)*scale, y+row*scale, x+(i*6+col+1)*scale, y+(row+1)*scale), c)
				}
			}
		}
	}
}

// textUp draws s rotated a quarter turn counter-clockwise, starting at (x, y) going up.
func textUp(img *image.RGBA, x, y int, s string, c color.RGBA, scale int) {
	for i, r := range strings.ToUpper(s) {
		g, ok := glyphs[r]
		if !ok {
			g = glyphs['?']
		}
		for row, bits := range g {
			for col := range 5 {
				if bits[col] == '#' {
					px, py := x+row*scale, y-(i*6+col+1)*scale
					fill(img, image.Rect(px, py, px+scale, py+scale), c)
				}
			}
		}
	}
}

// glyphs is a 5x7 font: each glyph is 7 rows of 5 columns.
var glyphs = map[rune][7]string{
	' ': {".....", ".....", ".....", ".....", ".....", ".....", "....."},
	'0': {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."},
	'1': {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."},
	'2': {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"},
	'3': {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."},
	'4': {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."},
	'5': {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."},
	'6': {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."},
	'7': {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."},
	'8': {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."},
	'9': {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."},
	'A': {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"},
	'B': {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."},
	'C': {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."},
	'D': {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."},
	'E': {"#####", "#....", "#....", "####.", "#....", "#....", "#####"},
	'F': {"#####", "#....", "#....", "####.", "#....", "#....", "#...."},
	'G': {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"},
	'H': {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"},
	'I': {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."},
	'J': {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."},
	'K': {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"},
	'L': {"#....", "#....", "#....", "#....", "#....", "#....", "#####"},
	'M': {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"},
	'N': {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"},
	'O': {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."},
	'P': {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."},
	'Q': {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"},
	'R': {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"},
	'S': {".####", "#....", "#....", ".###.", "....#", "....#", "####."},
	'T': {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."},
	'U': {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."},
	'V': {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."},
	'W': {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."},
	'X': {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"},
	'Y': {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."},
	'Z': {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"},
	'.': {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."},
	',': {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."},
	'-': {".....", ".....", ".....", "#####", ".....", ".....", "....."},
	'+': {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."},
	'=': {".....", ".....", "#####", ".....", "#####", ".....", "....."},
	'(': {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."},
	')': {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."},
	'/': {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."},
	'%': {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"},
	':': {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."},
	'?': {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."},
}
