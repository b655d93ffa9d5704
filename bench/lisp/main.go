// Command lisp benchmarks braid's LISP roles and writes its section of bench/BENCH.md.
//
// Three tables, each the median of -runs runs:
//
//   - map-resolver: ECM Map-Requests per second answered by an in-process map server on
//     loopback with 10 000 registered EID prefixes (proxy replies), and the p50/p99 latency of
//     each request, from closed-loop clients (one request in flight each); negative replies
//     (space no site holds) measured the same way;
//   - map server at scale (scale.go): for each -scale size (10 000 and 1 000 000 prefixes),
//     the live heap the registrations hold (in all and per prefix), the registration rate, and
//     the resolver's rate and p50/p99 at that size, as a ratio to the first size's rate;
//   - xTR: TCP bulk goodput between two hosts through two braid xTRs (encapsulation on UDP
//     4341, both ways), as a ratio to the same transfer forwarded natively over the same
//     emulated links (the baseline, same run), and through a braid tunnel between the same
//     routers over the same links. The xTRs and the tunnels are `braid` processes (-braid)
//     in their routers, as deployed; -in-process runs them in this process instead.
//
// Usage: go run ./bench/lisp -braid bin/braid -runs 5 -out bench/out/lisp.md
//
// -xtrprofile FILE profiles each transfer through the xTRs alone (FILE, FILE.2, ...) and each
// baseline transfer (FILE.native, FILE.native.2, ...), without the rest of the run; with
// -in-process only, since it profiles this process.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/lisp/mapserver"
	"braid/internal/traffic"
	"braid/internal/tun"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
	"braid/internal/units"
	"braid/internal/wire/lisp"
)

