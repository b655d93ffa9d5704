// Command dataplane benchmarks the tunnel's data path against the plain links it runs over,
// and writes its section of bench/BENCH.md.
//
// Sites a and b are joined by kernel veth links (no emulator: the links are far faster than the
// tunnel), unlimited or limited to 1 Gbit/s by TBF. For 1 and 2 paths, unlimited and limited,
// encrypted and not, one TCP flow runs for the measurement time over the plain links (the
// baseline: each link alone, summed for two) and through `braid tunnel`. Recorded: throughput,
// the ratio to the baseline, CPU seconds per gigabit of every process of each side (drive's
// per-process instrument on both), TCP
// retransmissions as a share of the segments sent, and the UDP receive errors of both sites
// (the tunnel's sockets dropping what arrived). The tunnels and the traffic run as processes,
// so their CPU times are their own.
//
// Usage: go run ./bench/dataplane -braid bin/braid -runs 5 -out bench/out/dataplane.md
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
	"strings"
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
)

// config is one row of the table.
type config struct {
	paths   int
	rate    uint64 // per link, bit/s; 0 unlimited
	encrypt bool
}

func (c config) String() string {
	r := "unlimited"
	if c.rate > 0 {
		r = fmt.Sprintf("%g Gbit/s", float64(c.rate)/1e9)
	}
	e := "encrypted"
	if !c.encrypt {
		e = "authenticated only"
	}
	return fmt.Sprintf("%d × %s, %s", c.paths, r, e)
}

// result is what one run of a config measured.
type result struct {
	base, tunnel float64    // bit/s
	baseCPU      float64    // core-seconds per gigabit: the traffic processes over the plain links
	braidCPU     float64    // core-seconds per gigabit: the traffic processes and both tunnels
	cpu          [2]float64 // core-seconds per gigabit, tunnel a and tunnel b alone
	retrans      float64    // share of segments
	drops        uint64     // UDP receive errors, both sites
}

