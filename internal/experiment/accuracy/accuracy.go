package accuracy

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"text/tabwriter"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/units"
)

// The emulator's accuracy checks, as TESTING.md states them. Each Check builds a two-host lab,
// measures one property and compares it with the configuration. Tests assert Row.OK; `braid lab
// run accuracy` and the benchmark print the rows.

// Row is the outcome of one accuracy check.
type Row struct {
	Check      string
	Configured string
	Measured   string
	Error      string // measured minus expected, absolute or relative
	Bound      string
	OK         bool
	Detail     string
	Want       float64 // the configured value, in Unit
	Value      float64 // the measured value, in Unit
	Unit       string
}

// Check is one accuracy measurement.
type Check struct {
	Name string
	Run  func(ctx context.Context, o kit.Options) (Row, error)
}

// pairServer is the address of the traffic server on host b of topo.Pair.
const pairServer = "10.99.0.2:5201"

// withPair brings up a pair lab shaped s with a traffic server on b and runs fn.
func withPair(ctx context.Context, o kit.Options, s topo.Shape, fn func(l *lab.Lab) error) error {
	l, err := lab.Up(ctx, topo.Pair(s), lab.Options{Logger: o.Logger, OwnSignals: true, Seed: o.Seed})
	if err != nil {
		return err
	}
	defer l.Close()
	stop, err := kit.StartServer(ctx, l.Host("b"), pairServer)
	if err != nil {
		return err
	}
	defer stop()
	return fn(l)
}

// RTTCheck measures the round trip over a link with the given one-way delay. Bound: 1 ms + 5 %
// of the configured round trip.
func RTTCheck(delay time.Duration) Check {
	return Check{Name: fmt.Sprintf("rtt %v", delay), Run: func(ctx context.Context, o kit.Options) (Row, error) {
		want := 2 * delay
		row := Row{Check: "round trip, one-way delay " + delay.String(), Configured: want.String()}
		err := withPair(ctx, o, topo.Shape{Delay: delay}, func(l *lab.Lab) error {
			count := 50
			if o.Quick {
				count = 15
			}
			rr, err := traffic.RR(ctx, l.Host("a").Dial, pairServer, traffic.RROptions{Count: count})
			if err != nil {
				return err
			}
			diff := rr.Median - want
			bound := time.Millisecond + want/20
			row.Measured = fmt.Sprintf("%.2f ms (median of %d)", float64(rr.Median)/1e6, count)
			row.Error = fmt.Sprintf("%+.2f ms", float64(diff)/1e6)
			row.Bound = fmt.Sprintf("±%.2f ms", float64(bound)/1e6)
			row.OK = diff.Abs() <= bound
			row.Want, row.Value, row.Unit = float64(want)/1e6, float64(rr.Median)/1e6, "ms"
			row.Detail = fmt.Sprintf("min %v max %v", rr.Min, rr.Max)
			return nil
		})
		return row, err
	}}
}

// TCPCeiling is the share of a link's rate, counted in IP bytes, that TCP payload reaches at
// most over packets of mtu bytes: a full segment's payload (the IPv4 and TCP headers and the
// timestamp option taken off) over the packet; 1448/1500 = 0.965 for 1500 bytes.
func TCPCeiling(mtu int) float64 {
	const ipv4, tcp, timestamps = 20, 20, 12
	return float64(mtu-ipv4-tcp-timestamps) / float64(mtu)
}

// goodputBound is the relative error of a steady TCP goodput (bit/s) on a link of the given
// rate and MTU against the TCP ceiling, and whether it is within 5 % of the ceiling: a shaper
// that runs fast fails as surely as one that runs slow.
func goodputBound(steady float64, rate uint64, mtu int) (rel float64, ok bool) {
	rel = steady/(float64(rate)*TCPCeiling(mtu)) - 1
	return rel, math.Abs(rel) <= 0.05
}

