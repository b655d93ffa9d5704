package pmnl_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/info"
	"braid/internal/mptcp/pmnl"
)

// events collects a host's path-manager events in the background.
type events struct {
	ch chan pmnl.Event
}

func subscribe(t *testing.T, h *lab.Host) *events {
	t.Helper()
	var s *pmnl.Stream
	if err := h.NS.Do(func() (err error) { s, err = pmnl.Subscribe(pmnl.Options{}); return err }); err != nil {
		t.Fatal(err)
	}
	ev := &events{ch: make(chan pmnl.Event, 256)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			e, err := s.Next(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				t.Errorf("events in %s: %v", h.Name, err)
				return
			}
			ev.ch <- e
		}
	}()
	t.Cleanup(func() { cancel(); <-done; s.Close() })
	return ev
}

// wait returns the first event that match accepts, failing after d.
func (ev *events) wait(t *testing.T, what string, d time.Duration, match func(pmnl.Event) bool) pmnl.Event {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case e := <-ev.ch:
			if match(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s event within %v", what, d)
		}
	}
}

func dialMPTCP(ctx context.Context, h *lab.Host, local, remote string) (net.Conn, error) {
	var c net.Conn
	err := h.NS.Spawn(func() (err error) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(local))}
		d.SetMultipathTCP(true)
		c, err = d.DialContext(ctx, "tcp", remote)
		return err
	})
	return c, err
}

func listenMPTCP(h *lab.Host, addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.NS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp", addr)
		return err
	})
	return ln, err
}