func main() {
	flag.StringVar(&braidBin, "braid", "bin/braid", "path of the braid binary: the xTRs of the xTR table run as `braid xtr` processes")
	flag.BoolVar(&inProcess, "in-process", false, "run the xTRs in this process instead (goroutines sharing its runtime with the emulated links and the hosts' traffic; -cpuprofile and -xtrprofile then see them)")
	runs := flag.Int("runs", 5, "runs per figure; the tables show medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	out := flag.String("out", "bench/out/lisp.md", "where to write this section (Markdown)")
	prefixes := flag.Int("prefixes", 10000, "registered EID prefixes")
	clientList := flag.String("clients", "4,16", "concurrent resolver clients, one table row per value (comma-separated)")
	scaleList := flag.String("scale", "10000,1000000", "registered prefixes of the scale table's rows (comma-separated; empty: no table)")
	withXTR := flag.Bool("xtr", true, "measure the xTR table too (a lab: needs root)")
	scaleClients := flag.Int("scale-clients", 16, "concurrent resolver clients in the scale table")
	withResolver := flag.Bool("resolver", true, "measure the map-resolver (false: the xTR table only)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the xTR measurements (with -in-process: the xTRs, emulated links and hosts all run in this process) to this file")
	flag.StringVar(&xtrProfile, "xtrprofile", "", "write a CPU profile of each transfer through the xTRs only to this file (.2, .3, ... for later runs), and of each baseline transfer to this file's .native (.native.2, ...)")
	flag.Parse()
	log.SetFlags(0)
	if *cpuProfile != "" && xtrProfile != "" {
		log.Fatal("-cpuprofile and -xtrprofile: one CPU profile at a time")
	}
	if (*cpuProfile != "" || xtrProfile != "") && !inProcess {
		log.Fatal("-cpuprofile and -xtrprofile profile this process: add -in-process, or the xTRs are not in the profile")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	dur := 5 * time.Second
	if *quick {
		dur = time.Second
	}
	clients := positiveList("clients", *clientList)
	var sizes []int
	if *scaleList != "" {
		sizes = positiveList("scale", *scaleList)
	}
	if *withResolver {
		drive.Section(w, "LISP map-resolver")
		fmt.Fprintf(w, "`go run ./bench/lisp -runs %d` (%s, %d cores). An in-process braid map server on loopback\nwith %d registered EID prefixes (100 sites, proxy replies, rate limit off); closed-loop clients\n(one ECM Map-Request in flight each, on the same machine, sharing its cores with the server) for\n%v per run. Latency is the client's, from send to reply. Medians of %d runs.\n\n",
			*runs, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), *prefixes, dur, *runs)
		resolver(w, *prefixes, clients, dur, *runs)
		fmt.Fprintln(w)
	}
	if len(sizes) > 0 {
		drive.Section(w, "LISP map server at scale")
		fmt.Fprintf(w, "`go run ./bench/lisp -runs %d -scale %s` (%s, %d cores). A fresh in-process braid map server per run;\nsites of 1000 /24 EID prefixes each (two locators, proxy replies) register in Map-Registers of\n100 records. Heap: live heap after GC with the registrations less before them, and per prefix.\nThen %d closed-loop clients send ECM Map-Requests for random registered EIDs for %v on loopback\n(sharing the cores with the server), as in the table above. Medians of %d runs.\n\n",
			*runs, *scaleList, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), *scaleClients, dur, *runs)
		scale(w, sizes, *scaleClients, dur, *runs)
		fmt.Fprintln(w)
	}
	if !*withXTR {
		writeOut(*out, md.Bytes())
		return
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	drive.Section(w, "LISP xTR encapsulation")
	where := "each a `braid xtr` process in its router, as deployed"
	if inProcess {
		where = "each in the bench's process (`-in-process`), sharing its runtime with the emulated links"
	}
	fmt.Fprintf(w, "TCP bulk h1 -> h2 for %v between two LISP sites of `roles.LispTopology` (links unshaped,\n%s): through two braid xTRs (%s; TUN with offloads, encapsulation on UDP 4341 in GSO\ntrains, hash placement), beside the same hosts forwarded natively over the same links and through a braid\ntunnel (one path, wrr, run as the xTRs are) between the same two routers over their first RLOCs, in the same lab. Medians of %d runs.\n\n", dur, lab.EmulatorName, where, *runs)
	if err := xtrThroughput(ctx, w, dur, *runs); err != nil {
		fmt.Fprintf(w, "not measured: %v\n", err)
	}
	writeOut(*out, md.Bytes())
}

func writeOut(path string, b []byte) {
	if path == "" {
		return
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		log.Fatal(err)
	}
}

// positiveList parses the comma-separated positive numbers of flag name.
func positiveList(name, list string) []int {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("-%s %q: want positive numbers separated by commas", name, list)
		}
		out = append(out, n)
	}
	return out
}

type resolverResult struct {
	rps      float64
	p50, p99 time.Duration
}

