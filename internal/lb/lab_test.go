package lb_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"braid/internal/experiment/mplb"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lb"
	"braid/internal/lb/xdp"
	"braid/internal/mptcp/info"
)

// dialAll opens n MPTCP connections in parallel and asks each where it landed.
func dialAll(t *testing.T, ctx context.Context, l *lab.Lab, n int) ([]*net.TCPConn, []int) {
	t.Helper()
	conns := make([]*net.TCPConn, n)
	where := make([]int, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, 64)
	for i := 0; i < n; i++ {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := mplb.MPLBDial(ctx, l)
			if err != nil {
				if failed.Add(1) == 1 {
					t.Errorf("dial %d: %v", i, err)
				}
				return
			}
			conns[i] = c
			k, err := mplb.MPLBAsk(c)
			if err != nil {
				if failed.Add(1) == 1 {
					t.Errorf("ask %d: %v", i, err)
				}
				return
			}
			where[i] = k
			if mp, _ := c.MultipathTCP(); !mp {
				if failed.Add(1) == 1 {
					t.Errorf("connection %d fell back to TCP", i)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
	return conns, where
}

// waitJoins waits until every connection has its second subflow, and returns how many have.
func waitJoins(conns []*net.TCPConn, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		joined := 0
		for _, c := range conns {
			// A join counts once established: the kernel counts a subflow in mptcpi_subflows
			// from its SYN on, so a join that the wrong backend is about to reset looked
			// joined when sampled before the reset came back (200 of 200 once in make test).
			full, err := info.Full(c)
			if err != nil {
				continue
			}
			established := 0
			for _, s := range full.Subflows {
				if s.TCP.State == 1 { // TCP_ESTABLISHED
					established++
				}
			}
			if established >= 2 {
				joined++
			}
		}
		if joined == len(conns) || time.Now().After(deadline) {
			return joined
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLabSubflowsReachOneBackend runs real MPTCP connections through the XDP balancer: with
// 2, 4 and 16 backends, 1000 connections each open a second subflow from the client's other
// address, after one backend was drained and a new one added. Every subflow must reach its
// connection's backend; no established connection may move; the drained backend takes no new
// connection; the tokens learned are the servers' own.
func TestLabSubflowsReachOneBackend(t *testing.T) {
	for _, n := range []int{2, 4, 16} {
		t.Run(fmt.Sprintf("%d backends", n), func(t *testing.T) { subflowsReachOneBackend(t, n, 1000) })
	}
}

func subflowsReachOneBackend(t *testing.T, n, conns int) {
	labtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// n backends in service, one more added during the test.
	l := labtest.Up(t, mplb.MPLBTopology(n+1, 0))
	if err := mplb.MPLBPrepare(l, n+1); err != nil {
		t.Fatal(err)
	}
	srv, err := mplb.StartMPLBServers(l, n+1)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	bal, err := mplb.StartMPLBBalancer(l, n, xdp.Config{Aware: true, HashSeed: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer bal.Close()

	cs, where := dialAll(t, ctx, l, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	per := make([]int, n+1)
	for _, k := range where {
		per[k]++
	}
	t.Logf("first subflows per backend: %v", per)
	for k := 0; k < n; k++ {
		if per[k] == 0 {
			t.Fatalf("backend %d got no connection: %v", k, per)
		}
	}

	// Drain backend 0 and add backend n, then let every connection open its second subflow.
	if err := bal.LB.SetWeight("b0", 0); err != nil {
		t.Fatal(err)
	}
	spec, err := mplb.MPLBBackendSpec(l, n, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.LB.AddBackend(spec); err != nil {
		t.Fatal(err)
	}
	if err := mplb.MPLBEndpoint(ctx, l); err != nil {
		t.Fatal(err)
	}
	joined := waitJoins(cs, 20*time.Second)
	st, _ := bal.LB.Status(false)
	if joined != conns {
		t.Fatalf("%d of %d connections have their second subflow (counters %v)", joined, conns, st.Counters)
	}
	// The client counts the join as established; the server side must hold both subflows.
	total := 0
	for k := 0; k <= n; k++ {
		h := l.Host(fmt.Sprintf("b%d", k))
		dump, err := info.Dump(info.Options{NetNS: h.NS.Handle()})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range dump {
			if c.Local.Port() != mplb.MPLBPort {
				continue
			}
			if len(c.Subflows) != 2 {
				t.Errorf("backend %d: connection from %v has %d subflows", k, c.Remote, len(c.Subflows))
			}
			total++
		}
	}
	if total != conns {
		t.Fatalf("the backends hold %d connections, want %d", total, conns)
	}
	// Established connections did not move, on the drained backend either.
	for i, c := range cs {
		k, err := mplb.MPLBAsk(c)
		if err != nil || k != where[i] {
			t.Fatalf("connection %d: was on backend %d, now answers %d (%v)", i, where[i], k, err)
		}
	}
	// The tokens learned are the servers' own (mptcpi_token).
	toks, err := bal.Plane.Tokens()
	if err != nil {
		t.Fatal(err)
	}
	owner := map[uint32]uint32{}
	for _, tk := range toks {
		owner[tk.Token] = tk.Backend
	}
	st, _ = bal.LB.Status(false)
	index := map[string]uint32{}
	for _, b := range st.Backends {
		index[b.Name] = b.Index
	}
	for k := 0; k <= n; k++ {
		for _, c := range srv.Conns(k) {
			ci, err := info.Info(c.(*net.TCPConn))
			if err != nil {
				t.Fatal(err)
			}
			if b, ok := owner[ci.Token]; !ok || b != index[fmt.Sprintf("b%d", k)] {
				t.Fatalf("backend %d's connection token %08x: balancer has %v", k, ci.Token, owner[ci.Token])
			}
		}
	}
	if got := st.Counters["join_steered"]; got != uint64(conns) {
		t.Errorf("join_steered %d, want %d", got, conns)
	}
	if got := st.Counters["drop_join_unknown_token"]; got != 0 {
		t.Errorf("drop_join_unknown_token %d", got)
	}
	// New connections avoid the drained backend and reach the new one.
	_, after := dialAll(t, ctx, l, 200)
	perAfter := make([]int, n+1)
	for _, k := range after {
		perAfter[k]++
	}
	t.Logf("after drain and add: %v", perAfter)
	if perAfter[0] != 0 || perAfter[n] == 0 {
		t.Fatalf("new connections after draining b0 and adding b%d: %v", n, perAfter)
	}
}

// TestLabUnawareSplitsSubflows is the comparison: the same balancer without MPTCP awareness
// (5-tuple hash) sends about (n-1)/n of the joins to the wrong backend, which resets them.
func TestLabUnawareSplitsSubflows(t *testing.T) {
	labtest.Require(t)
	const n, conns = 4, 200
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := labtest.Up(t, mplb.MPLBTopology(n, 0))
	if err := mplb.MPLBPrepare(l, n); err != nil {
		t.Fatal(err)
	}
	srv, err := mplb.StartMPLBServers(l, n)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	bal, err := mplb.StartMPLBBalancer(l, n, xdp.Config{Aware: false, HashSeed: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer bal.Close()
	cs, _ := dialAll(t, ctx, l, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	if err := mplb.MPLBEndpoint(ctx, l); err != nil {
		t.Fatal(err)
	}
	joined := waitJoins(cs, 3*time.Second)
	t.Logf("unaware balancer: %d of %d joins reached their connection's backend", joined, conns)
	if joined > conns*45/100 || joined < conns*5/100 {
		t.Fatalf("unaware balancer: %d of %d joins succeeded, expected about 1/%d", joined, conns, n)
	}
}

// TestLabIPIP runs the balancer in ipip mode: backends decapsulate (braid_decap, as the lab's
// kernels have no IP-in-IP device) and answer from the VIP; every join still reaches its
// connection's backend, and every packet the backends got from the client was encapsulated.
func TestLabIPIP(t *testing.T) {
	labtest.Require(t)
	const n, conns = 2, 100
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := labtest.Up(t, mplb.MPLBTopology(n, 0))
	if err := mplb.MPLBPrepare(l, n); err != nil {
		t.Fatal(err)
	}
	srv, err := mplb.StartMPLBServers(l, n)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	bal, err := mplb.StartMPLBBalancer(l, n, xdp.Config{Aware: true, Mode: xdp.ModeIPIP, HashSeed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer bal.Close()
	if err := mplb.MPLBDecap(l, n, bal.Plane); err != nil {
		t.Fatal(err)
	}
	if err := mplb.MPLBEndpoint(ctx, l); err != nil {
		t.Fatal(err)
	}
	cs, _ := dialAll(t, ctx, l, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	if joined := waitJoins(cs, 10*time.Second); joined != conns {
		st, _ := bal.LB.Status(false)
		t.Fatalf("%d of %d joins through IP-in-IP (counters %v)", joined, conns, st.Counters)
	}
	// The balancer's encapsulated frames are longer than the client's: count bytes.
	st, _ := bal.LB.Status(false)
	var fwd uint64
	for _, b := range st.Backends {
		fwd += b.Packets
	}
	if fwd == 0 || st.Counters["forwarded"] != fwd || st.Counters["drop_encap"] != 0 {
		t.Fatalf("counters %v", st.Counters)
	}
	// Every packet the backends took from the balancer came encapsulated.
	if n, err := bal.Plane.DecapCount(); err != nil || n != fwd {
		t.Fatalf("the backends decapsulated %d packets (%v), the balancer forwarded %d", n, err, fwd)
	}
}

// TestLabStateless runs the stateless mode with the kernel's own mechanism: backends set the C
// flag and announce the VIP with their own port; the client's second subflow goes to that
// port, and the balancer's (VIP, port) table sends it to the right backend with no token.
func TestLabStateless(t *testing.T) {
	labtest.Require(t)
	const n, conns = 2, 50
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := labtest.Up(t, mplb.MPLBTopology(n, 0))
	if err := mplb.MPLBPrepare(l, n); err != nil {
		t.Fatal(err)
	}
	if err := mplb.MPLBStateless(ctx, l, n); err != nil {
		t.Fatal(err)
	}
	srv, err := mplb.StartMPLBServers(l, n)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// Token learning off: only the stateless table can steer the joins.
	bal, err := mplb.StartMPLBBalancer(l, n, xdp.Config{Aware: false, HashSeed: 5}, func(k int, s *lb.BackendSpec) {
		s.StatelessPort = mplb.MPLBStatelessPort(k)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer bal.Close()
	cs, where := dialAll(t, ctx, l, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	if joined := waitJoins(cs, 10*time.Second); joined != conns {
		st, _ := bal.LB.Status(false)
		t.Fatalf("%d of %d connections got their announced subflow (counters %v)", joined, conns, st.Counters)
	}
	for i, c := range cs {
		sfs, err := info.SubflowAddrs(c)
		if err != nil {
			t.Fatal(err)
		}
		want := mplb.MPLBStatelessPort(where[i])
		found := false
		for _, a := range sfs {
			found = found || a.Remote.Port() == want
		}
		if !found {
			t.Fatalf("connection %d on backend %d: no subflow to its port %d: %+v", i, where[i], want, sfs)
		}
	}
	st, _ := bal.LB.Status(false)
	if st.Counters["stateless_forwarded"] == 0 || st.Counters["join_steered"] != 0 || len(st.Tokens) != 0 {
		t.Fatalf("counters %v", st.Counters)
	}
}
