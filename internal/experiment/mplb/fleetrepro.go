package mplb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"text/tabwriter"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lb/xdp"
	"braid/internal/mptcp/info"
)

// errNoBird: the fleet rows need the routing daemon.
var errNoBird = errors.New("bird (Debian package bird2) is not installed: scripts/deps.sh installs it")

// mplbFleetLab brings up the paper's client and two backends behind a router and two braid lb
// instances (this program, as "braid lb") that announce the VIP to it over BGP; the router
// spreads the VIP by ECMP. tokenMode runs the instances without the stateless mode (each
// steers joins by the tokens it learned itself); otherwise the backends announce their own
// ports and the client opens its second subflow toward them from its second address.
func mplbFleetLab(ctx context.Context, o kit.Options, tokenMode bool) (l *lab.Lab, fleet *Fleet, cleanup func(), err error) {
	bird, err := exec.LookPath("bird")
	if err != nil {
		return nil, nil, nil, errNoBird
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	l, err = lab.Up(ctx, MPLBFleetTopology(2, 2, mplbRate), lab.Options{Logger: o.Logger, Seed: o.Seed})
	if err != nil {
		return nil, nil, nil, err
	}
	var closers []func()
	cleanup = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
		l.Close()
	}
	fail := func(e error) (*lab.Lab, *Fleet, func(), error) {
		cleanup()
		return nil, nil, nil, e
	}
	if err := MPLBPrepare(l, 2); err != nil {
		return fail(err)
	}
	if tokenMode {
		err = MPLBEndpoint(ctx, l)
	} else if err = MPLBStateless(ctx, l, 2); err == nil {
		err = MPLBFleetClientEndpoint(ctx, l)
	}
	if err != nil {
		return fail(err)
	}
	decap, err := xdp.Load(xdp.Options{Conns: 1024, Tokens: 1024})
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() { decap.Close() })
	if err := MPLBDecap(l, 2, decap); err != nil {
		return fail(err)
	}
	srv, err := StartMPLBServers(l, 2)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, srv.Close)
	dir, err := os.MkdirTemp("", "braid-mplb-fleet-")
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() { os.RemoveAll(dir) })
	fleet, err = StartFleet(l, dir, bird, []string{self}, nil, 2, 2)
	if err != nil {
		return fail(err)
	}
	fleet.TokenMode = tokenMode
	for i := range 2 {
		if _, err := fleet.StartInstance(i, time.Second); err != nil {
			return fail(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := fleet.WaitNextHops(wctx, 0, 1); err != nil {
		return fail(err)
	}
	return l, fleet, cleanup, nil
}

// mplbFleetMeasure downloads every size runs times through a fleet of two instances in the
// stateless mode.
func mplbFleetMeasure(ctx context.Context, o kit.Options, sizes []int64, runs int) ([]mplbPoint, error) {
	l, _, cleanup, err := mplbFleetLab(ctx, o, false)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return measureSizes(sizes, runs, func(size int64) (time.Duration, bool, error) {
		return mplbDownload(ctx, l, size, func(c *net.TCPConn) bool { return fleetEstablished(c) == 2 })
	})
}

// mplbFleetTokenJoins measures the design braid does not use for a fleet: token mode with
// tokens not shared between instances. n connections each open a join from the client's
// second address; it returns how many joins reached their backend within 3 s and the joins
// the instances dropped for a token they never learned.
func mplbFleetTokenJoins(ctx context.Context, o kit.Options, n int) (joined int, dropped uint64, err error) {
	l, fleet, cleanup, err := mplbFleetLab(ctx, o, true)
	if err != nil {
		return 0, 0, err
	}
	defer cleanup()
	conns := make([]*net.TCPConn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			c, err := MPLBDial(ctx, l)
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
			if _, err := MPLBAsk(c); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	time.Sleep(3 * time.Second) // the join SYN's retransmissions (1 s, 2 s) hash the same way
	for _, c := range conns {
		if fleetEstablished(c) == 2 {
			joined++
		}
	}
	for i := range 2 {
		cs, err := fleet.Counters(ctx, i)
		if err != nil {
			return 0, 0, err
		}
		dropped += cs["drop_join_unknown_token"]
	}
	return joined, dropped, nil
}

// mplbFleetName is the fleet's row and series.
const mplbFleetName = "braid lb fleet (2 instances, ECMP)"

// mplbFleetReport measures the fleet row and the token-mode fleet, prints them beside the
// single balancer's figures (single), and returns the fleet's points.
func mplbFleetReport(ctx context.Context, w io.Writer, o kit.Options, sizes []int64, runs int, single []mplbPoint) ([]mplbPoint, error) {
	fmt.Fprintf(w, "\nThe fleet: two braid lb instances behind a router (BIRD) that spreads the VIP by ECMP over the\n"+
		"5-tuple, each announcing it over BGP; the backends in the stateless mode (they announce their own\n"+
		"port; the client opens its second subflow toward it from its second address).\n\n")
	pts, err := mplbFleetMeasure(ctx, o, sizes, runs)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tfleet time (s)\tfleet Mbit/s\tsingle braid lb Mbit/s\tfleet / single\tsecond subflow lost\t")
	for si, size := range sizes {
		fm, fc := kit.MeanCI(pts[si].times)
		fr, _ := kit.MeanCI(pts[si].rates)
		sr, _ := kit.MeanCI(single[si].rates)
		fmt.Fprintf(tw, "%s\t%.3f ± %.3f\t%.1f\t%.1f\t%.2fx\t%d/%d\t\n", sizeName(size), fm, fc, fr, sr, fr/max(sr, 1e-9), pts[si].single, len(pts[si].times))
	}
	tw.Flush()
	const n = 20
	joined, dropped, err := mplbFleetTokenJoins(ctx, o, n)
	if err != nil {
		return pts, fmt.Errorf("fleet, token mode: %w", err)
	}
	fmt.Fprintf(w, "\nToken mode in the same fleet, tokens not shared (the rejected design): %d of %d joins reached\n"+
		"their backend; the instances dropped %d join SYNs (retransmissions included) for tokens learned by\n"+
		"the other instance; a retransmitted SYN hashes to the same instance, so those joins never open.\n", joined, n, dropped)
	return pts, nil
}

// mplbFleetClaims: the fleet keeps every second subflow and carries what the single balancer
// does on the largest file (within 20 %).
func mplbFleetClaims(c *kit.Claims, sizes []int64, single, fleet []mplbPoint) {
	last := len(sizes) - 1
	lost, n := 0, 0
	for i, size := range sizes {
		if size >= 1e6 {
			lost, n = lost+fleet[i].single, n+len(fleet[i].times)
		}
	}
	c.Add("fleet: downloads of 1 MB and more that lost their second subflow", lost == 0, "%d of %d, bound 0", lost, n)
	fr, _ := kit.MeanCI(fleet[last].rates)
	sr, _ := kit.MeanCI(single[last].rates)
	c.AtLeast(sizeName(sizes[last])+": fleet throughput over the single braid lb's", fr/max(sr, 1e-9), 0.8, "%.2f")
}

// fleetEstablished counts the connection's subflows in the established state (its list
// also holds joins still waiting for their SYN/ACK).
func fleetEstablished(c *net.TCPConn) int {
	full, err := info.Full(c)
	if err != nil {
		return 0
	}
	n := 0
	for _, sf := range full.Subflows {
		if sf.TCP.State == 1 { // TCP_ESTABLISHED
			n++
		}
	}
	return n
}
