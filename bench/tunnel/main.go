// Command tunnel benchmarks `braid tunnel` on emulated links and writes its section of
// bench/BENCH.md.
//
// Two sites a and b are joined by two rate-limited paths (300 and 100 Mbit/s, 5 ms one way).
// Baseline: one TCP flow over each path alone, without a tunnel, side by side in the same run;
// their sum is what an ideal aggregation reaches. Then one TCP flow through braid's tunnel over
// both paths, with the reorder buffer on and off, and UDP offered below capacity, counting the
// receiving sockets' drops (Udp RcvbufErrors of b's namespace). The tunnels run as `braid tunnel`
// processes, the traffic as `braid traffic` processes; this process only runs the emulator.
//
// A second table takes paths of unequal delay (docs/scheduling.md, "Unequal paths"): 50 Mbit/s
// at 5 ms beside 25 at 50 ms, the same with 1 % loss on each, and 40, 20 and 10 Mbit/s at 5, 25
// and 60 ms; capacities measured; cubic flows (and one bbr flow) through one tunnel in a row,
// beside each path alone in the same lab.
//
// A third table is the hub (hub.go): 4 sites at once through one hub, its uplinks read by one
// socket each and by one per core, with the hub's CPU per core.
//
// Usage: go run ./bench/tunnel -braid bin/braid -runs 5 -out bench/out/tunnel.md
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

var rates = []uint64{300e6, 100e6}

