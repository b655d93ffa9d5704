// Command rbpm benchmarks RBPM and writes its section of bench/BENCH.md.
//
// For each of the RBPM paper's scenarios (rbpm.RBPMScenarios: four heterogeneous paths on
// emulated links with 100-packet drop-tail queues, a 200 KB receive buffer, reno):
//
//   - kernel MPTCP: a bulk upload over one subflow per path, with braid pm's fullmesh policy
//     (the kernel's default scheduler over every subflow: the baseline) and with its rbpm
//     policy (the same subflows, slow ones demoted to backup), alternating, -runs times each;
//     also on scenario 1 with a 2 MB buffer and shallow queues (rbpm.RBPMShallowS1), where
//     the slow path rather than the buffer limits the kernel;
//   - braid tunnel: one TCP flow through the tunnel with each scheduler (wrr with MPT's default
//     weights and with rate-proportional ones, minrtt, blest, ecf, rbpm), the reorder buffer
//     bounded to the same 200 KB, -tunnel-runs times each.
//
// The tables show medians, the ratios the issue asks for and the paper's figures.
//
// The kernel series and each scenario's tunnel series run side by side on labs of their own.
//
// Usage: go run ./bench/rbpm -braid bin/braid -runs 5 -out bench/out/rbpm.md
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
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/rbpm"
	"braid/internal/lab"
)

// schedulers are the tunnel schedulers measured (-schedulers).
var schedulers = rbpm.RBPMTunnelSchedulers

