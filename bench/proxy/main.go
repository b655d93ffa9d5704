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
// Then the federation paper's unequal links (wired 40 Mbit/s at 60 ms one way, LTE 10 Mbit/s
// at 80 ms one way, queues of one bandwidth-delay product): one download over the wired path
// alone (plain TCP, no proxy; with the host's default congestion control and with cubic, the
// proxies' own), and through the proxies over both uplinks with each path-manager policy
// (fullmesh, rbpm): goodput, its ratio to the wired path alone (the better of the two), and
// while the wired uplink is cut for 3 s the longest gap (100 ms samples below 1/10 of the rate
// before the cut) and the rate over LTE.
//
// The proxies run as `braid proxy` processes (the binary named by -braid); this process runs the
// emulator and the traffic.
//
// Usage: go run ./bench/proxy -braid bin/braid -runs 5 -out bench/out/proxy.md
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/experiment/federation"
	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"

	"golang.org/x/sys/unix"
)

var uplink = topo.Shape{Rate: 100e6, Delay: 5 * time.Millisecond}

// The federation paper's links (internal/experiment/federation/repro.go).
var (
	paperWired = topo.Shape{Rate: 40e6, Delay: 60 * time.Millisecond}
	paperLTE   = topo.Shape{Rate: 10e6, Delay: 80 * time.Millisecond}
)