func main() {
	braid := flag.String("braid", "bin/braid", "path of the braid binary")
	runs := flag.Int("runs", 5, "runs per figure; the table shows medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	uruns := flag.Int("unequal-runs", 3, "runs per figure of the unequal-paths table")
	hruns := flag.Int("hub-runs", 3, "runs per figure of the hub table")
	hubOnly := flag.Bool("hub-only", false, "run only the hub table")
	unequalOnly := flag.String("unequal-only", "", "run only these cases of the unequal-paths table (numbers from 1, comma-separated)")
	out := flag.String("out", "bench/out/tunnel.md", "where to write this section (Markdown)")
	flag.Parse()
	log.SetFlags(0)
	if _, err := os.Stat(*braid); err != nil {
		drive.Fatalf("braid binary: %v (run 'make build')", err)
	}
	dur := 10 * time.Second
	if *quick {
		dur = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()

	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	drive.Section(w, "Multipath tunnel")
	if *hubOnly {
		hubTable(ctx, w, *braid, *hruns, dur)
		writeOut(*out, md.Bytes())
		return
	}
	if *unequalOnly != "" {
		cases, err := drive.Pick(unequalCases, *unequalOnly, "case")
		if err != nil {
			drive.Fatalf("-unequal-only: %v", err)
		}
		unequal(ctx, w, *braid, *uruns, *quick, cases)
		writeOut(*out, md.Bytes())
		return
	}
	fmt.Fprintf(w, "`go run ./bench/tunnel -braid bin/braid -runs %d`: two paths of 300 and 100 Mbit/s (5 ms one way,\n"+
		"default queues), one TCP flow for %v. Baseline: the same flow over each path alone without a\ntunnel; ideal aggregation is their sum. The tunnel is paced at the uplinks' configured capacities,\n"+
		"except in the last row, where no capacity is configured and braid measures them. Medians of %d runs.\n\n", *runs, dur, *runs)

	var base1, base2, on, off, measured []float64
	var udpDrops, udpLoss []float64
	for range *runs {
		b1, b2 := baseline(ctx, *braid, dur)
		base1, base2 = append(base1, b1), append(base2, b2)
		on = append(on, tunnelRun(ctx, *braid, dur, true, rates, nil))
		off = append(off, tunnelRun(ctx, *braid, dur, false, rates, nil))
		measured = append(measured, tunnelRun(ctx, *braid, dur, true, nil, nil))
		var drops, loss float64
		tunnelRun(ctx, *braid, dur, true, rates, func(l *lab.Lab) {
			before := drive.SNMP(ctx, l, "b", "Udp", "RcvbufErrors")
			res := udp(ctx, l, *braid, dur, 300e6)
			drops, loss = float64(drive.SNMP(ctx, l, "b", "Udp", "RcvbufErrors")-before), res.LossPercent
		})
		udpDrops, udpLoss = append(udpDrops, drops), append(udpLoss, loss)
	}
	sum := kit.Median(base1) + kit.Median(base2)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| scenario\t| goodput\t| ratio to the sum of the paths\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|")
	fmt.Fprintf(tw, "| path 1 alone, no tunnel (300 Mbit/s)\t| %.1f Mbit/s\t| %.3f\t|\n", kit.Median(base1)/1e6, kit.Median(base1)/sum)
	fmt.Fprintf(tw, "| path 2 alone, no tunnel (100 Mbit/s)\t| %.1f Mbit/s\t| %.3f\t|\n", kit.Median(base2)/1e6, kit.Median(base2)/sum)
	fmt.Fprintf(tw, "| braid tunnel, both paths, reorder on\t| %.1f Mbit/s\t| %.3f\t|\n", kit.Median(on)/1e6, kit.Median(on)/sum)
	fmt.Fprintf(tw, "| braid tunnel, both paths, reorder off\t| %.1f Mbit/s\t| %.3f\t|\n", kit.Median(off)/1e6, kit.Median(off)/sum)
	fmt.Fprintf(tw, "| braid tunnel, capacities measured\t| %.1f Mbit/s\t| %.3f\t|\n", kit.Median(measured)/1e6, kit.Median(measured)/sum)
	tw.Flush()
	fmt.Fprintf(w, "\nReorder on vs off: %.3f (runs where on >= off: %d of %d).\n", kit.Median(on)/kit.Median(off), countGE(on, off), len(on))
	fmt.Fprintf(w, "UDP offered at 300 Mbit/s (below the 400 Mbit/s of the paths) through the tunnel: median loss %.2f %%,\n"+
		"median UdpRcvbufErrors at the receiving site %.0f (max %.0f).\n", kit.Median(udpLoss), kit.Median(udpDrops), maxOf(udpDrops))
	fmt.Fprintf(w, "\nGoodput is TCP payload at the receiver (steady state); rates count IP bytes, so one path alone\n"+
		"reaches at most 0.965 of its rate, and the tunnel's 72 bytes of overhead per packet take another 5 %%.\n"+
		"Links emulated by: %s.\n\n", lab.EmulatorName)
	unequal(ctx, w, *braid, *uruns, *quick, unequalCases)
	hubTable(ctx, w, *braid, *hruns, dur)
	writeOut(*out, md.Bytes())
}

// writeOut writes the section to out.
func writeOut(out string, md []byte) {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err == nil {
		os.WriteFile(out, md, 0o644)
	}
}

// topology: a and b joined by the two rate-limited links.
func topology() *topo.Topology {
	var shapes []topo.Shape
	for _, r := range rates {
		shapes = append(shapes, topo.Shape{Rate: r, Delay: 5 * time.Millisecond})
	}
	return kit.ParallelLinks("tunbench", shapes...)
}

func up(ctx context.Context) *lab.Lab {
	l, err := lab.Up(ctx, topology(), lab.Options{})
	if err != nil {
		drive.Fatal(err)
	}
	return l
}

// baseline measures one flow over each path alone.
func baseline(ctx context.Context, braid string, dur time.Duration) (float64, float64) {
	l := up(ctx)
	defer l.Close()
	defer drive.Server(l, braid, "0.0.0.0:5201").Stop()
	return bulk(ctx, l, braid, "10.9.0.2:5201", dur), bulk(ctx, l, braid, "10.9.1.2:5201", dur)
}

// tunnelRun runs braid tunnel on both hosts (capacities configured or, with nil, measured),
// then one bulk flow a -> b through it (or fn).
func tunnelRun(ctx context.Context, braid string, dur time.Duration, reorder bool, capacities []uint64, fn func(*lab.Lab)) float64 {
	l := up(ctx)
	defer l.Close()
	pair, err := roles.StartTunnelPair(ctx, l, braid, roles.SiteSpec{Paths: 2, Outer: 4, Capacities: capacities, Reorder: &reorder}, 4)
	if err != nil {
		drive.Fatal(err)
	}
	defer pair.Close()
	defer drive.Server(l, braid, "10.255.0.2:5201").Stop()
	if fn != nil {
		fn(l)
		return 0
	}
	return bulk(ctx, l, braid, "10.255.0.2:5201", dur)
}

func bulk(ctx context.Context, l *lab.Lab, braid, addr string, dur time.Duration) float64 {
	return drive.Bulk(ctx, l, braid, addr, dur).Steady
}

func udp(ctx context.Context, l *lab.Lab, braid string, dur time.Duration, rate uint64) traffic.UDPResult {
	var res traffic.UDPResult
	drive.RunJSON(ctx, l, braid, &res, "traffic", "udp", "10.255.0.2:5201", "--rate", strconv.FormatUint(rate, 10), "--size", "1300", "--duration", dur.String(), "--json")
	return res
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func countGE(a, b []float64) int {
	n := 0
	for i := range a {
		if a[i] >= b[i] {
			n++
		}
	}
	return n
}

// unequalCase is a set of paths of unequal delay.
type unequalCase struct {
	name   string
	shapes []topo.Shape
}

var unequalCases = []unequalCase{
	{"50 Mbit/s at 5 ms + 25 Mbit/s at 50 ms", []topo.Shape{
		{Rate: 50e6, Delay: 5 * time.Millisecond}, {Rate: 25e6, Delay: 50 * time.Millisecond}}},
	{"the same, 1 % loss on each", []topo.Shape{
		{Rate: 50e6, Delay: 5 * time.Millisecond, Loss: 1}, {Rate: 25e6, Delay: 50 * time.Millisecond, Loss: 1}}},
	{"40, 20 and 10 Mbit/s at 5, 25 and 60 ms", []topo.Shape{
		{Rate: 40e6, Delay: 5 * time.Millisecond}, {Rate: 20e6, Delay: 25 * time.Millisecond}, {Rate: 10e6, Delay: 60 * time.Millisecond}}},
}

// unequal writes the unequal-paths table: per case and run, in one lab, one cubic flow over each
// path alone (no tunnel), then through one braid tunnel with capacities measured a first cubic
// flow, the next cubic flow, and a bbr flow; then, through a tunnel on the first (the fastest)
// path only, a cubic flow of warmUp that lets its estimator find the path's rate, and a bbr
// flow: the bbr flow over every path compares with one that differs from it in nothing but the
// other paths (the paths alone have no tunnel header, and a new tunnel starts from its
// estimator's guess).
func unequal(ctx context.Context, w io.Writer, braid string, runs int, quick bool, cases []unequalCase) {
	alone, flow, warmUp := 10*time.Second, 20*time.Second, 5*time.Second
	if quick {
		alone, flow, warmUp, runs = 3*time.Second, 4*time.Second, 2*time.Second, 1
	}
	fmt.Fprintf(w, "\n### Paths of unequal delay\n\n"+
		"One TCP flow per figure, cubic unless said (set with `braid traffic bulk --cc`): each path alone for %v\n"+
		"without a tunnel, then through one `braid tunnel` (default configuration: capacities measured, the\n"+
		"queue planner) three flows of %v in a row, the first through the new tunnel; then, through a tunnel on\n"+
		"the first path only, a cubic flow of %v (its estimator finds the path's rate) and a bbr flow of %v,\n"+
		"which differs from the bbr flow over every path only in the other paths. Steady goodput\n"+
		"(the median of the 1 s samples after the first); medians of %d runs, each in its own lab.\n\n", alone, flow, warmUp, flow, runs)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| paths\t| each path alone\t| sum\t| first flow\t| next flow\t| bbr flow\t| bbr, first path only\t| next / sum\t| next / best path\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, c := range cases {
		paths := make([][]float64, len(c.shapes))
		var sums, bests, first, next, bbr, bbr1, rsum, rbest []float64
		for range runs {
			l, err := lab.Up(ctx, kit.ParallelLinks("tununeq", c.shapes...), lab.Options{})
			if err != nil {
				drive.Fatal(err)
			}
			srv := drive.Server(l, braid, "0.0.0.0:5201")
			sum, best := 0.0, 0.0
			for i := range c.shapes {
				g := ccBulk(ctx, l, braid, fmt.Sprintf("10.9.%d.2:5201", i), alone, "cubic")
				paths[i] = append(paths[i], g)
				sum, best = sum+g, max(best, g)
			}
			pair, err := roles.StartTunnelPair(ctx, l, braid, roles.SiteSpec{Paths: len(c.shapes), Outer: 4}, 4)
			if err != nil {
				drive.Fatal(err)
			}
			f1 := ccBulk(ctx, l, braid, "10.255.0.2:5201", flow, "cubic")
			f2 := ccBulk(ctx, l, braid, "10.255.0.2:5201", flow, "cubic")
			fb := ccBulk(ctx, l, braid, "10.255.0.2:5201", flow, "bbr")
			pair.Close()
			one, err := roles.StartTunnelPair(ctx, l, braid, roles.SiteSpec{Paths: 1, Outer: 4}, 4)
			if err != nil {
				drive.Fatal(err)
			}
			ccBulk(ctx, l, braid, "10.255.0.2:5201", warmUp, "cubic")
			fb1 := ccBulk(ctx, l, braid, "10.255.0.2:5201", flow, "bbr")
			one.Close()
			srv.Stop()
			l.Close()
			sums, bests = append(sums, sum), append(bests, best)
			first, next, bbr, bbr1 = append(first, f1), append(next, f2), append(bbr, fb), append(bbr1, fb1)
			rsum, rbest = append(rsum, f2/sum), append(rbest, f2/best)
		}
		var each []string
		for i := range paths {
			each = append(each, fmt.Sprintf("%.1f", kit.Median(paths[i])/1e6))
		}
		fmt.Fprintf(tw, "| %s\t| %s Mbit/s\t| %.1f Mbit/s\t| %.1f Mbit/s\t| %.1f Mbit/s\t| %.1f Mbit/s\t| %.1f Mbit/s\t| %.3f\t| %.3f\t|\n",
			c.name, strings.Join(each, " + "), kit.Median(sums)/1e6, kit.Median(first)/1e6,
			kit.Median(next)/1e6, kit.Median(bbr)/1e6, kit.Median(bbr1)/1e6, kit.Median(rsum), kit.Median(rbest))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nThe ratios are medians of each run's ratio. bbr cannot aggregate paths whose delays differ by more\n"+
		"than its window (two minimum RTTs of its bandwidth estimate) can queue: it gets about the fast path\n"+
		"through the tunnel (the column beside it), which carries less than the path alone by the tunnel's header.\n")
}

// ccBulk runs one bulk flow from a to addr with congestion control cc and returns its steady
// goodput.
func ccBulk(ctx context.Context, l *lab.Lab, braid, addr string, dur time.Duration, cc string) float64 {
	var res traffic.BulkResult
	drive.RunJSON(ctx, l, braid, &res, "traffic", "bulk", addr, "--duration", dur.String(), "--cc", cc, "--json")
	return res.Steady
}
