// Command rbpm benchmarks braid pm's rbpm policy on kernel MPTCP and writes its section of
// bench/BENCH.md.
//
// For each of the RBPM paper's scenarios (scenario.RBPMScenarios: four heterogeneous paths on
// emulated links with 100-packet drop-tail queues, a 200 KB receive buffer, reno), a bulk
// upload over one subflow per path, with braid pm's fullmesh policy (the kernel's default
// scheduler over every subflow: the baseline) and with its rbpm policy (the same subflows,
// slow ones demoted to backup), alternating, -runs times each; the table shows the medians,
// their ratio and the paper's figures.
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
	"runtime"
	"slices"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/scenario"
)

func main() {
	flag.String("braid", "bin/braid", "path of the braid binary (unused: the roles run in process)")
	runs := flag.Int("runs", 5, "runs per configuration; the table shows medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	out := flag.String("out", "bench/out/rbpm.md", "where to write this section (Markdown)")
	flag.Parse()
	log.SetFlags(0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	dur := 30 * time.Second
	if *quick {
		dur = 6 * time.Second
	}
	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	fmt.Fprintf(w, "## RBPM on kernel MPTCP\n\n`go run ./bench/rbpm -runs %d` (%s, %d cores). The RBPM paper's scenarios on %s links\n(100-packet drop-tail queues), receiver tcp_rmem max %d B, reno, a %v bulk upload over one subflow\nper path; baseline: braid pm fullmesh (the kernel's default scheduler over all subflows); braid:\nbraid pm rbpm (same subflows, slow ones set to backup). Goodput in bytes/s, medians of %d runs.\n\n",
		*runs, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), lab.EmulatorName, scenario.RBPMBuffer, dur, *runs)
	var tab bytes.Buffer
	fmt.Fprintln(&tab, "| scenario | default (B/s) | rbpm (B/s) | ratio | paper: original MPTCP | paper: RBPM |")
	fmt.Fprintln(&tab, "|---|---:|---:|---:|---:|---:|")
	var failures []string
	for _, sc := range scenario.RBPMScenarios() {
		var base, rb, ratios []float64
		for r := 0; r < *runs; r++ {
			b, err := scenario.RBPMKernel(ctx, sc, false, dur, scenario.Options{})
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s run %d, default: %v", sc.Name, r+1, err))
				log.Print(failures[len(failures)-1])
				continue
			}
			p, err := scenario.RBPMKernel(ctx, sc, true, dur, scenario.Options{})
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s run %d, rbpm: %v", sc.Name, r+1, err))
				log.Print(failures[len(failures)-1])
				continue
			}
			log.Printf("%s run %d: default %.0f B/s, rbpm %.0f B/s (%s)", sc.Name, r+1, b.Goodput, p.Goodput, p.Note)
			base, rb = append(base, b.Goodput), append(rb, p.Goodput)
			if b.Goodput > 0 {
				ratios = append(ratios, p.Goodput/b.Goodput)
			}
		}
		if len(base) == 0 {
			fmt.Fprintf(&tab, "| %s | not measured | | | %.0f | %.0f |\n", sc.Name, sc.PaperOriginal, sc.PaperRBPM)
			continue
		}
		fmt.Fprintf(&tab, "| %s | %.0f | %.0f | %.2f | %.0f | %.0f |\n", sc.Name, median(base), median(rb), median(ratios), sc.PaperOriginal, sc.PaperRBPM)
	}
	w.Write(tab.Bytes())
	fmt.Fprintln(w, "\nratio: median of the per-run ratios (rbpm over default, measured back to back).")
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