func resolver(w io.Writer, prefixes int, clients []int, dur time.Duration, runs int) {
	cfg := mapserver.Defaults()
	cfg.RatePerSource = 0
	cfg.RatePerDestination = 0 // every client is on 127.0.0.1
	cfg.Logger = nil
	var eids []netip.Addr
	var regs [][]byte
	for s := range 100 {
		key := fmt.Sprintf("site-%d", s)
		site := mapserver.Site{Name: key, Keys: map[uint8][]byte{0: []byte(key)}, ProxyReply: true}
		var recs []lisp.Record
		for i := range prefixes / 100 {
			n := s*(prefixes/100) + i
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), 0}), 24)
			site.Prefixes = append(site.Prefixes, p)
			eids = append(eids, p.Addr().Next())
			recs = append(recs, lisp.Record{TTL: 10, MaskLen: 24, Authoritative: true, EID: lisp.AddrFrom(p.Addr()), Locators: []lisp.Locator{
				{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.AddrFrom4([4]byte{172, 16, byte(s), 1}))},
				{Priority: 1, Weight: 50, Flags: lisp.LocReachable, Addr: lisp.AddrFrom(netip.AddrFrom4([4]byte{172, 17, byte(s), 1}))}}})
		}
		cfg.Sites = append(cfg.Sites, site)
		for len(recs) > 0 {
			k := min(len(recs), 100)
			m := lisp.MapRegister{Nonce: uint64(len(regs) + 1), AlgID: lisp.AlgHMACSHA256, AuthData: make([]byte, 32), Records: recs[:k]}
			b := make([]byte, m.Len())
			m.Encode(b)
			lisp.Sign(b, []byte(key))
			regs = append(regs, b)
			recs = recs[k:]
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| query\t| clients\t| requests/s\t| p50\t| p99\t| target\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|")
	for _, kind := range []string{"registered EID (proxy reply)", "unknown space (negative reply)"} {
		for _, nc := range clients {
			var rs []resolverResult
			for range runs {
				srv, err := mapserver.New(cfg)
				if err != nil {
					log.Fatal(err)
				}
				for _, b := range regs {
					srv.Handle(time.Now(), netip.MustParseAddrPort("172.16.0.1:4342"), b, nil)
				}
				if n := len(srv.Registrations(time.Now())); n != prefixes {
					log.Fatalf("%d prefixes registered, want %d", n, prefixes)
				}
				targets := eids
				if kind[0] == 'u' {
					targets = []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("11.1.2.3"), netip.MustParseAddr("198.51.100.7")}
				}
				rs = append(rs, resolverRun(srv, targets, nc, dur))
			}
			slices.SortFunc(rs, func(a, b resolverResult) int { return int(a.rps - b.rps) })
			m := rs[len(rs)/2]
			p50s, p99s := make([]time.Duration, len(rs)), make([]time.Duration, len(rs))
			for i, r := range rs {
				p50s[i], p99s[i] = r.p50, r.p99
			}
			slices.Sort(p50s)
			slices.Sort(p99s)
			fmt.Fprintf(tw, "| %s\t| %d\t| %.0f\t| %v\t| %v\t| ≥ 50000/s, p99 < 1 ms\t|\n", kind, nc, m.rps, p50s[len(rs)/2].Round(time.Microsecond), p99s[len(rs)/2].Round(time.Microsecond))
		}
	}
	tw.Flush()
}

func resolverRun(srv *mapserver.Server, targets []netip.Addr, clients int, dur time.Duration) resolverResult {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	conn.SetReadBuffer(8 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, conn) }()
	addr := conn.LocalAddr().(*net.UDPAddr)
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			cc, err := net.DialUDP("udp4", nil, addr)
			if err != nil {
				log.Fatal(err)
			}
			defer cc.Close()
			local := cc.LocalAddr().(*net.UDPAddr).AddrPort()
			buf := make([]byte, 2048)
			var mine []time.Duration
			i := c
			for time.Since(start) < dur {
				eid := targets[(i*7919)%len(targets)]
				i++
				msg := request(eid, local, uint64(i))
				t0 := time.Now()
				cc.Write(msg)
				cc.SetReadDeadline(t0.Add(time.Second))
				n, err := cc.Read(buf)
				if err != nil {
					continue // lost: counted as not answered
				}
				var r lisp.MapReply
				if _, err := r.Decode(buf[:n]); err != nil || r.Nonce != uint64(i) {
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cancel()
	<-done
	slices.Sort(lat)
	if len(lat) == 0 {
		log.Fatal("no replies")
	}
	return resolverResult{rps: float64(len(lat)) / elapsed.Seconds(), p50: lat[len(lat)/2], p99: lat[len(lat)*99/100]}
}

func request(eid netip.Addr, local netip.AddrPort, nonce uint64) []byte {
	req := lisp.MapRequest{Nonce: nonce, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(local.Addr())},
		Records: []lisp.RequestRecord{{MaskLen: 32, EID: lisp.AddrFrom(eid)}}}
	e := lisp.ECM{Inner: lisp.IPUDP{Src: local, Dst: netip.AddrPortFrom(eid, lisp.ControlPort), TTL: 64, PayloadLen: uint16(req.Len())}}
	b := make([]byte, e.Len()+req.Len())
	req.Encode(b[e.Len():])
	e.Encode(b)
	return b
}

