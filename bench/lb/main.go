// Command lb benchmarks braid lb's XDP data plane and writes its section of bench/BENCH.md.
//
// Two tables, each the median of -runs runs:
//
//   - cost per packet: the kernel's time per run of the program under BPF_PROG_RUN for each
//     kind of packet (established flows, first SYNs, third ACKs that teach a token with SHA-256
//     or SHA-1, joins steered by token, joins dropped), beside the baseline of plain XDP_TX
//     forwarding (the MACs swapped) measured the same way in the same run;
//   - forwarding rate on veth: packets per second that the program forwards (XDP_TX out of a
//     veth, received by an XDP sink on the peer) in live-frames mode, as a ratio to the same
//     for the baseline program.
//
// The established rows include an MPTCP data packet (timestamps and a DSS), on a plain flow and
// on a subflow whose token was learned.
//
// Usage: go run ./bench/lb -runs 5 -out bench/out/lb.md
//
// For a profile: go run ./bench/lb -spin 10s -packet est4 runs one kind of packet under
// BPF_PROG_RUN for that long and prints its PID, for perf record -p PID.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"braid/bench/internal/drive"
	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lb/maglev"
	"braid/internal/lb/xdp"
	"braid/internal/wire/mptcpopt"
)

var (
	vip4 = netip.MustParseAddrPort("10.100.0.1:80")
	vip6 = netip.MustParseAddrPort("[fd00:100::1]:80")
)

func main() {
	flag.String("braid", "bin/braid", "path of the braid binary (unused: the data plane is loaded in process)")
	runs := flag.Int("runs", 5, "runs per figure; the tables show medians")
	quick := flag.Bool("quick", false, "short measurements: a smoke run")
	out := flag.String("out", "bench/out/lb.md", "where to write this section (Markdown)")
	spin := flag.Duration("spin", 0, "instead of the tables: run one kind of packet (-packet) this long under BPF_PROG_RUN, for a profiler (perf record -p PID)")
	packet := flag.String("packet", "est4", "with -spin: est4, est4opts (timestamps and DSS), est6 or baseline")
	flag.Parse()
	log.SetFlags(0)
	if *spin > 0 {
		if err := spinRun(*spin, *packet); err != nil {
			log.Fatal(err)
		}
		return
	}
	var md bytes.Buffer
	w := io.MultiWriter(os.Stdout, &md)
	repeat, flows, live := 200000, 2000, 2000000
	if *quick {
		repeat, flows, live = 20000, 200, 200000
	}
	drive.Section(w, "LB data plane: cost per packet")
	fmt.Fprintf(w, "`go run ./bench/lb -runs %d` (%s, %d cores, Linux XDP through BPF_PROG_RUN). The kernel's\n"+
		"time per run of the program, 4 backends, MPTCP-aware, MAC rewrite. Steady-state rows repeat one\n"+
		"packet %d times; rows that change state (a new flow, a token learned) run %d distinct packets\n"+
		"once each, so they include the test-run timer's fixed cost per call, as the baseline row of\n"+
		"the same kind shows. Medians of %d runs.\n\n", *runs, time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), repeat, flows, *runs)
	if err := costTable(w, *runs, repeat, flows); err != nil {
		log.Fatal(err)
	}
	fmt.Fprintln(w)
	drive.Section(w, "LB data plane: forwarding rate on veth")
	fmt.Fprintf(w, "Live-frames BPF_PROG_RUN: %d frames of an established IPv4 flow (74 bytes) injected as if\n"+
		"received on one end of a veth pair; the program sends them back out with XDP_TX and an XDP\n"+
		"sink on the peer counts them. The baseline is plain XDP_TX forwarding (MACs swapped) on the\n"+
		"same pair in the same run, just before the balancer. Medians of %d runs; the ratio is the median of\n"+
		"each run's ratio. On a shared machine the wall-clock rate also counts the time other work held\n"+
		"the core; the rate per CPU-second of the injecting thread (which runs the program, the veth\n"+
		"transmit and, where the kernel does it there, the peer's receive) does not.\n\n", live, *runs)
	if err := vethTable(w, *runs, live); err != nil {
		fmt.Fprintf(w, "not measured: %v\n", err)
	}
	if *out != "" {
		if err := os.WriteFile(*out, md.Bytes(), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

func client(i int, v6 bool) netip.AddrPort {
	port := uint16(1024 + i%60000)
	if v6 {
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0xd, 0xb8, 12: byte(i >> 24), 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)}), port)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, byte(i >> 16), byte(i >> 8), byte(i)}), port)
}

