package rbpm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"braid/internal/config"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/info"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
	"braid/internal/traffic"
)

func init() {
	kit.Register(kit.Scenario{Name: "rbpm", Summary: "the RBPM paper's two scenarios (4 heterogeneous paths, 100-packet queues, 200 KB receive buffer): kernel MPTCP with and without braid pm --policy rbpm, braid tunnel with each scheduler; throughput per path over time, PNG figures", Run: runRBPM})
}

// RBPMScenario is one of the RBPM paper's path sets: from the sender's side, links of the given
// rate and one-way delay with drop-tail queues of 100 packets (its Figure 1; the links behind
// the routers are 100 Mbit/s, 1 ns, and are left out).
type RBPMScenario struct {
	Name          string
	Paths         []topo.Shape
	Slow          int     // the path RBPM takes out in the paper
	PaperRBPM     float64 // the paper's mean goodput with RBPM, bytes/s
	PaperOriginal float64 // the paper's original MPTCP (Linux MPTCP v0.89), bytes/s
	// Buffer is the receiver's buffer in bytes (tcp_rmem's maximum; the tunnel's reorder
	// buffer bound); 0 means RBPMBuffer, the paper's.
	Buffer int
}

// buffer is sc's receive buffer in bytes.
func (sc RBPMScenario) buffer() int {
	if sc.Buffer > 0 {
		return sc.Buffer
	}
	return RBPMBuffer
}

// RBPMShallowS1 is scenario 1 where the slow path, not the receive buffer, limits upstream
// MPTCP (scheduling.md section 4): a 2 MB receive buffer and shallow queues of one
// bandwidth-delay product, at least 15 KB. Not one of the paper's; it shows what the policy
// gains when the buffer does not bind with the fast paths alone.
func RBPMShallowS1() RBPMScenario {
	sc := RBPMScenarios()[0]
	sc.Name, sc.Buffer, sc.PaperRBPM, sc.PaperOriginal = "S1'", 2_000_000, 0, 0
	sc.Paths = append([]topo.Shape(nil), sc.Paths...)
	for i, p := range sc.Paths {
		bdp := int(p.Rate / 8 * uint64(2*p.Delay) / uint64(time.Second))
		sc.Paths[i] = topo.Shape{Rate: p.Rate, Delay: p.Delay, QueueBytes: max(bdp, 15000)}
	}
	return sc
}

func rbpmShape(rate uint64, delay time.Duration) topo.Shape {
	return topo.Shape{Rate: rate, Delay: delay, QueuePackets: 100}
}

// RBPMScenarios returns the paper's scenarios 1 (its Figures 2 and 3) and 2 (Figures 4 and 5).
func RBPMScenarios() []RBPMScenario {
	ms := time.Millisecond
	return []RBPMScenario{
		{Name: "S1", Paths: []topo.Shape{rbpmShape(5e6, 10*ms), rbpmShape(5e6, 10*ms), rbpmShape(5e6, 10*ms), rbpmShape(1e6, 100*ms)},
			Slow: 3, PaperRBPM: 1_114_986, PaperOriginal: 275_563},
		{Name: "S2", Paths: []topo.Shape{rbpmShape(1e6, 100*ms), rbpmShape(8e6, 50*ms), rbpmShape(3e6, 30*ms), rbpmShape(2e6, 10*ms)},
			Slow: 0, PaperRBPM: 898_705, PaperOriginal: 264_422},
	}
}

// RBPMBuffer is the receiver's buffer: the paper's "200K", as net.ipv4.tcp_rmem's maximum. Linux
// 6.x advertises about half of it (truesize accounting), Linux 3.x about three quarters: the
// same figure is a smaller window here than in the paper.
const RBPMBuffer = 204800

// RBPMRow is one configuration measured on one scenario.
type RBPMRow struct {
	Scenario string
	Config   string      // e.g. "kernel MPTCP, default scheduler"
	Goodput  float64     // bytes/s received in order by the application, over the run
	PerPath  [][]float64 // per path, bytes/s acknowledged in each second
	// DemotedAt is, per path, when the policy first had the upload connection's subflow on it
	// as backup (from the start of the transfer, sampled every second); -1 if never.
	DemotedAt []time.Duration
	Note      string // what the policy did, or why the row is missing
}

// RBPMKernelConfigs name the kernel rows.
const (
	RBPMKernelDefault = "kernel MPTCP, default scheduler"
	RBPMKernelPolicy  = "kernel MPTCP + braid pm rbpm"
)