func xtrThroughput(ctx context.Context, w io.Writer, dur time.Duration, runs int) error {
	var base, braid, tunl, rx, rt []float64
	for range runs {
		b, x, tn, err := xtrRun(ctx, dur)
		if err != nil {
			return err
		}
		base, braid, tunl = append(base, b), append(braid, x), append(tunl, tn)
		rx, rt = append(rx, x/b), append(rt, tn/b)
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| flow\t| baseline (native forwarding)\t| braid xTRs\t| ratio\t| braid tunnel (same links)\t| ratio\t| target\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|---\t|---\t|---\t|---\t|")
	fmt.Fprintf(tw, "| TCP bulk h1 -> h2\t| %s\t| %s\t| %.3f\t| %s\t| %.3f\t| xTRs ≥ 0.6 of native\t|\n", units.FormatRate(uint64(med(base))),
		units.FormatRate(uint64(med(braid))), med(rx), units.FormatRate(uint64(med(tunl))), med(rt))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nRatios are per run (each against the native transfer of its own lab), then the median.\n")
	return nil
}

// xtrProfile is -xtrprofile; profiled counts the transfers it profiled, by suffix.
var (
	xtrProfile string
	profiled   = map[string]int{}
)

// profileTransfer starts the CPU profile of one transfer (-xtrprofile; suffix "" for one
// through the xTRs, ".native" for a baseline) and returns what stops it; a no-op without the
// flag.
func profileTransfer(suffix string) func() {
	if xtrProfile == "" {
		return func() {}
	}
	profiled[suffix]++
	name := xtrProfile + suffix
	if n := profiled[suffix]; n > 1 {
		name += "." + strconv.Itoa(n)
	}
	f, err := os.Create(name)
	if err != nil {
		log.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// xtrRun measures one baseline, one tunnel and one xTR transfer on a fresh lab.
func xtrRun(ctx context.Context, dur time.Duration) (base, braid, tunl float64, err error) {
	t := roles.LispTopology(0, 0)
	// The baseline's routes: the core knows each site's EIDs behind the first RLOC.
	for i := range t.Hosts {
		if t.Hosts[i].Name == "core" {
			for _, s := range roles.LispSites {
				t.Hosts[i].Routes = append(t.Hosts[i].Routes, topo.Route{Dst: s.EIDs[0], Via: s.RLOCs[0]})
			}
		}
	}
	l, err := lab.Up(ctx, t, lab.Options{})
	if err != nil {
		return 0, 0, 0, err
	}
	defer l.Close()
	h1, h2 := l.Host("h1"), l.Host("h2")
	srvAddr := netip.AddrPortFrom(roles.LispSites[1].HostIP[0], 5201).String()
	stop, err := kit.StartServer(ctx, h2, srvAddr)
	if err != nil {
		return 0, 0, 0, err
	}
	defer stop()
	native := []topo.Route{
		{Dst: roles.LispSites[1].EIDs[0], Via: roles.LispSites[0].RLOCs[0].Next()},
		{Dst: roles.LispSites[0].EIDs[0], Via: roles.LispSites[1].RLOCs[0].Next()},
	}
	for i, r := range []string{"xtr1", "xtr2"} {
		if err := l.Host(r).ReplaceRoute(native[i]); err != nil {
			return 0, 0, 0, err
		}
	}
	stopProfile := profileTransfer(".native")
	b, err := traffic.Bulk(ctx, h1.Dial, srvAddr, traffic.BulkOptions{Duration: dur})
	stopProfile()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("baseline: %w", err)
	}
	// The native /24 routes go; first each site's EIDs are routed into a braid tunnel between
	// the routers, over their first RLOCs.
	for i, r := range []string{"xtr1", "xtr2"} {
		if _, err := l.Host(r).Run(ctx, "ip", "route", "del", native[i].Dst.String()); err != nil {
			return 0, 0, 0, err
		}
	}
	tn, err := tunnelRun(ctx, l, dur, srvAddr, native)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("through the tunnel: %w", err)
	}
	// Then through the xTRs: the EID space is routed into their TUNs.
	var counters func() string
	if inProcess {
		ll, err := roles.StartLisp(ctx, l, nil)
		if err != nil {
			return 0, 0, 0, err
		}
		defer ll.Close()
		counters = func() string {
			return fmt.Sprintf("xtr1 counters %v, xtr2 counters %v", ll.XTRs[0].Status().Counters, ll.XTRs[1].Status().Counters)
		}
	} else {
		stop, show, err := startXTRProcesses(ctx, l)
		if err != nil {
			return 0, 0, 0, err
		}
		defer stop()
		counters = show
	}
	// Resolve first, so that the measurement is of the data path.
	if _, err := kit.Ping(ctx, h1, h2, roles.LispSites[1].HostIP[0], time.Second); err != nil {
		return 0, 0, 0, fmt.Errorf("ping through the xTRs: %w (%s)", err, counters())
	}
	stopProfile = profileTransfer("")
	x, err := traffic.Bulk(ctx, h1.Dial, srvAddr, traffic.BulkOptions{Duration: dur})
	stopProfile()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("through the xTRs: %w (%s)", err, counters())
	}
	if err := routedInto(ctx, l, "lisp0", 0); err != nil {
		return 0, 0, 0, fmt.Errorf("after the transfer through the xTRs: %w (%s)", err, counters())
	}
	return b.Goodput, x.Goodput, tn, nil
}