var planeConfig = xdp.Config{Aware: true, HashSeed: 1, SrcMAC: net.HardwareAddr{2, 0x4c, 0x42, 0, 0, 1}}

// setup loads the data plane with 4 backends behind vip4 and vip6.
func setup() (*xdp.Dataplane, error) {
	d, err := xdp.Load(xdp.Options{Conns: 1 << 20, Tokens: 1 << 18})
	if err != nil {
		return nil, err
	}
	if err := d.SetConfig(planeConfig); err != nil {
		d.Close()
		return nil, err
	}
	var bs []maglev.Backend
	for i := 0; i < 4; i++ {
		d.SetBackend(uint32(i), xdp.Backend{MAC: net.HardwareAddr{2, 0xbe, 0, 0, 0, byte(i)}, Addr: netip.AddrFrom4([4]byte{10, 50, 0, byte(i + 1)})})
		bs = append(bs, maglev.Backend{Name: fmt.Sprint("b", i), ID: uint32(i), Weight: 1})
	}
	table := maglev.Table(bs, xdp.TableSize)
	for id, v := range []netip.AddrPort{vip4, vip6} {
		d.SetService(uint32(id), v)
		d.SetTable(uint32(id), table)
	}
	return d, nil
}

var key = [8]byte{0xd4, 0x1c, 0x1a, 0x70, 0x7a, 0xd2, 0x8d, 0xc6}

func synOpts() []byte {
	return mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: 4, Version: 1, Flags: 1})
}

func ackOpts(version uint8, i int) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], uint64(i)*0x9e3779b97f4a7c15+1)
	return mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: 20, Version: version, Flags: 1, SenderKey: key, ReceiverKey: k})
}

type row struct {
	name    string
	ns      []float64
	repeats bool // steady state (repeat) or distinct packets once each
}