func runRBPM(ctx context.Context, w io.Writer, o kit.Options) error {
	dur := 100 * time.Second // the paper's runs
	if o.Quick {
		dur = 8 * time.Second
	}
	fmt.Fprintf(w, "RBPM reproduction: user-space TUN link emulator (rate, delay, 100-packet drop-tail queue per link), reno, receiver tcp_rmem max %d B, %v per run\n", RBPMBuffer, dur)
	fmt.Fprintln(w, "kernel rows: one subflow per path (braid pm on the sender, userspace PM); the default row runs the fullmesh policy (same subflows, no demotion)")
	fmt.Fprintf(w, "tunnel rows: one TCP flow through braid tunnel over the same links, the inner TCP receiver and the reorder buffer both bounded to %d B, path capacities not configured; wrr: every weight 1 (MPT's default), wrr-rates: weights in proportion to the rates\n", RBPMBuffer)
	var rows []RBPMRow
	for _, sc := range RBPMScenarios() {
		for _, withPolicy := range []bool{false, true} {
			row, err := RBPMKernel(ctx, sc, withPolicy, dur, o)
			if err != nil {
				return fmt.Errorf("rbpm %s: %w", sc.Name, err)
			}
			rows = append(rows, row)
		}
		tr, err := rbpmTunnelRows(ctx, sc, dur, o)
		if err != nil {
			return fmt.Errorf("rbpm %s, %w", sc.Name, err)
		}
		rows = append(rows, tr...)
	}
	err := WriteRBPMReport(w, o, rows)
	c := rbpmClaims(rows)
	c.Print(w)
	return errors.Join(err, c.Err())
}

// rbpmClaims are the paper's claims on the kernel rows of each of its scenarios: the policy
// takes the slow path out (sets its subflow to backup), and goodput with it is not below
// goodput without it (the paper: 4.0 and 3.4 times).
func rbpmClaims(rows []RBPMRow) *kit.Claims {
	c := &kit.Claims{}
	for _, sc := range RBPMScenarios() {
		var base, pol *RBPMRow
		for i := range rows {
			if r := &rows[i]; r.Scenario == sc.Name && r.Config == RBPMKernelDefault {
				base = r
			} else if r.Scenario == sc.Name && r.Config == RBPMKernelPolicy {
				pol = r
			}
		}
		if base == nil || pol == nil {
			continue
		}
		demoted := sc.Slow < len(pol.DemotedAt) && pol.DemotedAt[sc.Slow] >= 0
		c.Add(fmt.Sprintf("%s: braid pm rbpm demotes the slow path %d", sc.Name, sc.Slow+1), demoted, "%s", pol.Note)
		c.AtLeast(sc.Name+": goodput with braid pm rbpm over without", pol.Goodput/max(base.Goodput, 1), 1.0, "%.2f")
	}
	return c
}

// WriteRBPMReport prints the rows beside the paper's figures and draws, per scenario and
// configuration, the throughput of each path over time (rbpm-<scenario>-<n>.png in o.Out).
// It takes every row, the kernel's and the tunnel's alike.
func WriteRBPMReport(w io.Writer, o kit.Options, rows []RBPMRow) error {
	scs := RBPMScenarios()
	fmt.Fprintf(w, "\n%-4s %-36s %14s %14s %8s  %s\n", "", "configuration", "goodput (B/s)", "paper (B/s)", "ratio", "note")
	for _, sc := range scs {
		fmt.Fprintf(w, "%-4s %-36s %14s %14.0f %8s\n", sc.Name, "paper: original MPTCP (v0.89)", "", sc.PaperOriginal, "")
		fmt.Fprintf(w, "%-4s %-36s %14s %14.0f %8s\n", sc.Name, "paper: MPTCP with RBPM", "", sc.PaperRBPM, "")
		var base, wrr float64
		for _, r := range rows {
			if r.Scenario != sc.Name {
				continue
			}
			switch r.Config {
			case RBPMKernelDefault:
				base = r.Goodput
			case RBPMTunnelConfig("wrr"):
				wrr = r.Goodput
			}
			ratio := ""
			switch {
			case r.Config == RBPMKernelPolicy && base > 0:
				ratio = fmt.Sprintf("%.2fx", r.Goodput/base)
			case strings.HasPrefix(r.Config, RBPMTunnelConfig("")) && r.Config != RBPMTunnelConfig("wrr") && wrr > 0:
				ratio = fmt.Sprintf("%.2fx", r.Goodput/wrr)
			}
			fmt.Fprintf(w, "%-4s %-36s %14.0f %14.0f %8s  %s\n", sc.Name, r.Config, r.Goodput, sc.PaperRBPM, ratio, r.Note)
		}
	}
	fmt.Fprintln(w, "ratio: the kernel rbpm policy's goodput over the kernel default's; a tunnel scheduler's over the tunnel's wrr; paper column: the paper's RBPM figure")
	var errs []error
	n := 0
	for _, r := range rows {
		if len(r.PerPath) == 0 {
			continue
		}
		n++
		name := filepath.Join(o.Out, fmt.Sprintf("rbpm-%s-%d.png", r.Scenario, n))
		if err := writeRBPMChart(name, r); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(w, "figure: %s (%s, %s)\n", name, r.Scenario, r.Config)
	}
	return errors.Join(errs...)
}

