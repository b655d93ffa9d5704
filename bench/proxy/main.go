// Command proxy benchmarks `braid proxy` on emulated links and writes its section of
// bench/BENCH.md.
//
// Two sites, each a host behind its proxy; the proxies are joined by two equal uplinks
// (100 Mbit/s, 5 ms one way each). Baseline: plain TCP between the hosts over one uplink, no
// proxy, in the same run. Then, through braid proxy (TLS 1.3 between the proxies):
//   - one TCP flow over both uplinks (MPTCP, a subflow per uplink pair): ratio to the baseline;
//   - one TCP flow with one subflow over the baseline's uplink: ratio to the baseline;
//   - the time to the first byte of a new connection, against a direct connection;
//   - a download while one uplink is cut for 3 s: the longest gap, whether a file transferred
//     across the cut arrives intact, and how soon a subflow over the cut uplink carries data
//     again after it returns.
//
// The proxies run as `braid proxy` processes (the binary named by -braid); this process runs the
// emulator and the traffic.
//
// Usage: go run ./bench/proxy -braid bin/braid -runs 5 -out bench/out/proxy.md
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
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/lab"
	"braid/internal/lab/scenario"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

var uplink = topo.Shape{Rate: 100e6, Delay: 5 * time.Millisecond}

func main() {
	braid := flag.String("braid", "bin/braid", "path of the braid binary")
	runs := flag.Int("runs", 5, "runs per figure; the table shows medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	out := flag.String("out", "bench/out/proxy.md", "where to write this section (Markdown)")
	flag.Parse()
	log.SetFlags(0)
	bin, err := filepath.Abs(*braid)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		log.Fatalf("braid binary: %v (run 'make build')", err)
	}
	dur, reqs, fileSize := 10*time.Second, 50, int64(100<<20)
	if *quick {
		dur, reqs, fileSize = 3*time.Second, 10, 40<<20
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()

	var direct, both, one, ttfbDirect, ttfbProxy, gap, back, before, during []float64
	intact, backWithin := 0, 0
	for r := range *runs {
		f, err := scenario.StartFed(ctx, scenario.Options{}, bin, nil, false, uplink, uplink)
		if err != nil {
			fatal(err)
		}
		use := func(cfg scenario.FedConfig) {
			if err := f.Use(ctx, cfg); err != nil {
				fatalf(f, "%s: %v", cfg.Name, err)
			}
		}
		bulk := func(name string) float64 {
			res, err := f.Bulk(ctx, traffic.BulkOptions{Duration: dur})
			if err != nil {
				fatalf(f, "%s: bulk: %v", name, err)
			}
			f.WaitIdle(ctx)
			return res.Steady
		}
		ttfb := func(name string) float64 {
			res, err := f.RR(ctx, traffic.RROptions{Count: reqs, NewConn: true})
			if err != nil {
				fatalf(f, "%s: rr: %v", name, err)
			}
			return float64(res.Median)
		}
		use(scenario.FedPlainTCP)
		direct = append(direct, bulk("direct"))
		ttfbDirect = append(ttfbDirect, ttfb("direct"))
		use(scenario.FedMPTCP1)
		one = append(one, bulk("one subflow"))
		use(scenario.FedMPTCP4)
		both = append(both, bulk("both uplinks"))
		ttfbProxy = append(ttfbProxy, ttfb("proxy"))
		cut, err := f.CutDuring(ctx, 9*time.Second, 100*time.Millisecond, 3*time.Second, 6*time.Second)
		if err != nil {
			fatalf(f, "cut: %v", err)
		}
		gap, before, during = append(gap, float64(cut.Gap)), append(before, cut.Before), append(during, cut.During)
		if cut.SubflowBack >= 0 {
			back = append(back, float64(cut.SubflowBack))
			if cut.SubflowBack <= 2*time.Second {
				backWithin++
			}
		}
		f.WaitIdle(ctx)
		fr, err := f.CutFile(ctx, fileSize, time.Second, 3*time.Second)
		if err != nil {
			fatalf(f, "%v", err)
		}
		if fr.Intact {
			intact++
		}
		f.Close()
		log.Printf("run %d of %d done", r+1, *runs)
	}

	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	med := scenario.Median
	drive.Section(w, "Federation proxy")
	fmt.Fprintf(w, "`go run ./bench/proxy -braid bin/braid -runs %d`: two sites joined by two uplinks of %.0f Mbit/s\n"+
		"(%v one way) between their proxies; TLS 1.3 between the proxies; one TCP flow for %v. Baseline:\n"+
		"plain TCP over one uplink without a proxy, in the same run. Medians of %d runs.\n\n",
		*runs, float64(uplink.Rate)/1e6, uplink.Delay, dur, *runs)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| scenario\t| baseline\t| braid\t| ratio\t| target\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|")
	fmt.Fprintf(tw, "| both uplinks (MPTCP, subflow per uplink pair)\t| %.1f Mbit/s\t| %.1f Mbit/s\t| %.3f\t| >= 1.9\t|\n", med(direct)/1e6, med(both)/1e6, med(both)/med(direct))
	fmt.Fprintf(tw, "| one subflow, same uplink\t| %.1f Mbit/s\t| %.1f Mbit/s\t| %.3f\t| >= 0.97\t|\n", med(direct)/1e6, med(one)/1e6, med(one)/med(direct))
	rtt := 2 * uplink.Delay
	fmt.Fprintf(tw, "| time to first byte, new connection\t| %.2f ms\t| %.2f ms\t| %+.2f ms\t| <= +%.0f ms (1 RTT + 2 ms)\t|\n",
		med(ttfbDirect)/1e6, med(ttfbProxy)/1e6, (med(ttfbProxy)-med(ttfbDirect))/1e6, float64(rtt+2*time.Millisecond)/1e6)
	tw.Flush()
	backText := "never within the run"
	if len(back) > 0 {
		backText = fmt.Sprintf("%.2f s (median of the %d runs where it came back)", med(back)/1e9, len(back))
	}
	fmt.Fprintf(w, "\nUplink cut for 3 s during a download (100 ms samples): goodput %.1f Mbit/s before, %.1f Mbit/s\n"+
		"while cut; longest gap below 1/10 of the rate before the cut: %.2f s (target < 1 s); a subflow over the\n"+
		"cut uplink carried data again %s after it returned (within 2 s in %d of %d runs;\n"+
		"target 2 s). A %d MiB file downloaded across a 2 s cut arrived intact in %d of %d runs.\n",
		med(before)/1e6, med(during)/1e6, med(gap)/1e9, backText, backWithin, *runs, fileSize>>20, intact, *runs)
	fmt.Fprintf(w, "\nThe time to first byte is a request/response on a new connection (connect included). Links\n"+
		"emulated by: %s.\n\n", lab.EmulatorName)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err == nil {
		os.WriteFile(*out, md.Bytes(), 0o644)
	}
}

func fatal(v ...any) {
	lab.CloseAll()
	log.Fatal(v...)
}

func fatalf(f *scenario.FedLab, format string, v ...any) {
	logs := f.Logs()
	lab.CloseAll()
	log.Fatalf(format+"\n%s", append(v, logs)...)
}