func main() {
	braid := flag.String("braid", "bin/braid", "path of the braid binary")
	runs := flag.Int("runs", 5, "runs per figure; the table shows medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	out := flag.String("out", "bench/out/proxy.md", "where to write this section (Markdown)")
	cases := flag.String("cases", "equal,paper", "which links: equal (two 100 Mbit/s uplinks), paper (wired + LTE), or both")
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

	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	if strings.Contains(*cases, "equal") {
		equalLinks(ctx, w, bin, *runs, dur, reqs, fileSize)
	}
	if strings.Contains(*cases, "paper") {
		paperLinks(ctx, w, bin, *runs, dur)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err == nil {
		os.WriteFile(*out, md.Bytes(), 0o644)
	}
}

// equalLinks measures the proxy on two equal uplinks and writes its table to w.
func equalLinks(ctx context.Context, w io.Writer, bin string, runs int, dur time.Duration, reqs int, fileSize int64) {
	var direct, both, one, ttfbDirect, ttfbProxy, gap, back, before, during []float64
	intact, backWithin := 0, 0
	for r := range runs {
		f, err := federation.StartFed(ctx, kit.Options{}, bin, nil, false, uplink, uplink)
		if err != nil {
			fatal(err)
		}
		use := func(cfg federation.FedConfig) {
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
		use(federation.FedPlainTCP)
		direct = append(direct, bulk("direct"))
		ttfbDirect = append(ttfbDirect, ttfb("direct"))
		use(federation.FedMPTCP1)
		one = append(one, bulk("one subflow"))
		use(federation.FedMPTCP4)
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
		log.Printf("equal links: run %d of %d done", r+1, runs)
	}

	med := kit.Median
	drive.Section(w, "Federation proxy")
	fmt.Fprintf(w, "`go run ./bench/proxy -braid bin/braid -runs %d`: two sites joined by two uplinks of %.0f Mbit/s\n"+
		"(%v one way) between their proxies; TLS 1.3 between the proxies; one TCP flow for %v. Baseline:\n"+
		"plain TCP over one uplink without a proxy, in the same run. Medians of %d runs.\n\n",
		runs, float64(uplink.Rate)/1e6, uplink.Delay, dur, runs)
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
		med(before)/1e6, med(during)/1e6, med(gap)/1e9, backText, backWithin, runs, fileSize>>20, intact, runs)
	fmt.Fprintf(w, "\nThe time to first byte is a request/response on a new connection (connect included). Links\n"+
		"emulated by: %s.\n\n", lab.EmulatorName)
}

// paperRow is one way of carrying the download on the paper's links.
type paperRow struct {
	name                       string
	cfg                        federation.FedConfig
	cubic                      bool // plain TCP with cubic instead of the host's default (an upload: the client's socket chooses)
	goodput, gap, during, back []float64
	backs                      int
}

// paperLinks measures one download on the federation paper's wired + LTE links: the wired
// path alone, and the proxies with each policy, with a cut of the wired uplink; it writes the
// table to w.
func paperLinks(ctx context.Context, w io.Writer, bin string, runs int, dur time.Duration) {
	fm, rb := federation.FedMPTCP4, federation.FedMPTCP4
	fm.Policy, rb.Policy = "fullmesh", "rbpm"
	rows := []*paperRow{
		{name: "wired alone, plain TCP (host default: " + hostCongestion() + ")", cfg: federation.FedPlainTCP},
		{name: "wired alone, plain TCP (cubic, upload)", cfg: federation.FedPlainTCP, cubic: true},
		{name: "proxy, both uplinks, pm_policy fullmesh", cfg: fm},
		{name: "proxy, both uplinks, pm_policy rbpm", cfg: rb},
	}
	cutDur, cutAt, restoreAt := 12*time.Second, 4*time.Second, 7*time.Second
	if dur < 10*time.Second {
		cutDur, cutAt, restoreAt = 9*time.Second, 3*time.Second, 6*time.Second
	}
	for r := range runs {
		f, err := federation.StartFed(ctx, kit.Options{}, bin, nil, false, paperWired, paperLTE)
		if err != nil {
			fatal(err)
		}
		for _, row := range rows {
			if err := f.Use(ctx, row.cfg); err != nil {
				fatalf(f, "%s: %v", row.name, err)
			}
			// The lab's namespaces may not take cubic as their default (only the host's allowed
			// list), but a socket may: that row is an upload from a cubic socket of the client.
			dial := f.Dial()
			if row.cubic {
				dial = cubicDial(dial)
			}
			res, err := traffic.Bulk(ctx, dial, federation.FedServerAddr, traffic.BulkOptions{Duration: dur, Reverse: !row.cubic})
			if err != nil {
				fatalf(f, "%s: bulk: %v", row.name, err)
			}
			f.WaitIdle(ctx)
			row.goodput = append(row.goodput, res.Steady)
			if !row.cfg.Proxy {
				continue
			}
			cut, err := f.CutDuring(ctx, cutDur, 100*time.Millisecond, cutAt, restoreAt)
			if err != nil {
				fatalf(f, "%s: cut: %v", row.name, err)
			}
			row.gap, row.during = append(row.gap, float64(cut.Gap)), append(row.during, cut.During)
			if cut.SubflowBack >= 0 {
				row.back = append(row.back, float64(cut.SubflowBack))
				row.backs++
			}
			f.WaitIdle(ctx)
		}
		f.Close()
		log.Printf("paper links: run %d of %d done", r+1, runs)
	}
	med := kit.Median
	best := max(med(rows[0].goodput), med(rows[1].goodput))
	drive.Section(w, "Federation proxy on unequal paths")
	fmt.Fprintf(w, "`go run ./bench/proxy -braid bin/braid -runs %d`: the federation paper's links, wired %.0f Mbit/s (%v one\n"+
		"way) and LTE %.0f Mbit/s (%v one way), queues of one bandwidth-delay product; one download (%v; steady\n"+
		"rate, the median of 1 s samples after the first). The ratio is to the better of the wired-alone rows. Then\n"+
		"a download of %v with the wired uplink cut from %v to %v (100 ms samples): the longest gap below 1/10 of\n"+
		"the rate before the cut, the mean rate while cut, and when a wired subflow carried data again after\n"+
		"the restore. Medians of %d runs.\n\n",
		runs, float64(paperWired.Rate)/1e6, paperWired.Delay, float64(paperLTE.Rate)/1e6, paperLTE.Delay, dur, cutDur, cutAt, restoreAt, runs)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| scenario\t| goodput\t| ratio to wired alone\t| gap on a wired cut\t| rate while cut\t| wired back after\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, row := range rows {
		gap, during, back := "-", "-", "-"
		if row.cfg.Proxy {
			gap = fmt.Sprintf("%.2f s (max %.2f s)", med(row.gap)/1e9, maxOf(row.gap)/1e9)
			during = fmt.Sprintf("%.1f Mbit/s", med(row.during)/1e6)
			back = fmt.Sprintf("%.2f s (%d of %d runs)", med(row.back)/1e9, row.backs, runs)
		}
		fmt.Fprintf(tw, "| %s\t| %.1f Mbit/s\t| %.3f\t| %s\t| %s\t| %s\t|\n", row.name, med(row.goodput)/1e6, med(row.goodput)/best, gap, during, back)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nTargets (issue 16): the proxy over both uplinks above the wired path alone (ratio > 1), a gap under\n"+
		"1 s. The proxies' MPTCP connections use cubic whatever the host's default (docs/proxy.md). Links\n"+
		"emulated by: %s.\n\n", lab.EmulatorName)
}

// cubicDial sets cubic on the sockets dial makes (the bulk test's data streams send from them).
func cubicDial(dial traffic.DialFunc) traffic.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err == nil {
			var serr error
			err = rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, "cubic")
			})
			err = errors.Join(err, serr)
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("set cubic: %w", err)
		}
		return c, nil
	}
}

// hostCongestion is this machine's default TCP congestion control, which the lab's
// namespaces start with.
func hostCongestion() string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		return "cubic"
	}
	return strings.TrimSpace(string(b))
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func fatal(v ...any) {
	lab.CloseAll()
	log.Fatal(v...)
}

func fatalf(f *federation.FedLab, format string, v ...any) {
	logs := f.Logs()
	lab.CloseAll()
	log.Fatalf(format+"\n%s", append(v, logs)...)
}