// writeRBPMChart draws what each path carried per second in run r (single runs: no error bars).
func writeRBPMChart(name string, r RBPMRow) error {
	c := kit.Chart{Title: fmt.Sprintf("%s: %s", r.Scenario, r.Config), XLabel: "time (s)", YLabel: "throughput per path (kB/s)"}
	for i, pts := range r.PerPath {
		s := kit.Series{Name: fmt.Sprintf("path %d", i+1), Color: kit.Palette[i%len(kit.Palette)]}
		for k, v := range pts {
			s.X, s.Y = append(s.X, float64(k+1)), append(s.Y, v/1e3)
		}
		c.Series = append(c.Series, s)
	}
	return c.Save(name)
}

// RBPMKernel measures kernel MPTCP on scenario sc for dur: a bulk upload from host a to host b
// over one subflow per path (braid pm on a, userspace PM, fullmesh subflows), with the rbpm
// policy or without (fullmesh: the kernel's default scheduler over all subflows). b's receive
// buffer is sc's (RBPMBuffer for the paper's); both hosts use reno.
func RBPMKernel(ctx context.Context, sc RBPMScenario, withPolicy bool, dur time.Duration, o kit.Options) (RBPMRow, error) {
	row := RBPMRow{Scenario: sc.Name, Config: RBPMKernelDefault}
	var pol core.Policy = core.Fullmesh{}
	var rb *core.RBPM
	if withPolicy {
		rb = core.NewRBPM(time.Second)
		pol, row.Config = rb, RBPMKernelPolicy
	}
	l, err := rbpmLab(ctx, "rbpm", sc, o)
	if err != nil {
		return row, err
	}
	defer l.Close()
	a, b := l.Host("a"), l.Host("b")
	if err := b.NS.Sysctl("ipv4/tcp_rmem", fmt.Sprintf("4096 131072 %d", sc.buffer())); err != nil {
		return row, err
	}
	// The receiver's in-kernel PM accepts 2 joins by default; the scenarios need 3.
	if err := roles.SetMPTCPLimits(b, 8); err != nil {
		return row, err
	}
	var ups []core.Uplink
	for i := range sc.Paths {
		u, err := roles.HostUplink(l, a, rbpmAddr(i, 1))
		if err != nil {
			return row, err
		}
		ups = append(ups, u)
	}
	// The rbpm policy's default timers (as braid pm --policy rbpm runs), in both rows, so that
	// they differ in the policy only: a subflow over a 1 Mbit/s path behind a 100-packet queue
	// waits up to 1.4 s for an ack, which fullmesh's 1 s timeouts would take for a dead one.
	timers := config.PMPolicyDefaults("rbpm")
	var d *pm.Daemon
	if err := a.NS.Do(func() (err error) {
		d, err = pm.New(pm.Options{Uplinks: ups, Policy: pol, Poll: timers.Poll,
			Core: core.Config{DeadAfter: timers.DeadAfter, JoinTimeout: timers.JoinTimeout}})
		return err
	}); err != nil {
		return row, err
	}
	pctx, pcancel := context.WithCancel(ctx)
	pmDone := make(chan error, 1)
	go func() { pmDone <- d.Run(pctx) }()
	defer func() {
		pcancel()
		<-pmDone
		a.NS.Do(d.Close)
	}()
	ln, err := roles.MPTCPListen(b, "0.0.0.0:5201")
	if err != nil {
		return row, err
	}
	srv := traffic.NewServer(ln, nil)
	go srv.Serve(ctx)
	defer srv.Close()
	var diag *info.Diag
	if err := a.NS.Do(func() (err error) { diag, err = info.OpenDiag(info.Options{}); return err }); err != nil {
		return row, err
	}
	defer diag.Close()

	// Per-path bytes acknowledged, sampled every second while the transfer runs.
	row.initSamples(len(sc.Paths))
	start := time.Now()
	last := make([]uint64, len(sc.Paths))
	stopSampling := everySecond(ctx, func() {
		conns, err := diag.Dump()
		if err != nil {
			return
		}
		// The upload's connection is the one that has carried the most; the client's other
		// connection (the traffic tool's control channel) is idle.
		cur := make([]uint64, len(sc.Paths))
		var data uint32
		var most uint64
		for _, c := range conns {
			if c.Remote.Port() != 5201 {
				continue
			}
			if _, acked, _ := c.SubflowBytes(); acked >= most {
				data, most = c.Info.Token, acked
			}
			for _, s := range c.Subflows {
				if i := rbpmPathOf(s.Local.Addr()); i >= 0 && i < len(cur) {
					cur[i] += s.TCP.BytesAcked
				}
			}
		}
		for i := range cur {
			row.PerPath[i] = append(row.PerPath[i], float64(cur[i]-min(last[i], cur[i])))
		}
		last = cur
		if rb == nil {
			return
		}
		if st := d.Status().RBPM; st != nil {
			for _, c := range st.Connections {
				if c.Token != data {
					continue
				}
				for _, s := range c.Subflows {
					ap, err := netip.ParseAddrPort(s.Local)
					if i := rbpmPathOf(ap.Addr()); err == nil && !s.Active && i >= 0 && i < len(cur) && row.DemotedAt[i] < 0 {
						row.DemotedAt[i] = time.Since(start)
					}
				}
			}
		}
	})
	// Dial the address of the fastest path, so that the initial subflow is not the slow one.
	fast := 0
	for i, p := range sc.Paths {
		if p.Rate > sc.Paths[fast].Rate {
			fast = i
		}
	}
	res, err := traffic.Bulk(ctx, roles.MPTCPDial(a, true), netip.AddrPortFrom(rbpmAddr(fast, 2), 5201).String(),
		traffic.BulkOptions{Duration: dur, Interval: time.Second})
	stopSampling()
	if err != nil {
		return row, err
	}
	row.Goodput = res.Goodput / 8
	if rb != nil {
		var notes []string
		if st := d.Status().RBPM; st != nil { // under the daemon's lock
			notes = append(notes, fmt.Sprintf("%d demotions, %d restores", st.Decisions.Demotions, st.Decisions.Restores))
		}
		for i, at := range row.DemotedAt {
			if at >= 0 {
				notes = append(notes, fmt.Sprintf("path %d backup from %.0f s", i+1, at.Seconds()))
			}
		}
		row.Note = strings.Join(notes, "; ")
	}
	return row, nil
}