// braidBin is -braid; inProcess is -in-process.
var (
	braidBin  string
	inProcess bool
)

// xtrKey is site s's authentication key with the map server: the lab's, lengthened to what a
// site file requires.
func xtrKey(s roles.LispSite) string { return s.Key + "-0123456789" }

// startXTRProcesses runs the map server (in this process: it is not on the data path) and each
// site's xTR as a `braid xtr --config FILE` process in its router, with the options of
// roles.LispSiteXTROptions, and waits until both have registered. stop ends them; show returns
// their `braid xtr show`, for errors.
func startXTRProcesses(ctx context.Context, l *lab.Lab) (stop func(), show func() string, err error) {
	cfg := roles.LispMapServerConfig()
	for i, s := range roles.LispSites {
		cfg.Sites[i].Keys = map[uint8][]byte{0: []byte(xtrKey(s))}
	}
	_, stopMS, err := roles.StartMapServer(ctx, l.Host("ms"), roles.LispMapServer, cfg)
	if err != nil {
		return nil, nil, err
	}
	ps, err := newProcs()
	if err != nil {
		stopMS()
		return nil, nil, err
	}
	stop = func() {
		ps.stop()
		stopMS()
	}
	show = func() string {
		var b strings.Builder
		for _, s := range roles.LispSites {
			out, _ := l.Host(s.Router).Run(ctx, braidBin, "xtr", "show")
			fmt.Fprintf(&b, "%s: %s", s.Router, out)
		}
		return b.String() + ps.String()
	}
	o := roles.LispSiteXTROptions(roles.LispSites[0])
	for _, s := range roles.LispSites {
		var text strings.Builder
		fmt.Fprintf(&text, "[xtr]\neid_prefixes = [%q, %q]\nroutes = [", s.EIDs[0], s.EIDs[1])
		for i, p := range roles.LispEIDSpace {
			if i > 0 {
				text.WriteString(", ")
			}
			fmt.Fprintf(&text, "%q", p)
		}
		fmt.Fprintf(&text, "]\nmap_resolvers = [%q]\nprobe_interval = %q\ndown_after = %q\nregister_interval = %q\n",
			roles.LispMapServer, o.ProbeInterval, o.DownAfter, o.RegisterInterval)
		for j, r := range s.RLOCs {
			fmt.Fprintf(&text, "[[xtr.rloc]]\naddress = %q\ninterface = %q\npriority = 1\nweight = 50\n", r, s.Ifaces[j])
		}
		fmt.Fprintf(&text, "[[xtr.map_server]]\naddress = %q\nkey = %q\n", roles.LispMapServer, xtrKey(s))
		h := l.Host(s.Router)
		for _, k := range []string{"ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter"} {
			if err := h.NS.Sysctl(k, "0"); err != nil {
				stop()
				return nil, nil, err
			}
		}
		if err := ps.start(h, "xtr", s.Router, text.String()); err != nil {
			stop()
			return nil, nil, err
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range roles.LispSites {
		for {
			out, _ := l.Host(s.Router).Run(ctx, braidBin, "xtr", "show")
			if strings.Contains(string(out), "registered, last Map-Notify") {
				break
			}
			if time.Now().After(deadline) {
				err := fmt.Errorf("xTRs not registered after 10 s: %s", show())
				stop()
				return nil, nil, err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return stop, show, nil
}

// routedInto waits at most wait until both routers route the other site's host into device
// dev. The core routes each site's EIDs to its first RLOC, so without the xTR's or tunnel's
// routes a transfer would still go through, natively; and a process that exits takes its
// device and routes with it, so the check after a transfer shows it ran throughout.
func routedInto(ctx context.Context, l *lab.Lab, dev string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for i, s := range roles.LispSites {
		dst := roles.LispSites[1-i].HostIP[0].String()
		for {
			out, _ := l.Host(s.Router).Run(ctx, "ip", "route", "get", dst)
			if strings.Contains(string(out), " dev "+dev+" ") {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s does not route %s into %s: %s", s.Router, dst, dev, strings.TrimSpace(string(out)))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// procs are braid processes started in lab hosts, each from a site file in dir and logging
// (stdout and stderr) to a file beside it.
type procs struct {
	dir  string
	cmds []*exec.Cmd
	logs []string // the log files, by process
}

func newProcs() (*procs, error) {
	dir, err := os.MkdirTemp("", "braid-bench-lisp-")
	if err != nil {
		return nil, err
	}
	return &procs{dir: dir}, nil
}

// start writes site file text as NAME.toml and starts `braid ROLE --config NAME.toml` in h.
func (p *procs) start(h *lab.Host, role, name, text string) error {
	file := filepath.Join(p.dir, name+".toml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		return err
	}
	lf, err := os.Create(filepath.Join(p.dir, name+".log"))
	if err != nil {
		return err
	}
	defer lf.Close() // the process has its own descriptor
	cmd := exec.Command(braidBin, role, "--config", file)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := h.Start(cmd); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	p.cmds, p.logs = append(p.cmds, cmd), append(p.logs, lf.Name())
	return nil
}

// String is what the processes logged so far.
func (p *procs) String() string {
	var b strings.Builder
	for _, f := range p.logs {
		out, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "%s: %s\n", filepath.Base(f), out)
	}
	return b.String()
}

// stop ends the processes and removes their files.
func (p *procs) stop() {
	for _, c := range p.cmds {
		c.Process.Signal(syscall.SIGTERM)
		c.Wait()
	}
	os.RemoveAll(p.dir)
}

// tunnelRun measures h1 -> h2 through a braid tunnel between the two routers over their first
// RLOCs (one path), each site's EIDs routed into it; the tunnel is gone when it returns. The
// tunnels run as `braid tunnel` processes, like the xTRs, unless -in-process.
func tunnelRun(ctx context.Context, l *lab.Lab, dur time.Duration, srvAddr string, native []topo.Route) (float64, error) {
	if inProcess {
		return tunnelRunInProcess(ctx, l, dur, srvAddr, native)
	}
	routers := []string{"xtr1", "xtr2"}
	keys, err := tunnelKeys()
	if err != nil {
		return 0, err
	}
	ps, err := newProcs()
	if err != nil {
		return 0, err
	}
	defer ps.stop()
	for i, r := range routers {
		local, remote := roles.LispSites[i].RLOCs[0], roles.LispSites[1-i].RLOCs[0]
		// One path: the scheduler has nothing to choose, so wrr, which sends at once; the
		// default paced scheduler, with no capacity configured, carried a fraction of this on
		// these unshaped emulated links (docs/lisp.md, "Data path performance").
		text := fmt.Sprintf("[tunnel]\nprivate_key = %q\naddress = [\"10.255.0.%d/24\"]\ncontrol = %q\nmtu = 1400\nscheduler = \"wrr\"\n"+
			"[[tunnel.uplink]]\nname = \"up0\"\ninterface = %q\naddress = %q\n"+
			"[[tunnel.peer]]\nname = %q\npublic_key = %q\nroutes = [%q]\n[[tunnel.peer.path]]\nuplink = \"up0\"\nremote = %q\n",
			keys[i].String(), i+1, filepath.Join(ps.dir, r+".sock"), roles.LispSites[i].Ifaces[0], local,
			routers[1-i], keys[1-i].Public().String(), native[i].Dst, netip.AddrPortFrom(remote, roles.TunnelPort))
		if err := ps.start(l.Host(r), "tunnel", r, text); err != nil {
			return 0, err
		}
	}
	if err := routedInto(ctx, l, "braid0", 10*time.Second); err != nil {
		return 0, fmt.Errorf("%w (%s)", err, ps)
	}
	if _, err := kit.Ping(ctx, l.Host("h1"), l.Host("h2"), roles.LispSites[1].HostIP[0], time.Second); err != nil {
		return 0, fmt.Errorf("ping through the tunnel: %w (%s)", err, ps)
	}
	r, err := traffic.Bulk(ctx, l.Host("h1").Dial, srvAddr, traffic.BulkOptions{Duration: dur})
	if err != nil {
		return 0, err
	}
	if err := routedInto(ctx, l, "braid0", 0); err != nil {
		return 0, fmt.Errorf("after the transfer: %w (%s)", err, ps)
	}
	return r.Goodput, nil
}

// tunnelKeys generates the two routers' tunnel keys.
func tunnelKeys() (keys [2]session.PrivateKey, err error) {
	for i := range keys {
		if keys[i], err = session.GenerateKey(); err != nil {
			return keys, err
		}
	}
	return keys, nil
}

// tunnelRunInProcess is tunnelRun with the tunnels in this process (-in-process).
func tunnelRunInProcess(ctx context.Context, l *lab.Lab, dur time.Duration, srvAddr string, native []topo.Route) (float64, error) {
	routers := []string{"xtr1", "xtr2"}
	keys, err := tunnelKeys()
	if err != nil {
		return 0, err
	}
	var stops []func() error
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	var tns []*tunnel.Tunnel
	for i, r := range routers {
		local, remote := roles.LispSites[i].RLOCs[0], roles.LispSites[1-i].RLOCs[0]
		inner := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 255, 0, byte(i + 1)}), 24)
		peer := tunnel.PeerConfig{Name: routers[1-i], PublicKey: keys[1-i].Public(), Routes: []netip.Prefix{native[i].Dst},
			Paths: []tunnel.PathConfig{{Uplink: local.String(), Remote: netip.AddrPortFrom(remote, roles.TunnelPort)}}}
		// One path: the scheduler has nothing to choose, so wrr, which sends at once; the
		// default paced scheduler, with no capacity configured, carried a fraction of this on
		// these unshaped emulated links (docs/lisp.md, "Data path performance").
		tn, stop, err := roles.StartTunnel(ctx, l.Host(r), []netip.Prefix{inner}, []netip.Addr{local},
			tunnel.Options{PrivateKey: keys[i], MTU: 1400, Scheduler: "wrr", Peers: []tunnel.PeerConfig{peer}})
		if err != nil {
			return 0, err
		}
		stops = append(stops, stop)
		tns = append(tns, tn)
		if err := tun.AddRoute(l.Host(r).NS.Netlink(), "braid0", native[i].Dst); err != nil {
			return 0, err
		}
	}
	for _, tn := range tns {
		if err := roles.WaitTunnel(ctx, tn, 10*time.Second); err != nil {
			return 0, err
		}
	}
	r, err := traffic.Bulk(ctx, l.Host("h1").Dial, srvAddr, traffic.BulkOptions{Duration: dur})
	if err != nil {
		return 0, err
	}
	return r.Goodput, nil
}