func main() {
	braid := flag.String("braid", "bin/braid", "path of the braid binary")
	runs := flag.Int("runs", 5, "runs per figure; the table shows medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	out := flag.String("out", "bench/out/dataplane.md", "where to write this section (Markdown)")
	only := flag.String("only", "", "run only the configurations whose name contains this")
	profile := flag.String("profile", "", "write the tunnels' CPU profiles to `DIR`/a.prof and b.prof (last run)")
	status := flag.String("status", "", "write both tunnels' `braid status --json` after the flow to `DIR`/a.json and b.json (last run)")
	flag.Parse()
	log.SetFlags(0)
	if _, err := os.Stat(*braid); err != nil {
		drive.Fatalf("braid binary: %v (run 'make build')", err)
	}
	dur := 5 * time.Second
	if *quick {
		dur = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Minute)
	defer cancel()

	var configs []config
	for _, paths := range []int{1, 2} {
		for _, rate := range []uint64{0, 1e9} {
			for _, enc := range []bool{true, false} {
				c := config{paths, rate, enc}
				if strings.Contains(c.String(), *only) {
					configs = append(configs, c)
				}
			}
		}
	}
	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	drive.Section(w, "Tunnel data path")
	fmt.Fprintf(w, "`go run ./bench/dataplane -braid bin/braid -runs %d`: one TCP flow for %v over kernel veth\n"+
		"links (unlimited, or 1 Gbit/s each by TBF), through `braid tunnel` and, as the baseline, over the same\n"+
		"links without it (each link alone, summed for two paths). CPU is user and system time per gigabit\n"+
		"carried, summed over every process of the side, each read from the kernel's per-process accounting\n"+
		"(/proc/PID/stat, or rusage once it has exited): the traffic client and server over the plain links;\n"+
		"the same two and both tunnel processes through braid (the tunnels' shares also apart, a and b).\n"+
		"Kernel work in softirq is counted where the kernel charges it, to the process it interrupts.\n"+
		"Retransmissions are TCP's, as a share of the segments sent; drops are the UDP receive errors of\n"+
		"both sites. Medians of %d runs.\n\n", *runs, dur, *runs)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| paths, links, mode\t| plain links\t| braid\t| ratio\t| CPU s/Gbit, plain\t| CPU s/Gbit, braid\t| CPU ratio\t| of which tunnel a\t| tunnel b\t| retransmitted\t| receive drops\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	// The runs go round the configurations, so that the figures of one and of two paths are
	// taken minutes apart at most, under the same conditions of the machine, and compare run by
	// run (the table after this one).
	results := make(map[config][]result)
	for range *runs {
		for _, c := range configs {
			results[c] = append(results[c], measure(ctx, *braid, c, dur, *profile, *status))
		}
	}
	for _, c := range configs {
		rs := results[c]
		pick := func(f func(result) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			return kit.Median(v)
		}
		var drops uint64
		for _, r := range rs {
			drops = max(drops, r.drops)
		}
		base, tun := pick(func(r result) float64 { return r.base }), pick(func(r result) float64 { return r.tunnel })
		fmt.Fprintf(tw, "| %v\t| %.2f Gbit/s\t| %.2f Gbit/s\t| %.3f\t| %.3f\t| %.3f\t| %.2f\t| %.3f\t| %.3f\t| %.3f %%\t| %d\t|\n", c, base/1e9, tun/1e9,
			pick(func(r result) float64 { return r.tunnel / r.base }),
			pick(func(r result) float64 { return r.baseCPU }), pick(func(r result) float64 { return r.braidCPU }),
			pick(func(r result) float64 { return r.braidCPU / r.baseCPU }),
			pick(func(r result) float64 { return r.cpu[0] }), pick(func(r result) float64 { return r.cpu[1] }),
			100*pick(func(r result) float64 { return r.retrans }), drops)
		tw.Flush()
	}
	fmt.Fprintf(w, "\nEach ratio is the median of each run's ratio (braid over the plain links measured in the same run);\n"+
		"receive drops are the largest of the runs.\n\n")
	twoPaths(w, configs, results)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err == nil {
		os.WriteFile(*out, md.Bytes(), 0o644)
	}
}

// twoPaths writes, for each kind of link and mode measured with one and with two paths, what
// braid carried over two paths against one: the medians, and the median of each round's ratio
// (round k's two-path run over its one-path run, taken one after the other).
func twoPaths(w io.Writer, configs []config, results map[config][]result) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	header := false
	for _, c := range configs {
		if c.paths != 1 {
			continue
		}
		two := config{2, c.rate, c.encrypt}
		r1, r2 := results[c], results[two]
		if len(r2) == 0 || len(r2) != len(r1) {
			continue
		}
		if !header {
			fmt.Fprintln(tw, "| links, mode\t| braid, one path\t| braid, two paths\t| two paths / one\t| rounds two ≥ one\t|")
			fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|")
			header = true
		}
		one, both, ratio := make([]float64, len(r1)), make([]float64, len(r1)), make([]float64, len(r1))
		ge := 0
		for k := range r1 {
			one[k], both[k], ratio[k] = r1[k].tunnel, r2[k].tunnel, r2[k].tunnel/r1[k].tunnel
			if r2[k].tunnel >= r1[k].tunnel {
				ge++
			}
		}
		name := strings.TrimPrefix(c.String(), "1 × ")
		fmt.Fprintf(tw, "| %s\t| %.2f Gbit/s\t| %.2f Gbit/s\t| %.3f\t| %d of %d\t|\n", name, kit.Median(one)/1e9, kit.Median(both)/1e9,
			kit.Median(ratio), ge, len(r1))
	}
	if !header {
		return
	}
	tw.Flush()
	fmt.Fprintf(w, "\nTwo paths against one: each link as in the rows above (two links of that kind against one),\n"+
		"braid's goodput; the ratio is the median of each round's (two paths over one, measured one\n"+
		"after the other in the same round of runs).\n\n")
}