func costTable(w io.Writer, runs, repeat, flows int) error {
	rows := []*row{
		{name: "baseline: plain XDP_TX (repeated)", repeats: true},
		{name: "established IPv4 flow (repeated)", repeats: true},
		{name: "established IPv6 flow (repeated)", repeats: true},
		{name: "TCP not for a service, passed (repeated)", repeats: true},
		{name: "MP_JOIN SYN, unknown token, dropped (repeated)", repeats: true},
		{name: "baseline: plain XDP_TX (once each)"},
		{name: "established IPv4 flow, MAC rewrite (once each)"},
		{name: "established IPv4 flow, IP-in-IP encapsulation (once each)"},
		{name: "first SYN with MP_CAPABLE: Maglev + new flow (once each)"},
		{name: "third ACK, token learned with SHA-256, v1 (once each)"},
		{name: "third ACK, token learned with SHA-1, v0 (once each)"},
		{name: "MP_JOIN SYN steered by token (once each)"},
		{name: "established IPv4 flow, timestamps and DSS (repeated)", repeats: true},
		{name: "established MPTCP subflow, token learned, timestamps and DSS (repeated)", repeats: true},
	}
	for r := 0; r < runs; r++ {
		d, err := setup()
		if err != nil {
			return err
		}
		prog := d.Program()
		rep := func(p *ebpf.Program, pkt []byte) float64 {
			per, _, err := xdp.Time(p, pkt, repeat)
			if err != nil {
				log.Fatal(err)
			}
			return float64(per.Nanoseconds())
		}
		est4 := xdp.Packet{Src: client(1, false), Dst: vip4, Flags: 0x10, Payload: make([]byte, 20)}
		est6 := xdp.Packet{Src: client(1, true), Dst: vip6, Flags: 0x10, Payload: make([]byte, 20)}
		// Established: a SYN, then the ACK that moves the flow to the connection table.
		for _, p := range []xdp.Packet{est4, est6} {
			syn := p
			syn.Flags, syn.Payload = 0x02, nil
			xdp.Time(prog, syn.Frame(), 1)
			xdp.Time(prog, p.Frame(), 1)
		}
		rows[0].ns = append(rows[0].ns, rep(d.Baseline(), est4.Frame()))
		rows[1].ns = append(rows[1].ns, rep(prog, est4.Frame()))
		rows[2].ns = append(rows[2].ns, rep(prog, est6.Frame()))
		rows[3].ns = append(rows[3].ns, rep(prog, xdp.Packet{Src: client(1, false), Dst: netip.AddrPortFrom(vip4.Addr(), 22), Flags: 0x10}.Frame()))
		rows[4].ns = append(rows[4].ns, rep(prog, xdp.Packet{Src: client(2, false), Dst: vip4, Flags: 0x02, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, 0x12345678, 1)}.Frame()))
		rows[12].ns = append(rows[12].ns, rep(prog, established(d, false, true)))
		rows[13].ns = append(rows[13].ns, rep(prog, learnedSubflow(d)))

		once := func(p *ebpf.Program, pkts [][]byte) float64 {
			var total time.Duration
			for _, pkt := range pkts {
				per, _, err := xdp.Time(p, pkt, 1)
				if err != nil {
					log.Fatal(err)
				}
				total += per
			}
			return float64(total.Nanoseconds()) / float64(len(pkts))
		}
		var syns, acks1, acks0, joins, base [][]byte
		var tokens []uint32
		for i := 0; i < flows; i++ {
			c1, c0 := client(1000+i, false), client(500000+i, false)
			syns = append(syns, xdp.Packet{Src: c1, Dst: vip4, Flags: 0x02, Opts: synOpts()}.Frame())
			acks1 = append(acks1, xdp.Packet{Src: c1, Dst: vip4, Flags: 0x10, Opts: ackOpts(1, i)}.Frame())
			base = append(base, xdp.Packet{Src: c1, Dst: vip4, Flags: 0x02, Opts: synOpts()}.Frame())
			// v0 flows: SYN first (not timed), then the ACK
			d.Run(xdp.Packet{Src: c0, Dst: vip4, Flags: 0x02, Opts: mptcpopt.AppendCapable(nil, mptcpopt.Capable{Length: 12, Version: 0, Flags: 1, SenderKey: key})}.Frame())
			acks0 = append(acks0, xdp.Packet{Src: c0, Dst: vip4, Flags: 0x10, Opts: ackOpts(0, flows+i)}.Frame())
			var k [8]byte
			binary.BigEndian.PutUint64(k[:], uint64(i)*0x9e3779b97f4a7c15+1)
			tokens = append(tokens, mptcpopt.Token(k, 1))
		}
		rows[5].ns = append(rows[5].ns, once(d.Baseline(), base))
		// The same established packet, once per call: encapsulation grows the frame, so a
		// repeated run would see its own output.
		ests := make([][]byte, flows)
		for i := range ests {
			ests[i] = est4.Frame()
		}
		rows[6].ns = append(rows[6].ns, once(prog, ests))
		cfg := planeConfig
		cfg.Mode, cfg.Src4 = xdp.ModeIPIP, netip.MustParseAddr("10.200.0.1")
		d.SetConfig(cfg)
		rows[7].ns = append(rows[7].ns, once(prog, ests))
		d.SetConfig(planeConfig)
		rows[8].ns = append(rows[8].ns, once(prog, syns))
		rows[9].ns = append(rows[9].ns, once(prog, acks1))
		rows[10].ns = append(rows[10].ns, once(prog, acks0))
		for i, t := range tokens {
			joins = append(joins, xdp.Packet{Src: client(900000+i, false), Dst: vip4, Flags: 0x02, Opts: mptcpopt.AppendJoinSYN(nil, 1, false, t, 7)}.Frame())
		}
		rows[11].ns = append(rows[11].ns, once(prog, joins))
		c, err := d.Counters()
		if err != nil {
			log.Fatal(err)
		}
		if c[xdp.CounterTokenLearned] != uint64(2*flows+1) || c[xdp.CounterJoinSteered] != uint64(flows) {
			log.Fatalf("the benchmark's packets did not do what they should: learned %d, joins steered %d", c[xdp.CounterTokenLearned], c[xdp.CounterJoinSteered])
		}
		d.Close()
	}
	fmt.Fprintln(w, "| packet | ns/packet | vs baseline |")
	fmt.Fprintln(w, "|---|---:|---:|")
	for i, r := range rows {
		base := rows[0]
		if !r.repeats {
			base = rows[5]
		}
		m := median(r.ns)
		ratio := fmt.Sprintf("%.2fx", m/median(base.ns))
		if i == 0 || i == 5 {
			ratio = "1.00x"
		}
		fmt.Fprintf(w, "| %s | %.0f | %s |\n", r.name, m, ratio)
	}
	return nil
}