// initSamples makes room for the per-path samples of n paths, none demoted yet.
func (r *RBPMRow) initSamples(n int) {
	r.PerPath = make([][]float64, n)
	r.DemotedAt = make([]time.Duration, n)
	for i := range r.DemotedAt {
		r.DemotedAt[i] = -1
	}
}

// everySecond calls f every second until stop is called; stop returns once f has returned.
func everySecond(ctx context.Context, f func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			f()
		}
	}()
	return func() { cancel(); <-done }
}

// rbpmLab brings up sc's links between hosts a and b, both with reno (the paper's).
func rbpmLab(ctx context.Context, name string, sc RBPMScenario, o kit.Options) (*lab.Lab, error) {
	l, err := lab.Up(ctx, kit.ParallelLinks(name, sc.Paths...), lab.Options{Logger: o.Logger, OwnSignals: true, Seed: o.Seed})
	if err != nil {
		return nil, err
	}
	for _, h := range l.Hosts() {
		if err := h.NS.Sysctl("ipv4/tcp_congestion_control", "reno"); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// rbpmAddr is host side's (1 = a, 2 = b) IPv4 address on ParallelLinks' link i.
func rbpmAddr(i, side int) netip.Addr { return netip.AddrFrom4([4]byte{10, 9, byte(i), byte(side)}) }

// rbpmPathOf is the link index of a ParallelLinks IPv4 address, or -1.
func rbpmPathOf(a netip.Addr) int {
	a = a.Unmap()
	if !a.Is4() {
		return -1
	}
	b := a.As4()
	if b[0] != 10 || b[1] != 9 {
		return -1
	}
	return int(b[2])
}