// Two hosts with two uplinks each: the userspace PM sees the connection, opens a subflow from
// the exact source port asked for, marks it backup (the peer sees MP_PRIO) and destroys it;
// per-subflow byte counters from the socket and from sock_diag add up to what was sent.
func TestLabUserspacePM(t *testing.T) {
	shape := topo.Shape{Rate: 200e6, Delay: time.Millisecond}
	l := labtest.Up(t, kit.ParallelLinks("pmnl", shape, shape))
	a, b := l.Host("a"), l.Host("b")
	for _, h := range []*lab.Host{a, b} {
		if err := h.NS.Sysctl("mptcp/pm_type", "1"); err != nil {
			t.Fatal(err)
		}
	}
	evA, evB := subscribe(t, a), subscribe(t, b)
	// A stream whose wait timed out goes on working with the next context.
	var again *pmnl.Stream
	if err := a.NS.Do(func() (err error) { again, err = pmnl.Subscribe(pmnl.Options{}); return err }); err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if _, err := again.Next(short); err != context.DeadlineExceeded {
		t.Fatalf("Next on a quiet namespace: %v, want the context's deadline", err)
	}
	cancelShort()
	var client *pmnl.Client
	if err := a.NS.Do(func() (err error) { client, err = pmnl.Dial(pmnl.Options{}); return err }); err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	ln, err := listenMPTCP(b, "0.0.0.0:5000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const total = 40 << 20
	received := make(chan int64, 1)
	serverConn := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			received <- -1
			return
		}
		serverConn <- c
		n, _ := io.Copy(io.Discard, c)
		received <- n
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c, err := dialMPTCP(ctx, a, "10.9.0.1:0", "10.9.0.2:5000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	if ok, err := tc.MultipathTCP(); !ok {
		t.Fatalf("connection is not MPTCP: %v", err)
	}
	created := evA.wait(t, "created", 5*time.Second, func(e pmnl.Event) bool { return e.Type == pmnl.EventCreated })
	actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
	if e, err := again.Next(actx); err != nil || e.Type != pmnl.EventCreated || e.Token != created.Token {
		t.Errorf("the stream after a timeout: %v %v", e, err)
	}
	acancel()
	ci, err := info.Info(tc)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Token != created.Token {
		t.Errorf("MPTCP_INFO token %08x, CREATED token %08x", ci.Token, created.Token)
	}
	if _, err := c.Write([]byte("hello")); err != nil { // a v1 client is established once data is acked
		t.Fatal(err)
	}
	evA.wait(t, "established", 5*time.Second, func(e pmnl.Event) bool { return e.Type == pmnl.EventEstablished && e.Token == created.Token })
	<-serverConn

	sf := pmnl.Subflow{Token: created.Token, Local: pmnl.Addr{ID: 2, Addr: netip.MustParseAddr("10.9.1.1"), Port: 40001},
		Remote: netip.MustParseAddrPort("10.9.1.2:5000")}
	if err := client.CreateSubflow(ctx, sf); err != nil {
		t.Fatal(err)
	}
	est := evA.wait(t, "sf_established", 5*time.Second, func(e pmnl.Event) bool { return e.Type == pmnl.EventSubEstablished })
	if est.Local != netip.MustParseAddrPort("10.9.1.1:40001") || est.Remote != sf.Remote || est.LocID != 2 {
		t.Errorf("subflow established as %v", est)
	}
	peerEst := evB.wait(t, "peer sf_established", 5*time.Second, func(e pmnl.Event) bool { return e.Type == pmnl.EventSubEstablished })
	if peerEst.Remote.Port() != 40001 {
		t.Errorf("peer saw the subflow from %v", peerEst.Remote)
	}

	// A token that does not exist, and an address the kernel refuses, name their cause.
	bad := sf
	bad.Token ^= 0xffffffff
	if err := client.CreateSubflow(ctx, bad); err == nil {
		t.Error("subflow on an unknown token accepted")
	} else {
		t.Logf("unknown token: %v", err)
	}
	bad = sf
	bad.Remote = netip.MustParseAddrPort("[fd09:1::2]:5000")
	if err := client.CreateSubflow(ctx, bad); err == nil {
		t.Error("subflow with mixed families accepted")
	} else {
		t.Logf("mixed families: %v", err)
	}

	// Bulk transfer over both subflows.
	buf := make([]byte, 256<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	start := time.Now()
	var sent int64 = 5
	for sent < total {
		n, err := c.Write(buf[:min(len(buf), int(total-sent))])
		sent += int64(n)
		if err != nil {
			t.Fatal(err)
		}
	}
	// Wait until everything is acknowledged at the MPTCP level.
	var full info.Conn
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if full, err = info.Full(tc); err != nil {
			t.Fatal(err)
		}
		if full.Info.BytesAcked >= uint64(sent) {
			break
		}
	}
	t.Logf("sent %d bytes in %v; MPTCP bytes_sent %d acked %d", sent, time.Since(start), full.Info.BytesSent, full.Info.BytesAcked)
	if len(full.Subflows) != 2 {
		t.Fatalf("MPTCP_FULL_INFO lists %d subflows, want 2: %+v", len(full.Subflows), full.Subflows)
	}
	_, acked, _ := full.SubflowBytes()
	for _, s := range full.Subflows {
		t.Logf("subflow %d %v -> %v: bytes_sent %d acked %d rtt %v cwnd %d", s.ID, s.Local, s.Remote, s.TCP.BytesSent, s.TCP.BytesAcked, s.TCP.RTT, s.TCP.SndCwnd)
		if s.TCP.BytesAcked < uint64(sent)/20 {
			t.Errorf("subflow %v carried only %d bytes: not both paths were used", s.Local, s.TCP.BytesAcked)
		}
	}
	within := func(what string, got uint64) {
		t.Helper()
		if d := float64(got) - float64(sent); d < -0.01*float64(sent) || d > 0.01*float64(sent) {
			t.Errorf("%s: %d bytes, application sent %d (off by %.2f %%)", what, got, sent, 100*d/float64(sent))
		}
	}
	within("sum of subflow bytes_acked (MPTCP_FULL_INFO)", acked)
	tcpi, err := info.TCPInfos(tc)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := info.SubflowAddrs(tc)
	if err != nil {
		t.Fatal(err)
	}
	if len(tcpi) != 2 || len(addrs) != 2 {
		t.Fatalf("MPTCP_TCPINFO %d, MPTCP_SUBFLOW_ADDRS %d entries", len(tcpi), len(addrs))
	}
	var tcpiSum uint64
	for _, ti := range tcpi {
		tcpiSum += ti.BytesAcked
	}
	within("sum of subflow bytes_acked (MPTCP_TCPINFO)", tcpiSum)
	found := false
	for _, p := range addrs {
		found = found || p.Local == est.Local && p.Remote == est.Remote
	}
	if !found {
		t.Errorf("MPTCP_SUBFLOW_ADDRS %v lacks %v -> %v", addrs, est.Local, est.Remote)
	}

	// sock_diag sees the same connection without owning the socket.
	var conns []info.Conn
	if err := a.NS.Do(func() (err error) { conns, err = info.Dump(info.Options{}); return err }); err != nil {
		t.Fatal(err)
	}
	var dumped *info.Conn
	for i := range conns {
		if conns[i].Info.Token == created.Token {
			dumped = &conns[i]
		}
	}
	if dumped == nil || len(dumped.Subflows) != 2 {
		t.Fatalf("sock_diag dump: %+v", conns)
	}
	_, dacked, _ := dumped.SubflowBytes()
	within("sum of subflow bytes_acked (sock_diag)", dacked)

	// Backup: the peer sees the priority change.
	sfb := sf
	sfb.Local.Flags = pmnl.FlagBackup
	if err := client.SetSubflowFlags(ctx, sfb); err != nil {
		t.Fatal(err)
	}
	prio := evB.wait(t, "peer sf_priority", 5*time.Second, func(e pmnl.Event) bool { return e.Type == pmnl.EventSubPriority })
	if !prio.Backup || prio.Remote.Port() != 40001 {
		t.Errorf("peer priority event %v", prio)
	}
	if err := a.NS.Do(func() (err error) { conns, err = info.Dump(info.Options{}); return err }); err != nil {
		t.Fatal(err)
	}
	for _, cn := range conns {
		for _, s := range cn.Subflows {
			if s.Local.Port() == 40001 && s.Flags&info.SubflowBackupLocal == 0 {
				t.Errorf("sock_diag: subflow %v not marked backup locally (flags %#x)", s.Local, s.Flags)
			}
		}
	}

	// Destroy: both sides see the subflow close.
	if err := client.DestroySubflow(ctx, sf); err != nil {
		t.Fatal(err)
	}
	cl := evA.wait(t, "sf_closed", 5*time.Second, func(e pmnl.Event) bool { return e.Type == pmnl.EventSubClosed })
	if cl.Local.Port() != 40001 {
		t.Errorf("closed %v", cl)
	}
	evB.wait(t, "peer sf_closed", 5*time.Second, func(e pmnl.Event) bool { return e.Type == pmnl.EventSubClosed && e.Remote.Port() == 40001 })
	if err := client.DestroySubflow(ctx, sf); err == nil {
		t.Error("destroying a subflow twice succeeded")
	} else {
		t.Logf("destroy again: %v", err)
	}
	c.Close()
	if n := <-received; n != sent {
		t.Errorf("server received %d bytes, client sent %d", n, sent)
	}
	evA.wait(t, "closed", 5*time.Second, func(e pmnl.Event) bool { return e.Type == pmnl.EventClosed && e.Token == created.Token })
}