// measure runs the baseline and the tunnel for c in a fresh lab.
// profile and status, when set, are directories for the tunnels' CPU profiles and their status
// after the flow.
func measure(ctx context.Context, braid string, c config, dur time.Duration, profile, status string) result {
	rates := make([]uint64, c.paths)
	for i := range rates {
		rates[i] = c.rate
	}
	l, err := lab.Up(ctx, kit.KernelLinks("dataplane", rates...), lab.Options{})
	if err != nil {
		drive.Fatal(err)
	}
	defer l.Close()
	var r result
	plain := drive.Server(l, braid, "0.0.0.0:5201")
	srv0 := drive.ProcCPU(plain.Pid())
	var cpu time.Duration
	var bytes int64
	for i := range c.paths {
		res, client := drive.BulkCPU(ctx, l, braid, fmt.Sprintf("10.9.%d.2:5201", i), dur)
		r.base += res.Steady
		cpu += client
		bytes += res.Bytes
	}
	cpu += drive.ProcCPU(plain.Pid()) - srv0
	plain.Stop()
	r.baseCPU = cpu.Seconds() / (float64(bytes) * 8 / 1e9)

	spec := roles.SiteSpec{Paths: c.paths, Outer: 4, Capacities: rates, Encryption: &c.encrypt}
	var args []string
	if profile != "" {
		args = []string{"--cpuprofile", filepath.Join(profile, "{side}.prof")}
	}
	pair, err := roles.StartTunnelPair(ctx, l, braid, spec, 4, args...)
	if err != nil {
		drive.Fatal(err)
	}
	defer pair.Close()
	srv := drive.Server(l, braid, "10.255.0.2:5201")
	defer srv.Stop()
	segs0, re0 := tcpSegments(ctx, l)
	drops0 := drive.SNMP(ctx, l, "a", "Udp", "RcvbufErrors") + drive.SNMP(ctx, l, "b", "Udp", "RcvbufErrors")
	tunnels := [2]drive.Side{{pair.Procs[0].Process.Pid}, {pair.Procs[1].Process.Pid}}
	tun0 := [2]time.Duration{tunnels[0].CPU(), tunnels[1].CPU()}
	srv0 = drive.ProcCPU(srv.Pid())
	res, client := drive.BulkCPU(ctx, l, braid, "10.255.0.2:5201", dur)
	srvCPU := drive.ProcCPU(srv.Pid()) - srv0
	tun1 := [2]time.Duration{tunnels[0].CPU(), tunnels[1].CPU()}
	if status != "" {
		// After the CPU readings: answering braid status is not the data path's work.
		if err := pair.SaveStatus(ctx, status+string(filepath.Separator)); err != nil {
			drive.Fatal(err)
		}
	}
	segs1, re1 := tcpSegments(ctx, l)
	r.drops = drive.SNMP(ctx, l, "a", "Udp", "RcvbufErrors") + drive.SNMP(ctx, l, "b", "Udp", "RcvbufErrors") - drops0
	r.tunnel = res.Steady
	gbits := float64(res.Bytes) * 8 / 1e9
	total := client + srvCPU
	for i := range 2 {
		r.cpu[i] = (tun1[i] - tun0[i]).Seconds() / gbits
		total += tun1[i] - tun0[i]
	}
	r.braidCPU = total.Seconds() / gbits
	if segs1 > segs0 {
		r.retrans = float64(re1-re0) / float64(segs1-segs0)
	}
	return r
}

// tcpSegments returns the TCP segments sent and retransmitted by a so far.
func tcpSegments(ctx context.Context, l *lab.Lab) (sent, retrans uint64) {
	return drive.SNMP(ctx, l, "a", "Tcp", "OutSegs"), drive.SNMP(ctx, l, "a", "Tcp", "RetransSegs")
}
