package mplb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"path/filepath"
	"text/tabwriter"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lb/maglev"
	"braid/internal/lb/xdp"
	"braid/internal/mptcp/info"
)

func init() {
	kit.Register(kit.Scenario{Name: "mplb", Summary: "the MPLB paper: a client with two 50 Mbit/s links downloads files through an MPTCP-unaware balancer and through braid lb; time, throughput, 95 % CI; PNG figures", Run: runMPLB})
}

// The paper's parameters: two 50 Mbit/s client links, two backends with the same address, 30
// runs per point, file sizes on a log scale (the paper's axis; the exact sizes are not given,
// so decades from 10 kB to 100 MB are used; --quick stops at 10 MB).
const (
	mplbRate = 50e6
	mplbRuns = 30
)

var mplbSizes = []int64{10e3, 100e3, 1e6, 10e6, 100e6}

// mplbBalancer is one of the two balancers compared.
type mplbBalancer struct {
	name string
	cfg  xdp.Config
}

// mplbPoint is what one balancer measured for one file size.
type mplbPoint struct {
	times  []float64 // seconds, dial to last byte
	rates  []float64 // Mbit/s
	single int       // downloads that ran on one subflow only (the join was reset)
}

// MPLBUnawareSeed returns a hash seed with which the paper's MPTCP-unaware balancer (a hash of
// the source and destination addresses over the two backends) sends the client's two
// addresses to different backends, as the paper arranged by choosing the addresses.
func MPLBUnawareSeed() uint32 {
	table := maglev.Table([]maglev.Backend{{Name: "b0", ID: 0, Weight: 1}, {Name: "b1", ID: 1, Weight: 1}}, xdp.TableSize)
	for seed := uint32(1); ; seed++ {
		a := table[xdp.FlowHash(MPLBClient[0], MPLBVIP, 0, 0, seed, true)%xdp.TableSize]
		b := table[xdp.FlowHash(MPLBClient[1], MPLBVIP, 0, 0, seed, true)%xdp.TableSize]
		if a != b {
			return seed
		}
	}
}