// GoodputCheck measures steady TCP goodput over a link of the given rate (and 5 ms delay).
// Bound: within 5 % of the TCP ceiling of the configured rate (TCPCeiling), not of the rate.
func GoodputCheck(rate uint64) Check {
	return Check{Name: "goodput " + units.FormatRate(rate), Run: func(ctx context.Context, o kit.Options) (Row, error) {
		row := Row{Check: "TCP goodput at " + units.FormatRate(rate) + ", against its ceiling"}
		err := withPair(ctx, o, topo.Shape{Rate: rate, Delay: 5 * time.Millisecond}, func(l *lab.Lab) error {
			dur := 10 * time.Second
			if o.Quick {
				dur = 6 * time.Second // five steady samples: one slow second does not decide
			}
			res, err := traffic.Bulk(ctx, l.Host("a").Dial, pairServer, traffic.BulkOptions{Duration: dur})
			if err != nil {
				return err
			}
			lk := l.Links()[0]
			mtu := lk.Spec.MTU
			ceiling := float64(rate) * TCPCeiling(mtu)
			rel, ok := goodputBound(res.Steady, rate, mtu)
			row.Configured = fmt.Sprintf("%s: ceiling %.3f Mbit/s (%.3f at MTU %d)", units.FormatRate(rate), ceiling/1e6, TCPCeiling(mtu), mtu)
			row.Measured = fmt.Sprintf("%.2f Mbit/s", res.Steady/1e6)
			row.Error = fmt.Sprintf("%+.1f %% of the ceiling", 100*rel)
			row.Bound = "±5 % of the ceiling"
			row.OK = ok
			row.Want, row.Value, row.Unit = ceiling/1e6, res.Steady/1e6, "Mbit/s"
			mode := "MTU packets"
			if lk.Offload {
				mode = "TSO super-packets"
			}
			row.Detail = fmt.Sprintf("%s, %d retransmits, whole-run %.2f Mbit/s", mode, res.Retransmits, res.Goodput/1e6)
			return nil
		})
		return row, err
	}}
}

// LossCheck measures UDP loss over a link with the given random loss (percent). Bound: within
// 10 % of the configured loss, relative.
func LossCheck(loss float64) Check {
	return Check{Name: fmt.Sprintf("loss %g%%", loss), Run: func(ctx context.Context, o kit.Options) (Row, error) {
		row := Row{Check: fmt.Sprintf("random loss %g %%", loss), Configured: fmt.Sprintf("%g %%", loss)}
		err := withPair(ctx, o, topo.Shape{Loss: loss, Delay: time.Millisecond}, func(l *lab.Lab) error {
			// Enough datagrams that the binomial spread is well inside the bound, even in a quick
			// run: at 1 %, 100 000 datagrams give a standard deviation of 0.03 points against a
			// bound of 0.1.
			dur := 4 * time.Second
			res, err := traffic.UDP(ctx, l.Host("a").Dial, pairServer, traffic.UDPOptions{Rate: 40e6, Size: 172, Duration: dur})
			if err != nil {
				return err
			}
			rel := res.LossPercent/loss - 1
			row.Measured = fmt.Sprintf("%.3f %% of %d", res.LossPercent, res.Sent)
			row.Error = fmt.Sprintf("%+.1f %% rel.", 100*rel)
			row.Bound = "±10 % rel."
			row.OK = math.Abs(rel) <= 0.10
			row.Want, row.Value, row.Unit = loss, res.LossPercent, "%"
			st := l.Links()[0].Stats(0)
			row.Detail = fmt.Sprintf("emulator dropped %d at random", st.DropLoss)
			return nil
		})
		return row, err
	}}
}

// queueRate is the link rate of the queue check: slow enough that the queue hardly drains while
// a burst arrives (a 1500-byte packet every 2.4 ms).
const queueRate = 5e6

