// Command cellular benchmarks braid over cellular links that replay recorded capacity (the LTE
// traces of lab/traces) and writes its section of bench/BENCH.md.
//
// A site (host a) and a hub (host b) are joined by parallel emulated links; the LTE ones replay
// a trace per direction, .up from the site to the hub and .down back:
//
//   - case A: T-Mobile LTE and Verizon LTE (40 ms one way each) beside a fixed 20 Mbit/s,
//     15 ms DSL-like link;
//   - case B: T-Mobile LTE at 40 ms and Verizon LTE at 80 ms one way, both with 0.5 % loss.
//
// Each row is one TCP flow for -duration (60 s), upload (site to hub) and download, in a fresh
// lab, so that every row replays the traces from their start, with the host's default
// congestion control at the flow's sender (on this machine bbr; -cc sets another on the sending
// socket, TCP_CONGESTION: the client's for an upload, the server's listener for a download, so
// any of net.ipv4.tcp_available_congestion_control; the proxy's MPTCP subflows use cubic
// whatever this says, as braid proxy sets them): each path alone (plain TCP, no
// tunnel); braid tunnel over all paths with each of its schedulers (capacities measured), and
// the default scheduler with the capacities configured as each path's mean rate; kernel MPTCP
// through braid proxy (the kernel's default scheduler, a subflow per uplink); and the sum of the
// paths alone. While the flow runs, an ICMP echo every 10 ms measures the round trip: inside the
// tunnel, between the proxies' client and server hosts for the proxy, on the path for a path
// alone. One PNG per case plots, for the upload through the tunnel with the default scheduler,
// what each path delivered each second and the flow's goodput.
//
// -paths keeps only some of each case's paths (-paths 1: case B over T-Mobile alone), to compare
// the tunnel with a plain flow path by path.
//
// About 46 minutes a run with 60 s flows (42 flows); -quick makes them 5 s. The log gives, for
// each flow through the tunnel, what each path carried on average, what its queue dropped
// during the flow and the largest backlog it has held. To compare two builds of the
// tunnel, -alone=false -configured=false -proxy=false -schedulers paced runs only the default
// scheduler's row (two flows a case), without the ratios, which need the paths alone.
//
// Usage: go run ./bench/cellular -braid bin/braid -runs 5 -out bench/out/cellular.md
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/experiment/federation"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/units"
)

// schedulers are the tunnel's schedulers (internal/config: the site file's scheduler key), the
// default first.
var schedulers = []string{"paced", "wrr", "minrtt", "blest", "ecf", "rbpm"}

// pingInterval is how often the round trip is sampled during a flow.
const pingInterval = 10 * time.Millisecond

type path struct {
	name     string
	up, down topo.Shape
}

type cellCase struct {
	id, title string
	paths     []path
}

func lte(name, file string, delay time.Duration, loss float64) path {
	p := path{name: name}
	var err error
	if p.up, err = kit.TraceShape(file+".up", 0, delay); err == nil {
		p.down, err = kit.TraceShape(file+".down", 0, delay)
	}
	if err != nil {
		drive.Fatal(err)
	}
	p.up.Loss, p.down.Loss = loss, loss
	return p
}

func cases() []cellCase {
	dsl := topo.Shape{Rate: 20e6, Delay: 15 * time.Millisecond}
	ms := time.Millisecond
	return []cellCase{
		{id: "a", title: "two LTE traces and a DSL link", paths: []path{
			lte("T-Mobile LTE", "TMobile-LTE-short", 40*ms, 0),
			lte("Verizon LTE", "Verizon-LTE-short", 40*ms, 0),
			{name: "DSL 20 Mbit/s", up: dsl, down: dsl},
		}},
		{id: "b", title: "two LTE traces, 40 and 80 ms, 0.5 % loss", paths: []path{
			lte("T-Mobile LTE", "TMobile-LTE-short", 40*ms, 0.5),
			lte("Verizon LTE", "Verizon-LTE-short", 80*ms, 0.5),
		}},
	}
}