func main() {
	braid := flag.String("braid", "bin/braid", "path of the braid binary (the tunnel rows run it)")
	runs := flag.Int("runs", 3, "kernel runs per configuration; the tables show medians")
	tunnelRuns := flag.Int("tunnel-runs", 0, "tunnel runs per scheduler (each row is six schedulers); 0: as -runs")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	only := flag.String("only", "", "run only one table: kernel or tunnel (for exploring; make bench runs both)")
	scheds := flag.String("schedulers", "", "comma-separated tunnel schedulers to run (for exploring; default all, as make bench)")
	out := flag.String("out", "bench/out/rbpm.md", "where to write this section (Markdown)")
	flag.Parse()
	log.SetFlags(0)
	if *only != "" && *only != "kernel" && *only != "tunnel" {
		log.Fatalf("-only: %q is neither kernel nor tunnel", *only)
	}
	if *scheds != "" {
		var keep []string
		for _, s := range strings.Split(*scheds, ",") {
			if !slices.Contains(rbpm.RBPMTunnelSchedulers, s) {
				log.Fatalf("-schedulers: no scheduler %q (%v)", s, rbpm.RBPMTunnelSchedulers)
			}
			keep = append(keep, s)
		}
		schedulers = keep
	}
	if *tunnelRuns <= 0 {
		*tunnelRuns = *runs
	}
	self, err := filepath.Abs(*braid)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	dur := 30 * time.Second
	if *quick {
		dur = 6 * time.Second
	}
	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	drive.Section(w, "RBPM: kernel MPTCP with braid pm, and braid tunnel's schedulers")
	fmt.Fprintf(w, "`go run ./bench/rbpm -runs %d -tunnel-runs %d` (%s, %d cores). The RBPM paper's scenarios on %s\nlinks (100-packet drop-tail queues), receive buffer %d B, reno, %v bulk uploads. Goodput in\nbytes/s, medians of %d runs (kernel) and %d runs (tunnel).\n\n",
		*runs, *tunnelRuns, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), lab.EmulatorName, rbpm.RBPMBuffer, dur, *runs, *tunnelRuns)
	var (
		mu       sync.Mutex
		failures []string
	)
	fail := func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(f, a...))
		log.Print(failures[len(failures)-1])
	}

	// The kernel series and the tunnel's series of each scenario run side by side, each on
	// its own lab: their links carry at most 8 Mbit/s, so together they keep well below the
	// machine's cores (the section says how busy it was), and the whole takes the time of the longest
	// series instead of the sum (53 minutes one after the other at -runs 5).
	var kernel, tunnel bytes.Buffer
	var wg sync.WaitGroup
	t0 := time.Now()
	if *only != "tunnel" {
		wg.Go(func() { kernelTable(ctx, &kernel, *runs, dur, fail) })
	}
	if *only != "kernel" {
		wg.Go(func() { tunnelTable(ctx, &tunnel, self, *tunnelRuns, dur, fail) })
	}
	busy0, ok0 := kit.MachineBusy()
	wg.Wait()
	w.Write(kernel.Bytes())
	w.Write(tunnel.Bytes())
	if busy1, ok1 := kit.MachineBusy(); ok0 && ok1 {
		wall := time.Since(t0)
		fmt.Fprintf(w, "\nThe series ran side by side for %v; the machine (%d cores) was %.2f cores busy on average\n(/proc/stat), so they did not compete for CPU.\n",
			wall.Round(time.Second), runtime.NumCPU(), (busy1-busy0).Seconds()/wall.Seconds())
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "\nFailed runs (left out of the medians):\n\n")
		for _, f := range failures {
			fmt.Fprintf(w, "- %s\n", f)
		}
	}
	if *out != "" {
		if err := os.WriteFile(*out, md.Bytes(), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	if len(failures) > 0 {
		os.Exit(1)
	}
}

// kernelTable measures kernel MPTCP with and without the rbpm policy on every scenario.
func kernelTable(ctx context.Context, w io.Writer, runs int, dur time.Duration, fail func(string, ...any)) {
	fmt.Fprintf(w, "### Kernel MPTCP\n\nOne subflow per path; baseline: braid pm fullmesh (the kernel's default scheduler over all\nsubflows); braid: braid pm rbpm (same subflows, slow ones set to backup). The receive buffer is\ntcp_rmem's maximum. S1' is scenario 1 with a 2 MB buffer and queues of one bandwidth-delay\nproduct (at least 15 KB): not the paper's, the case where the slow path rather than the buffer\nlimits upstream MPTCP.\n\n")
	fmt.Fprintln(w, "| scenario | default (B/s) | rbpm (B/s) | ratio | paper: original MPTCP | paper: RBPM |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, sc := range append(rbpm.RBPMScenarios(), rbpm.RBPMShallowS1()) {
		var base, rb, ratios []float64
		for r := 0; r < runs; r++ {
			b, err := rbpm.RBPMKernel(ctx, sc, false, dur, kit.Options{})
			if err != nil {
				fail("kernel %s run %d, default: %v", sc.Name, r+1, err)
				continue
			}
			p, err := rbpm.RBPMKernel(ctx, sc, true, dur, kit.Options{})
			if err != nil {
				fail("kernel %s run %d, rbpm: %v", sc.Name, r+1, err)
				continue
			}
			log.Printf("kernel %s run %d: default %.0f B/s, rbpm %.0f B/s (%s)", sc.Name, r+1, b.Goodput, p.Goodput, p.Note)
			base, rb = append(base, b.Goodput), append(rb, p.Goodput)
			if b.Goodput > 0 {
				ratios = append(ratios, p.Goodput/b.Goodput)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", sc.Name, num(base), num(rb), ratio(ratios), paper(sc.PaperOriginal), paper(sc.PaperRBPM))
	}
	fmt.Fprintln(w, "\nratio: median of the per-run ratios (rbpm over default, measured back to back).")
}

// tunnelTable measures one TCP flow through braid tunnel with each scheduler on every scenario.
func tunnelTable(ctx context.Context, w io.Writer, self string, runs int, dur time.Duration, fail func(string, ...any)) {

	fmt.Fprintf(w, "\n### braid tunnel\n\nOne TCP flow through the tunnel over the same links. The inner TCP receiver is bounded as in\nthe kernel rows (tcp_rmem's maximum %d B on the receiving host), and so is the tunnel's reorder\nbuffer; path capacities not configured. wrr: MPT's default weights (all 1); wrr-rates: weights in\nproportion to the paths' rates. vs wrr, vs wrr-rates: rbpm's median over that scheduler's; vs\nbest: rbpm's median over the best median of every other scheduler measured (named).\n\n", rbpm.RBPMBuffer)
	fmt.Fprintln(w, "| scenario | wrr | wrr-rates | minrtt | blest | ecf | rbpm | rbpm vs wrr | rbpm vs wrr-rates | rbpm vs best | paper: RBPM |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	// Each scenario's series runs on its own lab, side by side (see main).
	scs := rbpm.RBPMScenarios()
	rows := make([]string, len(scs))
	var wg sync.WaitGroup
	for i, sc := range scs {
		wg.Go(func() { rows[i] = tunnelRow(ctx, self, sc, runs, dur, fail) })
	}
	wg.Wait()
	for _, r := range rows {
		fmt.Fprint(w, r)
	}
}

// tunnelRow measures every scheduler on sc, runs times each, and returns its table row.
func tunnelRow(ctx context.Context, self string, sc rbpm.RBPMScenario, runs int, dur time.Duration, fail func(string, ...any)) string {
	med := map[string]float64{}
	cells := ""
	for _, s := range rbpm.RBPMTunnelSchedulers {
		if !slices.Contains(schedulers, s) {
			cells += " not run |"
			continue
		}
		var g []float64
		for r := 0; r < runs; r++ {
			row, err := rbpm.RBPMTunnel(ctx, self, sc, s, dur, kit.Options{})
			if err != nil {
				fail("tunnel %s %s run %d: %v", sc.Name, s, r+1, err)
				continue
			}
			log.Printf("tunnel %s %s run %d: %.0f B/s (%s)", sc.Name, s, r+1, row.Goodput, row.Note)
			g = append(g, row.Goodput)
		}
		if len(g) > 0 {
			med[s] = median(g)
		}
		cells += " " + num(g) + " |"
	}
	return fmt.Sprintf("| %s |%s %s | %s | %s | %s |\n", sc.Name, cells, over(med, "rbpm", "wrr"), over(med, "rbpm", "wrr-rates"), vsBest(med, "rbpm"), paper(sc.PaperRBPM))
}

// over is med[a] over med[b] ("1.23x"), empty when either is missing.
func over(med map[string]float64, a, b string) string {
	if med[a] <= 0 || med[b] <= 0 {
		return ""
	}
	return fmt.Sprintf("%.2fx", med[a]/med[b])
}

// vsBest is med[s] over the best median of every other scheduler, naming that scheduler
// ("0.91x minrtt"); empty when s or every other is missing.
func vsBest(med map[string]float64, s string) string {
	best, name := 0.0, ""
	for _, o := range rbpm.RBPMTunnelSchedulers {
		if o != s && med[o] > best {
			best, name = med[o], o
		}
	}
	if best <= 0 || med[s] <= 0 {
		return ""
	}
	return fmt.Sprintf("%.2fx %s", med[s]/best, name)
}

// num is the median of v, or "not measured".
func num(v []float64) string {
	if len(v) == 0 {
		return "not measured"
	}
	return fmt.Sprintf("%.0f", median(v))
}

func ratio(v []float64) string {
	if len(v) == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f", median(v))
}

func paper(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