// queueHeld is how many packets a drop-tail queue held, measured from outside: a burst sent
// into it far faster than the link drains gets through as what the queue held plus what left
// the queue while the burst arrived (burst seconds at rate bit/s, in packets of mtu bytes).
func queueHeld(received int, burst time.Duration, rate uint64, mtu int) float64 {
	return float64(received) - burst.Seconds()*float64(rate)/8/float64(mtu)
}

// queueBound reports whether a measured queue (in packets) matches the configured one within
// one packet and 5 %: smaller is as wrong as larger.
func queueBound(measured, configured float64) bool {
	return math.Abs(measured-configured) <= 1+0.05*configured
}

// QueueCheck measures a link's drop-tail queue bound, pkts packets (or bytes, when bytes > 0),
// from outside the emulator: a burst of three bounds' worth of MTU-sized UDP datagrams sent at
// once into a 5 Mbit/s link overflows the queue, and the receiver counts what came through
// (queueHeld). The emulator's own counters are shown beside, as a detail.
func QueueCheck(pkts, bytes int) Check {
	bound := fmt.Sprintf("%d packets", pkts)
	if bytes > 0 {
		bound = fmt.Sprintf("%d bytes", bytes)
	}
	return Check{Name: "queue " + bound, Run: func(ctx context.Context, o kit.Options) (Row, error) {
		row := Row{Check: "drop-tail queue bound", Configured: bound, Bound: "±(1 packet + 5 %), seen by the receiver"}
		shape := topo.Shape{Rate: queueRate, Delay: 20 * time.Millisecond, QueuePackets: pkts, QueueBytes: bytes}
		err := withPair(ctx, o, shape, func(l *lab.Lab) error {
			mtu := l.Links()[0].Spec.MTU
			want := float64(pkts)
			if bytes > 0 {
				want = float64(bytes / mtu)
			}
			received, sent, burst, err := udpBurst(ctx, l, 3*int(want), mtu)
			if err != nil {
				return err
			}
			held := queueHeld(received, burst, queueRate, mtu)
			st := l.Links()[0].Stats(0)
			row.OK = queueBound(held, want) && sent > received
			if bytes > 0 {
				row.Measured = fmt.Sprintf("%.0f bytes (%.1f packets of %d)", held*float64(mtu), held, mtu)
				row.Want, row.Value, row.Unit = float64(bytes), held*float64(mtu), "bytes"
			} else {
				row.Measured = fmt.Sprintf("%.1f packets", held)
				row.Want, row.Value, row.Unit = want, held, "packets"
			}
			row.Error = fmt.Sprintf("%d of %d datagrams arrived, burst %.2f ms", received, sent, float64(burst)/1e6)
			row.Detail = fmt.Sprintf("the emulator's counters: max backlog %d packets, %d bytes; %d queue drops", st.MaxBacklogPackets, st.MaxBacklogBytes, st.DropQueue)
			return nil
		})
		return row, err
	}}
}

// queuePort is where the queue check's receiver listens on b.
const queuePort = 5301

// udpBurst sends n datagrams of mtu bytes on the wire from a to b as fast as a socket takes
// them and counts those b receives until the link has been quiet for a second.
func udpBurst(ctx context.Context, l *lab.Lab, n, mtu int) (received, sent int, burst time.Duration, err error) {
	addr := netip.AddrPortFrom(netip.MustParseAddr("10.99.0.2"), queuePort).String()
	pc, err := l.Host("b").ListenPacket("udp", addr)
	if err != nil {
		return 0, 0, 0, err
	}
	defer pc.Close()
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 65536)
		count := 0
		for {
			pc.SetReadDeadline(time.Now().Add(time.Second))
			if _, _, err := pc.ReadFrom(buf); err != nil {
				got <- count
				return
			}
			count++
		}
	}()
	c, err := l.Host("a").Dial(ctx, "udp", addr)
	if err != nil {
		return 0, 0, 0, err
	}
	defer c.Close()
	payload := make([]byte, mtu-20-8) // IPv4 and UDP headers: one MTU on the wire
	start := time.Now()
	for range n {
		if _, err := c.Write(payload); err == nil {
			sent++
		}
	}
	burst = time.Since(start)
	return <-got, sent, burst, nil
}