func (p path) describe() string {
	s := func(sh topo.Shape) string {
		if sh.Trace != nil {
			return fmt.Sprintf("%s (mean %s)", filepath.Base(sh.Trace.File), units.FormatRate(sh.Trace.MeanRate()))
		}
		return units.FormatRate(sh.Rate)
	}
	d := fmt.Sprintf("%s: up %s, down %s, %v one way", p.name, s(p.up), s(p.down), p.up.Delay)
	if p.up.Loss > 0 {
		d += fmt.Sprintf(", %g %% loss", p.up.Loss)
	}
	return d
}

// topology is the site a and the hub b joined by the case's paths: link i has 10.9.i.0/24.
func (c cellCase) topology() *topo.Topology {
	shapes := make([]topo.Shape, len(c.paths))
	for i, p := range c.paths {
		shapes[i] = p.up
	}
	tp := kit.ParallelLinks("cell"+c.id, shapes...)
	for i, p := range c.paths {
		tp.Links[i].BA = p.down
	}
	return tp
}

// result is what one row measured in one run.
type result struct {
	goodput float64 // bit/s, TCP payload over the whole flow
	p50     time.Duration
	p95     time.Duration
	pingOK  float64 // share of echoes answered
	retrans float64
	samples []float64   // the flow's goodput each second
	paths   [][]float64 // what each path delivered each second, IP bit/s
	drops   []uint64    // by path, what its queue dropped during the flow
	peaks   []uint64    // by path, the largest backlog its queue has held, bytes
	failed  string      // why the flow failed ("" it did not): the row says so, and the driver exits 1
}

type options struct {
	braid      string
	dur        time.Duration
	schedulers []string // the tunnel rows, in the order of schedulers
	proxy      bool     // the kernel MPTCP row
	cc         string   // the flow's sender's congestion control; "" the host's default
	alone      bool     // the paths-alone rows and their sum
	configured bool     // the default scheduler with capacities configured
	status     string   // a directory kept for every flow's state each second; "" a temporary one, kept when the flow fails
	reorder    *bool    // the tunnels' reorder setting; nil the default (on)
}