func runMPLB(ctx context.Context, w io.Writer, o kit.Options) error {
	runs, sizes := mplbRuns, mplbSizes
	if o.Quick {
		runs, sizes = 3, mplbSizes[:4]
	}
	if o.Reps > 0 {
		runs = o.Reps
	}
	balancers := []mplbBalancer{
		{"unaware (address hash)", xdp.Config{Aware: false, HashAddrs: true, HashSeed: MPLBUnawareSeed()}},
		{"braid lb", xdp.Config{Aware: true, HashSeed: 7}},
	}
	fmt.Fprintf(w, "MPLB (Liénardy and Donnet, ANRW '16), reproduced: a client with two %d Mbit/s links (kernel veth\n"+
		"pairs with TBF), a balancer, two backends holding the same address (MAC rewrite, direct\n"+
		"server return), MPTCP with the kernel path manager opening a second subflow from the\n"+
		"client's second address. Download time from dial to last byte and throughput: mean and\n"+
		"95 %% confidence interval (Student t) over %d runs per size. The paper: a factor of 2 in time and\n"+
		"throughput between its MPTCP-unaware balancer and MPLB.\n\n", int(mplbRate/1e6), runs)
	results := make([][]mplbPoint, len(balancers))
	for i, b := range balancers {
		pts, err := mplbMeasure(ctx, o, b, sizes, runs)
		if err != nil {
			return fmt.Errorf("mplb: %s: %w", b.name, err)
		}
		results[i] = pts
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tunaware time (s)\tbraid lb time (s)\tunaware Mbit/s\tbraid lb Mbit/s\tthroughput ratio\tjoins reset (unaware / braid lb)\t")
	for si, size := range sizes {
		u, a := results[0][si], results[1][si]
		um, uc := kit.MeanCI(u.times)
		am, ac := kit.MeanCI(a.times)
		ur, urc := kit.MeanCI(u.rates)
		ar, arc := kit.MeanCI(a.rates)
		fmt.Fprintf(tw, "%s\t%.3f ± %.3f\t%.3f ± %.3f\t%.1f ± %.1f\t%.1f ± %.1f\t%.2fx\t%d/%d / %d/%d\t\n", sizeName(size), um, uc, am, ac, ur, urc, ar, arc, ar/ur,
			u.single, len(u.times), a.single, len(a.times))
	}
	tw.Flush()
	fleet, fleetErr := mplbFleetReport(ctx, w, o, sizes, runs, results[1])
	if len(fleet) == len(sizes) {
		balancers, results = append(balancers, mplbBalancer{name: mplbFleetName}), append(results, fleet)
	}
	plotErr := mplbPlots(o, balancers, sizes, results)
	c := mplbClaims(sizes, results[0], results[1])
	if len(fleet) == len(sizes) {
		mplbFleetClaims(c, sizes, results[1], fleet)
	}
	c.Print(w)
	return errors.Join(plotErr, fleetErr, c.Err())
}

// mplbClaims are the paper's claims on the largest file, where the transfer, not the
// handshakes, sets the time: braid lb carries at least 1.5 times what the unaware balancer does
// (the paper: 2) and no more than the client's two links; every braid lb download of 1 MB and
// more kept its second subflow; the unaware balancer reset the join of most (the paper's cause:
// the join reaches the other backend).
func mplbClaims(sizes []int64, unaware, aware []mplbPoint) *kit.Claims {
	c := &kit.Claims{}
	last := len(sizes) - 1
	ur, _ := kit.MeanCI(unaware[last].rates)
	ar, _ := kit.MeanCI(aware[last].rates)
	name := sizeName(sizes[last])
	c.AtLeast(name+": braid lb throughput over the unaware balancer's (paper: 2)", ar/max(ur, 1e-9), 1.5, "%.2f")
	c.AtMost(name+": braid lb throughput, within the client's two links", ar, 2*mplbRate/1e6, "%.1f Mbit/s")
	lost, n := 0, 0
	for i, size := range sizes {
		if size >= 1e6 {
			lost, n = lost+aware[i].single, n+len(aware[i].times)
		}
	}
	c.Add("braid lb: downloads of 1 MB and more that lost their second subflow", lost == 0, "%d of %d, bound 0", lost, n)
	u := unaware[last]
	c.Add(name+": unaware balancer resets the join (the paper's cause)", 2*u.single >= len(u.times), "%d of %d, bound >= half", u.single, len(u.times))
	return c
}

func sizeName(n int64) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%g MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%g kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

// mplbMeasure builds the lab with one balancer and downloads every size runs times.
func mplbMeasure(ctx context.Context, o kit.Options, b mplbBalancer, sizes []int64, runs int) (pts []mplbPoint, err error) {
	l, err := lab.Up(ctx, MPLBTopology(2, mplbRate), lab.Options{Logger: o.Logger, Seed: o.Seed})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := l.Close(); err == nil {
			err = cerr
		}
	}()
	if err := MPLBPrepare(l, 2); err != nil {
		return nil, err
	}
	srv, err := StartMPLBServers(l, 2)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	bal, err := StartMPLBBalancer(l, 2, b.cfg)
	if err != nil {
		return nil, err
	}
	defer bal.Close()
	if err := MPLBEndpoint(ctx, l); err != nil {
		return nil, err
	}
	return measureSizes(sizes, runs, func(size int64) (time.Duration, bool, error) {
		return mplbDownload(ctx, l, size, subflowJoined)
	})
}

// measureSizes downloads every size runs times with download, which times one download and
// reports whether its connection kept its second subflow.
func measureSizes(sizes []int64, runs int, download func(size int64) (time.Duration, bool, error)) ([]mplbPoint, error) {
	var pts []mplbPoint
	for _, size := range sizes {
		var p mplbPoint
		for r := 0; r < runs; r++ {
			d, joined, err := download(size)
			if err != nil {
				return nil, fmt.Errorf("download of %s: %w", sizeName(size), err)
			}
			p.times = append(p.times, d.Seconds())
			p.rates = append(p.rates, float64(size)*8/d.Seconds()/1e6)
			if !joined {
				p.single++
			}
		}
		pts = append(pts, p)
	}
	return pts, nil
}

