// Command emulator benchmarks the lab's link emulator and writes bench/BENCH.md.
//
// Two tables, each the median of -runs runs:
//
//   - accuracy: every check of TESTING.md (RTT, goodput, loss, queue bound, cut, trace replay),
//     measured value as a ratio to the configured one;
//   - CPU: TCP bulk at 10, 100 and 1000 Mbit/s through the emulator, beside the same transfer over
//     a kernel veth pair shaped by TBF (the baseline, run side by side in the same process). The
//     traffic runs in child processes (braid traffic), so this process's CPU time is the
//     emulator's alone. CPU is per process on both sides (drive.Side): the traffic processes,
//     and this one on braid's.
//
// Usage: go run ./bench/emulator -braid bin/braid -runs 5 -out bench/out/emulator.md
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/experiment/accuracy"
	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/units"

	"github.com/vishvananda/netlink"
)

func main() {
	braid := flag.String("braid", "bin/braid", "path of the braid binary (runs the traffic tools)")
	runs := flag.Int("runs", 5, "runs per figure; the tables show medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	out := flag.String("out", "bench/out/emulator.md", "where to write this section (Markdown)")
	flag.Parse()
	log.SetFlags(0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()

	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	drive.Section(w, "Link emulator accuracy")
	fmt.Fprintf(w, "`go run ./bench/emulator -braid bin/braid -runs %d`. Measured value as a ratio to the expected\n"+
		"value (1.000 is exact). Goodput counts TCP payload against a rate of IP bytes: its expected value is\n"+
		"the TCP ceiling, %.4f of the rate with %d-byte packets (payload over packet), and its bound is 5 %% of\n"+
		"that ceiling either way. The queue bound is measured from outside the emulator: an overflowing\n"+
		"burst of MTU-sized UDP datagrams into a 5 Mbit/s link, counted at the receiver, less what drained\n"+
		"while the burst arrived. The trace row replays TMobile-LTE-short.down (lab/traces) from 30 s in\n"+
		"under a saturating UDP flow and compares the bytes the emulator delivers each second with the\n"+
		"trace's bytes for the same window (aligned by the offset and the delay): expected and measured are\n"+
		"the means over the seconds compared; within bound means every second within 5 %%.\n", *runs, accuracy.TCPCeiling(1500), 1500)
	fmt.Fprintln(w)
	accuracyRuns(ctx, w, *runs, *quick)
	fmt.Fprintln(w)
	drive.Section(w, "Link emulator CPU")
	fmt.Fprintln(w, "One TCP flow for each rate, 5 ms one-way delay. Baseline: the same flow over a veth pair\n"+
		"shaped by the kernel's TBF (no delay: this kernel has no netem). CPU, in cores, is user and system\n"+
		"time over the transfer's wall time, summed over the processes that do each side's work, each read\n"+
		"from the kernel's per-process accounting (drive's one instrument for both sides): the traffic\n"+
		"client and server on both sides, plus on braid's the process that runs the emulator (shown also\n"+
		"alone). TBF shapes inside the kernel: what it does in the senders' system calls is counted, its\n"+
		"timer-driven dequeues in softirq are charged to whatever process they interrupt, so the baseline\n"+
		"can read low by that much.")
	fmt.Fprintln(w)
	cpu(ctx, w, *braid, *runs, *quick)
	if *out != "" {
		if err := os.WriteFile(*out, md.Bytes(), 0o644); err != nil {
			fatal(err)
		}
	}
}

func accuracyRuns(ctx context.Context, w io.Writer, runs int, quick bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| check\t| expected\t| measured (median)\t| ratio\t| within bound\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|")
	for _, c := range accuracy.AccuracyChecks() {
		var rows []accuracy.Row
		ok := 0
		for range runs {
			r, err := c.Run(ctx, kit.Options{Quick: quick})
			if err != nil {
				fatalf("%s: %v", c.Name, err)
			}
			rows = append(rows, r)
			if r.OK {
				ok++
			}
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].Value < rows[j].Value })
		m := rows[len(rows)/2]
		fmt.Fprintf(tw, "| %s\t| %s %s\t| %.3f %s\t| %.3f\t| %d of %d\t|\n", m.Check, expected(m.Want), m.Unit, m.Value, m.Unit, m.Value/m.Want, ok, runs)
	}
	tw.Flush()
}