// CutCheck runs TCP over a 20 Mbit/s link, cuts it for two seconds and restores it: the samples
// while cut must carry nothing, and the same connection must carry traffic again afterwards.
func CutCheck() Check {
	return Check{Name: "cut and restore", Run: func(ctx context.Context, o kit.Options) (Row, error) {
		row := Row{Check: "cut and restore", Configured: "cut 2 s..4 s of 7 s", Bound: "0 while cut, > 50 % after"}
		err := withPair(ctx, o, topo.Shape{Rate: 20e6, Delay: 5 * time.Millisecond}, func(l *lab.Lab) error {
			lk := l.Links()[0]
			timer1 := time.AfterFunc(2*time.Second, lk.Cut)
			timer2 := time.AfterFunc(4*time.Second, lk.Restore)
			defer timer1.Stop()
			defer timer2.Stop()
			res, err := traffic.Bulk(ctx, l.Host("a").Dial, pairServer, traffic.BulkOptions{Duration: 7 * time.Second, Interval: 500 * time.Millisecond})
			if err != nil {
				return err
			}
			var during, after float64
			var nd, na int
			for _, s := range res.Samples {
				switch {
				case s.At > 2500*time.Millisecond && s.At <= 4*time.Second:
					during += s.BitsPerSecond
					nd++
				case s.At > 5500*time.Millisecond:
					after += s.BitsPerSecond
					na++
				}
			}
			if nd > 0 {
				during /= float64(nd)
			}
			if na > 0 {
				after /= float64(na)
			}
			st := lk.Stats(0)
			row.Measured = fmt.Sprintf("%.2f Mbit/s while cut, %.1f Mbit/s after", during/1e6, after/1e6)
			row.Error = fmt.Sprintf("%d dropped while cut", st.DropDown)
			row.OK = nd > 0 && na > 0 && during == 0 && after > 0.5*20e6 && st.DropDown > 0
			row.Want, row.Value, row.Unit = 20, after/1e6, "Mbit/s after restore"
			return nil
		})
		return row, err
	}}
}

// AccuracyChecks are the emulator checks of TESTING.md.
func AccuracyChecks() []Check {
	return []Check{
		RTTCheck(10 * time.Millisecond), RTTCheck(50 * time.Millisecond), RTTCheck(150 * time.Millisecond),
		GoodputCheck(4e6), GoodputCheck(50e6), GoodputCheck(1000e6),
		LossCheck(1), LossCheck(5),
		QueueCheck(50, 0), QueueCheck(0, 60000),
		CutCheck(),
		TraceCheck(),
	}
}

func init() {
	kit.Register(kit.Scenario{Name: "accuracy", Summary: "the link emulator's accuracy: RTT, goodput, loss, queue bound, cut, trace replay", Run: runAccuracy})
}

func runAccuracy(ctx context.Context, w io.Writer, o kit.Options) error {
	var rows []Row
	for _, c := range AccuracyChecks() {
		r, err := c.Run(ctx, o)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		rows = append(rows, r)
	}
	PrintRows(w, rows)
	for _, r := range rows {
		if !r.OK {
			return fmt.Errorf("accuracy: %s outside its bound", r.Check)
		}
	}
	return nil
}

// PrintRows prints accuracy rows as a table, naming the emulator.
func PrintRows(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "check\tconfigured\tmeasured\terror\tbound\tok\tdetail")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Check, r.Configured, r.Measured, r.Error, r.Bound, kit.YesNo(r.OK), r.Detail)
	}
	tw.Flush()
	fmt.Fprintf(w, "links emulated by: %s\n", lab.EmulatorName)
}
