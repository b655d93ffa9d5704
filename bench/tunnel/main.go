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
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/lab"
	"braid/internal/lab/scenario"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

var rates = []uint64{300e6, 100e6}

func main() {
	braid := flag.String("braid", "bin/braid", "path of the braid binary")
	runs := flag.Int("runs", 5, "runs per figure; the table shows medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
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
	sum := scenario.Median(base1) + scenario.Median(base2)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| scenario\t| goodput\t| ratio to the sum of the paths\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|")
	fmt.Fprintf(tw, "| path 1 alone, no tunnel (300 Mbit/s)\t| %.1f Mbit/s\t| %.3f\t|\n", scenario.Median(base1)/1e6, scenario.Median(base1)/sum)
	fmt.Fprintf(tw, "| path 2 alone, no tunnel (100 Mbit/s)\t| %.1f Mbit/s\t| %.3f\t|\n", scenario.Median(base2)/1e6, scenario.Median(base2)/sum)
	fmt.Fprintf(tw, "| braid tunnel, both paths, reorder on\t| %.1f Mbit/s\t| %.3f\t|\n", scenario.Median(on)/1e6, scenario.Median(on)/sum)
	fmt.Fprintf(tw, "| braid tunnel, both paths, reorder off\t| %.1f Mbit/s\t| %.3f\t|\n", scenario.Median(off)/1e6, scenario.Median(off)/sum)
	fmt.Fprintf(tw, "| braid tunnel, capacities measured\t| %.1f Mbit/s\t| %.3f\t|\n", scenario.Median(measured)/1e6, scenario.Median(measured)/sum)
	tw.Flush()
	fmt.Fprintf(w, "\nReorder on vs off: %.3f (runs where on >= off: %d of %d).\n", scenario.Median(on)/scenario.Median(off), countGE(on, off), len(on))
	fmt.Fprintf(w, "UDP offered at 300 Mbit/s (below the 400 Mbit/s of the paths) through the tunnel: median loss %.2f %%,\n"+
		"median UdpRcvbufErrors at the receiving site %.0f (max %.0f).\n", scenario.Median(udpLoss), scenario.Median(udpDrops), maxOf(udpDrops))
	fmt.Fprintf(w, "\nGoodput is TCP payload at the receiver (steady state); rates count IP bytes, so one path alone\n"+
		"reaches at most 0.965 of its rate, and the tunnel's 72 bytes of overhead per packet take another 5 %%.\n"+
		"Links emulated by: %s.\n\n", lab.EmulatorName)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err == nil {
		os.WriteFile(*out, md.Bytes(), 0o644)
	}
}

// topology: a and b joined by the two rate-limited links.
func topology() *topo.Topology {
	var shapes []topo.Shape
	for _, r := range rates {
		shapes = append(shapes, topo.Shape{Rate: r, Delay: 5 * time.Millisecond})
	}
	return scenario.ParallelLinks("tunbench", shapes...)
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
	pair, err := scenario.StartTunnelPair(ctx, l, braid, scenario.SiteSpec{Paths: 2, Outer: 4, Capacities: capacities, Reorder: &reorder}, 4)
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
