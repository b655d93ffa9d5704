package amptcp

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
)

func init() {
	kit.Register(kit.Scenario{Name: "lisp", Summary: "two multihomed LISP sites, a map server, braid xTRs: reachability and RLOC failover", Run: runLisp})
}

func runLisp(ctx context.Context, w io.Writer, o kit.Options) error {
	t := roles.LispTopology(5*time.Millisecond, 0)
	l, err := lab.Up(ctx, t, lab.Options{Logger: o.Logger, OwnSignals: true, Seed: o.Seed})
	if err != nil {
		return err
	}
	defer l.Close()
	ll, err := roles.StartLisp(ctx, l, nil)
	if err != nil {
		return err
	}
	defer ll.Close()
	h1, h2 := l.Host("h1"), l.Host("h2")
	fmt.Fprintf(w, "braid lab run lisp: 2 sites x 2 RLOCs, map server %v, links 5 ms each way (%s)\n", roles.LispMapServer, lab.EmulatorName)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "check\tresult")
	// The claims: a destination is reached within a second (the first packets wait for the
	// mapping: a Map-Request over 5 ms links), and the cut of the RLOC carrying the traffic
	// costs at most 2 s (down after 1 s of unanswered probes, one 300 ms probe interval, margin).
	claims := &kit.Claims{}
	for k, dst := range roles.LispSites[1].HostIP {
		gap, err := kit.Ping(ctx, h1, h2, dst, 2*time.Second)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "h1 -> h2 %v (%s)\tlongest gap %v (first packets wait for the mapping)\n", dst, []string{"IPv4", "IPv6"}[k], gap.Round(time.Millisecond))
		claims.AtMost(fmt.Sprintf("h1 -> h2 over %s: longest gap of a 10 ms ping", []string{"IPv4", "IPv6"}[k]), float64(gap)/1e6, 1000, "%.0f ms")
	}
	// Cut the RLOC of site 1 that carries the pings: traffic moves to the other RLOC.
	dur := 6 * time.Second
	if o.Quick {
		dur = 4 * time.Second
	}
	res := make(chan time.Duration, 1)
	go func() {
		g, _ := kit.Ping(ctx, h1, h2, roles.LispSites[1].HostIP[0], dur)
		res <- g
	}()
	txBy := func() map[netip.Addr]uint64 {
		m := map[netip.Addr]uint64{}
		for _, p := range ll.XTRs[0].Status().Pairs {
			m[p.Local] += p.TxPackets
		}
		return m
	}
	time.Sleep(500 * time.Millisecond)
	tx0 := txBy()
	time.Sleep(500 * time.Millisecond)
	tx1 := txBy()
	used := 0
	for j, r := range roles.LispSites[0].RLOCs {
		if tx1[r]-tx0[r] > tx1[roles.LispSites[0].RLOCs[used]]-tx0[roles.LispSites[0].RLOCs[used]] {
			used = j
		}
	}
	cut := l.Link(roles.LispSites[0].Links[used])
	cut.Cut()
	gap := <-res
	cut.Restore()
	fmt.Fprintf(tw, "cut %s (RLOC %v, carrying the pings)\tlongest gap %v (probe interval 300ms, down after 1s)\n", roles.LispSites[0].Links[used], roles.LispSites[0].RLOCs[used], gap.Round(time.Millisecond))
	claims.AtMost("cut of the RLOC carrying the pings: longest gap", float64(gap)/1e6, 2000, "%.0f ms")
	tw.Flush()
	fmt.Fprintln(w, "\nxtr1 RLOC pairs:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "local\tremote\tstate\trtt\ttx packets\trx packets")
	for _, p := range ll.XTRs[0].Status().Pairs {
		state := "down"
		if p.Up {
			state = "up"
		}
		fmt.Fprintf(tw, "%v\t%v\t%s\t%v\t%d\t%d\n", p.Local, p.Remote, state, p.RTT.Round(10*time.Microsecond), p.TxPackets, p.RxPackets)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	claims.Print(w)
	return claims.Err()
}