// mplbDownload times one download on a new connection and reports whether the connection
// still had its second subflow at the end, as joined tells.
func mplbDownload(ctx context.Context, l *lab.Lab, size int64, joined func(*net.TCPConn) bool) (time.Duration, bool, error) {
	start := time.Now()
	c, err := MPLBDial(ctx, l)
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := MPLBDownload(c, uint64(size)); err != nil {
		return 0, false, err
	}
	d := time.Since(start)
	// Small files finish before the join does: give it a moment to tell a reset from a join
	// still under way.
	ok := joined(c)
	for i := 0; !ok && i < 20; i++ {
		time.Sleep(10 * time.Millisecond)
		ok = joined(c)
	}
	return d, ok, nil
}

// subflowJoined reports whether c has an additional subflow (MPTCP_INFO).
func subflowJoined(c *net.TCPConn) bool {
	ci, err := info.Info(c)
	return err == nil && ci.Subflows >= 1
}

// mplbPlots draws the download time and the throughput per file size, one series per
// balancer, means with their 95 % confidence intervals, into o.Out.
func mplbPlots(o kit.Options, balancers []mplbBalancer, sizes []int64, results [][]mplbPoint) error {
	for _, fig := range []struct {
		file, title, ylabel string
		logY                bool
		value               func(p mplbPoint) []float64
	}{
		{"mplb-time.png", TimeTitle, TimeLabel, true, func(p mplbPoint) []float64 { return p.times }},
		{"mplb-throughput.png", ThroughputTitle, ThroughputLabel, false, func(p mplbPoint) []float64 { return p.rates }},
	} {
		s := Summary{Sizes: sizes}
		for i, b := range balancers {
			s.Names = append(s.Names, b.name)
			var mean, half []float64
			for si := range sizes {
				v := fig.value(results[i][si])
				m, h := kit.MeanCI(v)
				mean, half = append(mean, m), append(half, h)
				s.Runs = len(v)
			}
			s.Mean, s.Half = append(s.Mean, mean), append(s.Half, half)
		}
		if err := WriteFigure(filepath.Join(o.Out, fig.file), fig.title, fig.ylabel, fig.logY, s); err != nil {
			return err
		}
	}
	return nil
}

// The figures' titles and value axes.
const (
	TimeTitle       = "MPLB: download time per file size, dial to last byte"
	TimeLabel       = "download time (s)"
	ThroughputTitle = "MPLB: throughput per file size"
	ThroughputLabel = "throughput (Mbit/s)"
)

// Summary is one figure's data: per balancer (Names) and file size, the mean over Runs runs and
// the half-width of its 95 % confidence interval.
type Summary struct {
	Names      []string
	Sizes      []int64 // bytes
	Mean, Half [][]float64
	Runs       int
}

// WriteFigure draws s against the file size (a log axis) with the intervals as error bars; logY
// for values spanning decades (the times).
func WriteFigure(path, title, ylabel string, logY bool, s Summary) error {
	ch := kit.Chart{Title: title, XLabel: "file size", YLabel: ylabel, LogX: true, LogY: logY,
		XTick: func(v float64) string { return sizeName(int64(math.Round(v))) },
		Bars:  fmt.Sprintf("means of %d runs; bars: 95 %% confidence interval (Student t)", s.Runs)}
	for i, name := range s.Names {
		if len(s.Mean[i]) != len(s.Sizes) || len(s.Half[i]) != len(s.Sizes) {
			return fmt.Errorf("mplb figure %s: %s has %d means for %d sizes", path, name, len(s.Mean[i]), len(s.Sizes))
		}
		se := kit.Series{Name: name, Color: kit.Palette[i%len(kit.Palette)]}
		for si, size := range s.Sizes {
			m, h := s.Mean[i][si], s.Half[i][si]
			se.X, se.Y = append(se.X, float64(size)), append(se.Y, m)
			se.Lo, se.Hi = append(se.Lo, m-h), append(se.Hi, m+h)
		}
		ch.Series = append(ch.Series, se)
	}
	return ch.Save(path)
}