func main() {
	braid := flag.String("braid", "bin/braid", "path of the braid binary")
	runs := flag.Int("runs", 5, "runs per figure; the tables show medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run (5 s flows)")
	duration := flag.Duration("duration", 60*time.Second, "length of each flow")
	out := flag.String("out", "bench/out/cellular.md", "where to write this section (Markdown)")
	figures := flag.String("figures", "", "directory of the PNG figures (default: that of -out)")
	only := flag.String("case", "", "run only this case (a or b); default: every case")
	scheds := flag.String("schedulers", strings.Join(schedulers, ","), "the tunnel rows to run: schedulers, comma-separated (the default one also runs with capacities configured)")
	withProxy := flag.Bool("proxy", true, "run the kernel MPTCP row (through braid proxy)")
	withAlone := flag.Bool("alone", true, "run the paths-alone rows (and the sum); -alone=false leaves the ratios out: for comparing tunnel builds")
	withConfigured := flag.Bool("configured", true, "run the default scheduler's row with the capacities configured")
	status := flag.String("status", "", "write both tunnels' `braid status --json` after each tunnel flow into `DIR` (CASE-up|down-SCHEDULER[-configured]-a|b.json, last run), and each second of the flow (the same names, .jsonl; two braid status processes a second run beside the flow); and both proxies' `braid status` and `ss -tinM` each second of the kernel MPTCP row's flow (CASE-up|down-proxy-p1|p2.txt); without -status every flow's samples go to a temporary directory, kept (and named in the log) only when the flow fails")
	reorder := flag.Bool("reorder", true, "the tunnels' reorder buffer (reorder = in the site files); -reorder=false compares the tunnel without it")
	keep := flag.String("paths", "", "keep only these paths of each case: 1-based indices in the case's order, comma-separated (-paths 1 runs case B over T-Mobile alone); default: every path")
	cc := flag.String("cc", "", "TCP congestion control of each flow's sender (TCP_CONGESTION: one of net.ipv4.tcp_available_congestion_control); default: the host's")
	flag.Parse()
	log.SetFlags(0)
	bin, err := filepath.Abs(*braid)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		drive.Fatalf("braid binary: %v (run 'make build')", err)
	}
	if *figures == "" {
		*figures = filepath.Dir(*out)
	}
	o := options{braid: bin, dur: *duration, proxy: *withProxy, cc: *cc, alone: *withAlone, configured: *withConfigured, status: *status}
	ccName := o.cc
	if ccName == "" {
		b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
		if err != nil {
			drive.Fatalf("the host's congestion control: %v", err)
		}
		ccName = strings.TrimSpace(string(b)) + ", the host's default"
	}
	ccFlag := ""
	if o.cc != "" {
		ccFlag = " -cc " + o.cc
	}
	if !*reorder {
		o.reorder = reorder
		ccFlag += " -reorder=false"
	}
	for _, n := range strings.Split(*scheds, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.Contains(schedulers, n) {
			drive.Fatalf("-schedulers: no scheduler %q (%s)", n, strings.Join(schedulers, ", "))
		}
		o.schedulers = append(o.schedulers, n)
	}
	if *quick {
		o.dur = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Hour)
	defer cancel()

	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	drive.Section(w, "Cellular paths (trace-driven links)")
	fmt.Fprintf(w, "`go run ./bench/cellular -braid bin/braid -runs %d -duration %v%s`: a site and a hub joined by\n"+
		"emulated links; the LTE ones replay the traces of lab/traces (Winstein et al., NSDI 2013), .up from\n"+
		"the site to the hub and .down back, each row in a fresh lab so that every row replays them from\n"+
		"their start. One TCP flow (its sender's congestion control %s; braid proxy's MPTCP subflows cubic) per row for %v, upload (site to hub) and download. Goodput is TCP\n"+
		"payload at the receiver over the whole flow; RTT is an ICMP echo every %v during the flow (inside\n"+
		"the tunnel; between the client and server hosts for the proxy, routed over the first path; on the\n"+
		"path for a path alone); retransmissions are the TCP sender's (tcp_info; for the proxy the client's\n"+
		"connection to its proxy, not the MPTCP subflows). Medians of %d runs. Links emulated by: %s.\n\n",
		*runs, o.dur, ccFlag, ccName, o.dur, pingInterval, *runs, lab.EmulatorName)
	ran := false
	for _, c := range cases() {
		if *only != "" && !strings.EqualFold(*only, c.id) {
			continue
		}
		if *keep != "" {
			var err error
			if c.paths, err = drive.Pick(c.paths, *keep, "path"); err != nil {
				drive.Fatalf("-paths: case %s: %v", c.id, err)
			}
		}
		runCase(ctx, w, o, c, *runs, *figures)
		ran = true
	}
	if !ran {
		drive.Fatalf("-case %q: no such case (a or b)", *only)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err == nil {
		os.WriteFile(*out, md.Bytes(), 0o644)
	}
	if n := failedRows; n > 0 {
		drive.Fatalf("%d rows had a failed flow (their tables say why)", n)
	}
}

// row is a table row: its name and its runs.
type row struct {
	name string
	runs []result
	sum  bool // the sum of the paths alone: only goodput
}