// established returns the frames of an established flow to vip (IPv4 or IPv6), with or without
// the options that a data packet of an MPTCP connection carries (timestamps and a DSS), after
// sending its SYN and first ACK through d so that the flow is in the connection table.
func established(d *xdp.Dataplane, v6, opts bool) []byte {
	vip := vip4
	if v6 {
		vip = vip6
	}
	p := xdp.Packet{Src: client(1, v6), Dst: vip, Flags: 0x02}
	if opts {
		p.Src = client(3, v6)
	}
	d.Run(p.Frame())
	p.Flags, p.Payload = 0x10, make([]byte, 20)
	if opts {
		p.Opts = dataOpts()
	}
	frame := p.Frame()
	d.Run(frame)
	return frame
}

// learnedSubflow returns a data packet (timestamps and DSS) of an MPTCP connection's first
// subflow whose token the balancer learned from its third ACK.
func learnedSubflow(d *xdp.Dataplane) []byte {
	p := xdp.Packet{Src: client(4, false), Dst: vip4, Flags: 0x02, Opts: synOpts()}
	d.Run(p.Frame())
	p.Flags, p.Opts = 0x10, ackOpts(1, 424242)
	d.Run(p.Frame())
	p.Opts, p.Payload = dataOpts(), make([]byte, 20)
	return p.Frame()
}

// dataOpts are the options of an MPTCP data packet: NOP, NOP, timestamps, and a DSS with a
// data ACK and a mapping (20 bytes).
func dataOpts() []byte {
	o := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	return append(o, 30, 20, 0x20, 0x05, 0, 0, 0, 9, 0, 0, 0, 7, 0, 0, 0, 1, 0, 20, 0, 0)
}