// expected prints an expected value: whole numbers as they are, others (a TCP ceiling) to three
// decimals.
func expected(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

type cpuResult struct {
	goodput     float64 // bit/s
	side        float64 // cores used by the side's processes (traffic tools, and the emulator's)
	emulator    float64 // cores used by the emulator's process alone
	retransmits int64
}

func cpu(ctx context.Context, w io.Writer, braid string, runs int, quick bool) {
	if _, err := os.Stat(braid); err != nil {
		fatalf("braid binary: %v (run 'make build')", err)
	}
	dur := 8 * time.Second
	if quick {
		dur = 3 * time.Second
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| rate\t| baseline goodput\t| braid goodput\t| ratio\t| baseline CPU\t| braid CPU\t| ratio\t| of which emulator\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, rate := range []uint64{10e6, 100e6, 1000e6} {
		var base, emu []cpuResult
		for range runs {
			base = append(base, measure(ctx, braid, rate, dur, true))
			emu = append(emu, measure(ctx, braid, rate, dur, false))
		}
		b, e := medianResult(base), medianResult(emu)
		fmt.Fprintf(tw, "| %s\t| %.1f Mbit/s\t| %.1f Mbit/s\t| %.3f\t| %.3f cores\t| %.3f cores\t| %.2f\t| %.3f cores\t|\n",
			units.FormatRate(rate), b.goodput/1e6, e.goodput/1e6, e.goodput/b.goodput, b.side, e.side, e.side/b.side, e.emulator)
	}
	tw.Flush()
}

func medianResult(rs []cpuResult) cpuResult {
	med := func(f func(cpuResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return cpuResult{
		goodput:  med(func(r cpuResult) float64 { return r.goodput }),
		side:     med(func(r cpuResult) float64 { return r.side }),
		emulator: med(func(r cpuResult) float64 { return r.emulator }),
	}
}

// measure runs one bulk transfer at rate through the emulator, or (baseline) through a veth pair
// with TBF, with the traffic tools as child processes.
func measure(ctx context.Context, braid string, rate uint64, dur time.Duration, baseline bool) cpuResult {
	shape := topo.Shape{Rate: rate, Delay: 5 * time.Millisecond}
	tp := topo.Pair(shape)
	if baseline {
		tp.Links = nil // the hosts only; the veth pair is added below
	}
	l, err := lab.Up(ctx, tp, lab.Options{OwnSignals: false})
	if err != nil {
		fatal(err)
	}
	defer l.Close()
	if baseline {
		if err := vethTBF(ctx, l, rate); err != nil {
			fatalf("baseline: %v", err)
		}
	}
	srv := exec.Command(braid, "traffic", "serve", "--listen", "10.99.0.2:5201", "--udp", "10.99.0.2:5201")
	if err := l.Host("b").Start(srv); err != nil {
		fatal(err)
	}
	defer func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() }()
	waitListening(ctx, l)

	var cli bytes.Buffer
	client := exec.Command(braid, "traffic", "bulk", "10.99.0.2:5201", "--duration", dur.String(), "--json")
	client.Stdout = &cli
	client.Stderr = os.Stderr
	// The side's live processes: the server, and on braid's side this process, which runs the
	// emulator (the baseline's shaping is the kernel's, in the traffic processes' system calls).
	side := drive.Side{srv.Process.Pid}
	emu := drive.Side{}
	if !baseline {
		emu = drive.Side{os.Getpid()}
	}
	before, emuBefore, t0 := side.CPU(), emu.CPU(), time.Now()
	if err := l.Host("a").Start(client); err != nil {
		fatal(err)
	}
	if err := client.Wait(); err != nil {
		fatalf("braid traffic bulk: %v", err)
	}
	wall := time.Since(t0)
	emuCPU := emu.CPU() - emuBefore
	sideCPU := side.CPU() - before + emuCPU + drive.ExitedCPU(client.ProcessState)
	var res traffic.BulkResult
	if err := json.Unmarshal(cli.Bytes(), &res); err != nil {
		fatalf("braid traffic bulk --json: %v: %q", err, cli.String())
	}
	return cpuResult{goodput: res.Steady, side: drive.Cores(sideCPU, wall), emulator: drive.Cores(emuCPU, wall), retransmits: res.Retransmits}
}

func waitListening(ctx context.Context, l *lab.Lab) {
	for range 100 {
		c, err := l.Host("a").Dial(ctx, "tcp", "10.99.0.2:5201")
		if err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	fatal("traffic server did not start")
}

// vethTBF joins hosts a and b of a pair lab with a veth pair, shaped with TBF at rate on both
// ends, with the pair's addresses.
func vethTBF(ctx context.Context, l *lab.Lab, rate uint64) error {
	a, b := l.Host("a"), l.Host("b")
	nsB, err := netnsFd(b)
	if err != nil {
		return err
	}
	defer syscall.Close(nsB)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: "eth0", PeerNamespace: netlink.NsFd(nsB)}
	if err := a.NS.Netlink().LinkAdd(veth); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	for _, h := range []struct {
		host *lab.Host
		addr string
	}{{a, "10.99.0.1/24"}, {b, "10.99.0.2/24"}} {
		nl := h.host.NS.Netlink()
		link, err := nl.LinkByName("eth0")
		if err != nil {
			return err
		}
		p := netip.MustParsePrefix(h.addr)
		if err := nl.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(p)}); err != nil {
			return err
		}
		if err := nl.LinkSetUp(link); err != nil {
			return err
		}
		// burst: enough for the rate at a 1 ms timer, at least 64 KiB for TSO segments
		burst := max(int(rate/8/1000), 64<<10)
		out, err := h.host.Run(ctx, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
			"rate", strconv.FormatUint(rate, 10)+"bit", "burst", strconv.Itoa(burst), "latency", "20ms")
		if err != nil {
			return fmt.Errorf("tc tbf: %v: %s", err, out)
		}
	}
	return nil
}

func netnsFd(h *lab.Host) (int, error) {
	return syscall.Open("/run/netns/"+h.NS.Name, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// fatal and fatalf remove every lab of this process before exiting, so a failed run leaves
// nothing behind (log.Fatal would skip the deferred Close calls).
func fatal(v ...any) {
	lab.CloseAll()
	log.Fatal(v...)
}

func fatalf(format string, v ...any) {
	lab.CloseAll()
	log.Fatalf(format, v...)
}