// failures says in how many runs the row's flow failed and why (the first failure), "" when
// none did.
func (r *row) failures() string {
	n, first := 0, ""
	for _, x := range r.runs {
		if x.failed != "" {
			if n++; n == 1 {
				first = x.failed
			}
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("failed in %d of %d runs: %s", n, len(r.runs), strings.ReplaceAll(first, "|", "/"))
}

// failedRows counts the rows that had a failed flow (runCase); the driver exits 1 when it is
// not 0, after writing its section.
var failedRows int

func (r *row) med(f func(result) float64) float64 {
	v := make([]float64, len(r.runs))
	for i, x := range r.runs {
		v[i] = f(x)
	}
	return kit.Median(v)
}

func runCase(ctx context.Context, w io.Writer, o options, c cellCase, runs int, figures string) {
	fmt.Fprintf(w, "### Case %s: %s\n\n", strings.ToUpper(c.id), c.title)
	for _, p := range c.paths {
		fmt.Fprintf(w, "- %s\n", p.describe())
	}
	fmt.Fprintln(w)
	var figure result
	for _, reverse := range []bool{false, true} {
		var rows []*row
		add := func(name string) *row { r := &row{name: name}; rows = append(rows, r); return r }
		alone := make([]*row, len(c.paths))
		for i, p := range c.paths {
			alone[i] = &row{name: p.name + " alone, no tunnel"}
			if o.alone {
				rows = append(rows, alone[i])
			}
		}
		tunnels := make([]*row, len(o.schedulers))
		for i, s := range o.schedulers {
			name := "braid tunnel, " + s
			if s == schedulers[0] {
				name += " (default)"
			}
			tunnels[i] = add(name + ", capacities measured")
		}
		var configured, proxy *row
		if o.configured && slices.Contains(o.schedulers, schedulers[0]) {
			configured = add("braid tunnel, " + schedulers[0] + ", capacities = the paths' means")
		}
		if o.proxy {
			proxy = add("kernel MPTCP through braid proxy")
		}
		for r := range runs {
			for i := range c.paths {
				if o.alone {
					alone[i].runs = append(alone[i].runs, measureAlone(ctx, o, c, i, reverse))
				}
			}
			for i, s := range o.schedulers {
				res := measureTunnel(ctx, o, c, s, nil, reverse)
				tunnels[i].runs = append(tunnels[i].runs, res)
				if s == schedulers[0] && !reverse && r == 0 {
					figure = res
				}
			}
			if configured != nil {
				configured.runs = append(configured.runs, measureTunnel(ctx, o, c, schedulers[0], means(c, reverse), reverse))
			}
			if proxy != nil {
				proxy.runs = append(proxy.runs, measureProxy(ctx, o, c, reverse))
			}
			log.Printf("case %s %s: run %d of %d done", c.id, direction(reverse), r+1, runs)
		}
		sum := &row{name: "sum of the paths alone", sum: true}
		for r := range runs {
			if !o.alone {
				break
			}
			var s result
			for _, a := range alone {
				s.goodput += a.runs[r].goodput
			}
			sum.runs = append(sum.runs, s)
		}
		for _, r := range rows {
			if r.failures() != "" {
				failedRows++
			}
		}
		printTable(w, direction(reverse), rows, alone, sum)
	}
	if len(figure.samples) == 0 {
		return // the default scheduler's row did not run
	}
	if err := os.MkdirAll(figures, 0o755); err == nil {
		file := filepath.Join(figures, "cellular-"+c.id+".png")
		if err := plot(file, c, figure); err != nil {
			log.Printf("figure: %v", err)
		} else {
			fmt.Fprintf(w, "Figure: %s (upload through the tunnel, %s scheduler, capacities measured; first run).\n\n", file, schedulers[0])
		}
	}
}

func direction(reverse bool) string {
	if reverse {
		return "download (hub to site, .down traces)"
	}
	return "upload (site to hub, .up traces)"
}

// means are the paths' mean rates in the flow's direction: the capacities of the reference row.
func means(c cellCase, reverse bool) []uint64 {
	out := make([]uint64, len(c.paths))
	for i, p := range c.paths {
		s := p.up
		if reverse {
			s = p.down
		}
		out[i] = s.MeanRate()
	}
	return out
}

func printTable(w io.Writer, dir string, rows, alone []*row, sum *row) {
	gp := func(x result) float64 { return x.goodput }
	best := 0.0
	total := 0.0
	if len(sum.runs) > 0 {
		for _, a := range alone {
			best = max(best, a.med(gp))
		}
		total = sum.med(gp)
	}
	fmt.Fprintf(w, "%s:\n\n", strings.ToUpper(dir[:1])+dir[1:])
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| scenario\t| goodput\t| ratio to the sum\t| ratio to the best path\t| RTT p50\t| RTT p95\t| echoes answered\t| retransmissions\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	ratio := func(v, of float64) string {
		if of <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", v/of)
	}
	if len(sum.runs) > 0 {
		rows = append(rows, sum)
	}
	for _, r := range rows {
		if why := r.failures(); why != "" {
			fmt.Fprintf(tw, "| %s\t| %s\t| -\t| -\t| -\t| -\t| -\t| -\t|\n", r.name, why)
			continue
		}
		g := r.med(gp)
		if r.sum {
			fmt.Fprintf(tw, "| %s\t| %.2f Mbit/s\t| 1.000\t| %s\t| -\t| -\t| -\t| -\t|\n", r.name, g/1e6, ratio(g, best))
			continue
		}
		fmt.Fprintf(tw, "| %s\t| %.2f Mbit/s\t| %s\t| %s\t| %.1f ms\t| %.1f ms\t| %.0f %%\t| %.0f\t|\n", r.name, g/1e6, ratio(g, total), ratio(g, best),
			r.med(func(x result) float64 { return float64(x.p50) / 1e6 }), r.med(func(x result) float64 { return float64(x.p95) / 1e6 }),
			100*r.med(func(x result) float64 { return x.pingOK }), r.med(func(x result) float64 { return x.retrans }))
	}
	tw.Flush()
	fmt.Fprintln(w)
}

func up(ctx context.Context, o options, c cellCase) *lab.Lab {
	l, err := lab.Up(ctx, c.topology(), lab.Options{})
	if err != nil {
		drive.Fatal(err)
	}
	return l
}

// server runs the flow's server on host b at addr, with o's congestion control on what it
// accepts (the sender of a download).
func server(l *lab.Lab, o options, addr string) *drive.Proc {
	if o.cc == "" {
		return drive.Server(l, o.braid, addr)
	}
	return drive.Server(l, o.braid, addr, "--cc", o.cc)
}

// flow runs one flow from host a with a ping to pingDst from pingHost, sampling the links in
// the flow's direction.
func flow(l *lab.Lab, links []*lab.Link, run func() traffic.BulkResult, pingHost, pingDst string, reverse bool) result {
	dir := 0
	if reverse {
		dir = 1
	}
	sampler := drive.SampleLinks(links, dir)
	pinger := drive.StartPing(l.Host(pingHost), pingDst, pingInterval)
	res := run()
	rtts, sent := pinger.Stop()
	sampler.Stop()
	r := result{goodput: res.Goodput, retrans: float64(res.Retransmits), paths: sampler.Rates,
		drops: sampler.Drops, peaks: sampler.PeakBacklog,
		p50: kit.Percentile(rtts, 0.50), p95: kit.Percentile(rtts, 0.95)}
	if sent > 0 {
		r.pingOK = float64(len(rtts)) / float64(sent)
	}
	for _, s := range res.Samples {
		r.samples = append(r.samples, s.BitsPerSecond)
	}
	return r
}

func measureAlone(ctx context.Context, o options, c cellCase, i int, reverse bool) result {
	l := up(ctx, o, c)
	defer l.Close()
	defer server(l, o, "0.0.0.0:5201").Stop()
	dst := fmt.Sprintf("10.9.%d.2", i)
	f := drive.Flow{Addr: dst + ":5201", Duration: o.dur, Reverse: reverse, CC: o.cc}
	return flow(l, l.Links(), func() traffic.BulkResult { return f.Run(ctx, l, o.braid) }, "a", dst, reverse)
}

func measureTunnel(ctx context.Context, o options, c cellCase, sched string, capacities []uint64, reverse bool) result {
	l := up(ctx, o, c)
	defer l.Close()
	pair, err := roles.StartTunnelPair(ctx, l, o.braid, roles.SiteSpec{Paths: len(c.paths), Outer: 4, Capacities: capacities, Scheduler: sched, Reorder: o.reorder}, 4)
	if err != nil {
		drive.Fatalf("tunnel %s: %v", sched, err)
	}
	defer pair.Close()
	defer server(l, o, "10.255.0.2:5201").Stop()
	f := drive.Flow{Addr: "10.255.0.2:5201", Duration: o.dur, Reverse: reverse, CC: o.cc}
	name := fmt.Sprintf("%s-%s-%s", c.id, map[bool]string{false: "up", true: "down"}[reverse], sched)
	if capacities != nil {
		name += "-configured"
	}
	dir, keep := stateDir(o)
	stop := sampleStatus(ctx, pair, filepath.Join(dir, name))
	var failed error
	r := flow(l, l.Links(), func() traffic.BulkResult {
		res, err := f.Try(ctx, l, o.braid)
		failed = err
		return res
	}, "a", "10.255.0.2", reverse)
	stop()
	if keep || failed != nil {
		if err := pair.SaveStatus(ctx, filepath.Join(dir, name)+"-"); err != nil {
			drive.Fatal(err)
		}
	}
	if failed != nil {
		// The row says so and the driver fails at its end; the other rows still run.
		r.failed = failed.Error()
		log.Printf("case %s %s, tunnel %s: the flow failed: %v\n%s\nboth tunnels' status each second of the flow, and at its end: %s-a|b.jsonl, %s-a|b.json",
			c.id, direction(reverse), sched, failed, pair.Logs(), filepath.Join(dir, name), filepath.Join(dir, name))
		return r
	}
	if !keep {
		os.RemoveAll(dir)
	}
	// What each path carried, in the log: where the aggregate's goodput came from.
	var carried []string
	for i, rates := range r.paths {
		carried = append(carried, fmt.Sprintf("%s %.2f", c.paths[i].name, mean(rates)/1e6))
	}
	// And what each path's queue did in the flow's direction: where the round trips under
	// load come from.
	var queues []string
	for i, p := range c.paths {
		queues = append(queues, fmt.Sprintf("%s %d dropped, peak %.0f KB", p.name, r.drops[i], float64(r.peaks[i])/1e3))
	}
	log.Printf("case %s %s, tunnel %s: %.2f Mbit/s goodput; paths carried (IP Mbit/s) %s; their queues: %s",
		c.id, direction(reverse), sched, r.goodput/1e6, strings.Join(carried, ", "), strings.Join(queues, "; "))
	return r
}

// stateDir is where a flow's state each second is written: -status DIR (keep), or a temporary
// directory that the caller removes unless the flow fails, so that a stall is explained by what
// the roles did during it.
func stateDir(o options) (dir string, keep bool) {
	if o.status != "" {
		return o.status, true
	}
	dir, err := os.MkdirTemp("", "braid-cellular-")
	if err != nil {
		drive.Fatal(err)
	}
	return dir, false
}

// sampleStatus writes both tunnels' status each second into prefix-a.jsonl and prefix-b.jsonl,
// one line each: {"t": seconds since the start, "status": what braid status --json printed},
// until the returned function is called.
func sampleStatus(ctx context.Context, pair *roles.TunnelPair, prefix string) (stop func()) {
	files := createFiles(prefix, "-a.jsonl", "-b.jsonl")
	return everySecond(func(t float64) {
		for i, f := range files {
			st, err := pair.Status(ctx, i)
			if err != nil {
				continue // the flow goes on; a missing sample shows as a gap in t
			}
			var line bytes.Buffer
			if json.Compact(&line, st) != nil {
				continue
			}
			fmt.Fprintf(f, "{\"t\": %.3f, \"status\": %s}\n", t, line.Bytes())
		}
	}, func() { closeFiles(files) })
}

// createFiles creates prefix+suffix for each suffix (the driver fails if one cannot be).
func createFiles(prefix string, suffixes ...string) []*os.File {
	var files []*os.File
	for _, s := range suffixes {
		f, err := os.Create(prefix + s)
		if err != nil {
			drive.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// everySecond calls sample once a second with the seconds since it started, until the
// returned function is called (more than once is fine), which then calls done.
func everySecond(sample func(t float64), done func()) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	t0 := time.Now()
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			sample(time.Since(t0).Seconds())
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			wg.Wait()
			done()
		})
	}
}

func tenants(st []byte) string {
	var doc struct {
		Proxy struct {
			Tenants json.RawMessage `json:"tenants"`
		} `json:"proxy"`
	}
	var line bytes.Buffer
	if json.Unmarshal(st, &doc) != nil || json.Compact(&line, doc.Proxy.Tenants) != nil {
		return ""
	}
	return "tenants: " + line.String()
}

// mptcpCounters is the MPTcpExt counters of a /proc/net/netstat that are not 0, on one line.
func mptcpCounters(netstat []byte) string {
	lines := strings.Split(string(netstat), "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != "MPTcpExt:" || len(values) != len(names) || values[0] != "MPTcpExt:" {
			continue
		}
		var out []string
		for j := 1; j < len(names); j++ {
			if values[j] != "0" {
				out = append(out, names[j]+"="+values[j])
			}
		}
		return "MPTcpExt: " + strings.Join(out, " ")
	}
	return ""
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func measureProxy(ctx context.Context, o options, c cellCase, reverse bool) result {
	ups := make([]topo.Shape, len(c.paths))
	for i, p := range c.paths {
		ups[i] = p.up
	}
	f, err := federation.StartFed(ctx, kit.Options{}, o.braid, nil, false, ups...)
	if err != nil {
		drive.Fatal(err)
	}
	defer f.Close()
	var wan []*lab.Link
	for i, p := range c.paths {
		lk := f.L.Link(fmt.Sprintf("wan%d", i))
		lk.SetShape(1, p.down) // p2 (the hub) to p1 (the site)
		wan = append(wan, lk)
	}
	cfg := federation.FedConfig{Name: "MPTCP", Proxy: true, MPTCP: true, PM: "braid", Uplinks: len(c.paths)}
	if err := f.Use(ctx, cfg); err != nil {
		drive.Fatalf("proxy: %v\n%s", err, f.Logs())
	}
	// The proxies' state each second of the flow: kept in -status DIR, or, without it, in a
	// temporary directory that is removed unless the flow fails (a stalled connection is then
	// explained by what its subflows did).
	dir, keep := stateDir(o)
	name := fmt.Sprintf("%s-%s-proxy", c.id, map[bool]string{false: "up", true: "down"}[reverse])
	stop := sampleProxies(ctx, f, o.braid, filepath.Join(dir, name))
	var failed error
	r := flow(f.L, wan, func() traffic.BulkResult {
		res, err := f.Bulk(ctx, traffic.BulkOptions{Duration: o.dur, Reverse: reverse})
		failed = err
		return res
	}, "c", federation.FedServer4, reverse)
	stop()
	if failed != nil {
		// The row says so and the driver fails at its end; the other rows still run.
		r.failed = failed.Error()
		log.Printf("case %s %s, proxy: the flow failed: %v\n%s\nboth proxies' status and sockets, each second of the flow: %s-p1.txt, %s-p2.txt",
			c.id, direction(reverse), failed, f.Logs(), filepath.Join(dir, name), filepath.Join(dir, name))
	} else if !keep {
		os.RemoveAll(dir)
	}
	return r
}

// sampleProxies writes, each second of the flow, both proxies' `braid status` (and their
// tenants' counters from --json), their namespaces' MPTCP counters and their sockets'
// `ss -tinM` (the client side's TCP, the MPTCP connections and their subflows) into
// prefix-p1.txt and prefix-p2.txt, each sample under a line "== t=SECONDS", until the
// returned function is called (more than once is fine).
func sampleProxies(ctx context.Context, f *federation.FedLab, bin, prefix string) (stop func()) {
	files := createFiles(prefix, "-p1.txt", "-p2.txt")
	return everySecond(func(t float64) {
		for i, h := range []string{"p1", "p2"} {
			host := f.L.Host(h)
			st, _ := host.Run(ctx, bin, "status", "--addr", "127.0.0.1:9478")
			js, _ := host.Run(ctx, bin, "status", "--addr", "127.0.0.1:9478", "--json")
			ss, _ := host.Run(ctx, "ss", "-tinM")
			// The namespace's MPTCP counters (MPTcpExt: joins, re-sends, data dropped above
			// TCP), read by a process inside it.
			netstat, _ := host.Run(ctx, "cat", "/proc/net/netstat")
			fmt.Fprintf(files[i], "== t=%.3f\n%s\n%s\n%s\n%s\n", t, st, tenants(js), mptcpCounters(netstat), ss)
		}
	}, func() { closeFiles(files) })
}

func plot(file string, c cellCase, r result) error {
	ch := kit.Chart{Title: fmt.Sprintf("Case %s: upload through braid tunnel (%s)", strings.ToUpper(c.id), schedulers[0]), XLabel: "time (s)", YLabel: "rate per second (Mbit/s)"}
	series := func(name string, v []float64) kit.Series {
		s := kit.Series{Name: name, Color: kit.Palette[len(ch.Series)%len(kit.Palette)]}
		for i, x := range v {
			s.X, s.Y = append(s.X, float64(i+1)), append(s.Y, x/1e6)
		}
		return s
	}
	for i, p := range c.paths {
		if i < len(r.paths) {
			ch.Series = append(ch.Series, series(p.name+" (IP bytes)", r.paths[i]))
		}
	}
	ch.Series = append(ch.Series, series("tunnel TCP goodput", r.samples))
	return ch.Save(file)
}