func spinRun(d time.Duration, kind string) error {
	plane, err := setup()
	if err != nil {
		return err
	}
	defer plane.Close()
	prog := plane.Program()
	var pkt []byte
	switch kind {
	case "est4":
		pkt = established(plane, false, false)
	case "est4opts":
		pkt = established(plane, false, true)
	case "est6":
		pkt = established(plane, true, false)
	case "baseline":
		prog, pkt = plane.Baseline(), established(plane, false, false)
	default:
		return fmt.Errorf("-packet %q: est4, est4opts, est6 or baseline", kind)
	}
	log.Printf("pid %d: %s under BPF_PROG_RUN for %v", os.Getpid(), kind, d)
	var total time.Duration
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		per, _, err := xdp.Time(prog, pkt, 1000000)
		if err != nil {
			return err
		}
		total += per
	}
	log.Printf("%.1f ns/packet (mean of %d runs of 1e6)", float64(total.Nanoseconds())/float64(n), n)
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func vethTable(w io.Writer, runs, frames int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, kit.KernelLinks("lbbench", 0), lab.Options{})
	if err != nil {
		return err
	}
	defer l.Close()
	d, err := setup()
	if err != nil {
		return err
	}
	defer d.Close()
	a, b := l.Host("a"), l.Host("b")
	la, err := a.NS.Netlink().LinkList()
	if err != nil {
		return err
	}
	lbIf := -1
	for _, lk := range la {
		if lk.Type() == "veth" {
			lbIf = lk.Attrs().Index
		}
	}
	lbb, err := b.NS.Netlink().LinkList()
	if err != nil {
		return err
	}
	for _, lk := range lbb {
		if lk.Type() == "veth" {
			idx := lk.Attrs().Index
			if err := b.NS.Do(func() error { return d.AttachSink(idx, xdp.AttachNative) }); err != nil {
				return fmt.Errorf("sink on the peer: %w", err)
			}
		}
	}
	if lbIf < 0 {
		return fmt.Errorf("no veth in host a")
	}
	est := xdp.Packet{Src: client(1, false), Dst: vip4, Flags: 0x02}
	d.Run(est.Frame()) // the SYN
	est.Flags, est.Payload = 0x10, make([]byte, 20)
	pkt := est.Frame()
	d.Run(pkt) // the flow is established: in the connection table
	var lbRate, baseRate, lbCPU, baseCPU []float64
	for r := 0; r < runs; r++ {
		for _, p := range []struct {
			prog     *ebpf.Program
			out, cpu *[]float64
		}{{d.Baseline(), &baseRate, &baseCPU}, {d.Program(), &lbRate, &lbCPU}} {
			before, _ := d.SinkCount()
			var el, cpu time.Duration
			err := a.NS.Do(func() error {
				// the injecting thread's CPU time: what the run cost, whatever else the
				// machine's cores were doing meanwhile
				t0, err := threadCPU()
				if err != nil {
					return err
				}
				el, err = xdp.RunLive(p.prog, pkt, lbIf, frames)
				if err != nil {
					return err
				}
				t1, err := threadCPU()
				cpu = t1 - t0
				return err
			})
			if err != nil {
				return err
			}
			after, _ := d.SinkCount()
			if got := after - before; got < uint64(frames)*9/10 {
				return fmt.Errorf("the sink received %d of %d frames", got, frames)
			}
			*p.out = append(*p.out, float64(frames)/el.Seconds())
			*p.cpu = append(*p.cpu, float64(frames)/cpu.Seconds())
		}
	}
	// Each run measures the baseline and then the balancer back to back: the ratio of the
	// pair is the comparison that holds on a machine whose load drifts between runs.
	var ratios, cpuRatios []float64
	for i := range lbRate {
		ratios = append(ratios, lbRate[i]/baseRate[i])
		cpuRatios = append(cpuRatios, lbCPU[i]/baseCPU[i])
	}
	fmt.Fprintln(w, "| program | Mpps (wall) | ratio (median of the runs' ratios, min-max) | Mpps per CPU-second | ratio (min-max) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	fmt.Fprintf(w, "| baseline: plain XDP_TX | %.2f | 1.00x | %.2f | 1.00x |\n", median(baseRate)/1e6, median(baseCPU)/1e6)
	fmt.Fprintf(w, "| braid lb, established flow | %.2f | %.2fx (%.2f-%.2f) | %.2f | %.2fx (%.2f-%.2f) |\n",
		median(lbRate)/1e6, median(ratios), slices.Min(ratios), slices.Max(ratios),
		median(lbCPU)/1e6, median(cpuRatios), slices.Min(cpuRatios), slices.Max(cpuRatios))
	return nil
}

// threadCPU is the calling thread's CPU time (it must stay on one OS thread: NS.Do locks it).
func threadCPU() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, fmt.Errorf("thread CPU time: %w", err)
	}
	return time.Duration(ts.Nano()), nil
}
