package pm_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/info"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
	"braid/internal/mptcp/pmnl"
	"braid/internal/traffic"
)

// startPM runs a fullmesh path manager inside h over the host's link addresses (IPv4).
func startPM(t *testing.T, l *lab.Lab, h *lab.Host) *pm.Daemon {
	t.Helper()
	return startPMWith(t, l, h, core.Config{})
}

// startPMWith is startPM with the manager's timers and caps set by cfg.
func startPMWith(t *testing.T, l *lab.Lab, h *lab.Host, cfg core.Config) *pm.Daemon {
	t.Helper()
	var ups []core.Uplink
	for _, lk := range l.Links() {
		ep := lk.Spec.A
		if ep.Host != h.Name {
			ep = lk.Spec.B
		}
		nl, err := h.NS.Netlink().LinkByName(ep.Ifname)
		if err != nil {
			t.Fatal(err)
		}
		ups = append(ups, core.Uplink{Name: ep.Ifname, Addr: ep.Addrs[0].Addr().String(), IfIndex: int32(nl.Attrs().Index)})
	}
	var d *pm.Daemon
	if err := h.NS.Do(func() (err error) {
		d, err = pm.New(pm.Options{Uplinks: ups, Policy: core.Fullmesh{}, Core: cfg})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pm run: %v", err)
		}
		if err := h.NS.Do(d.Close); err != nil {
			t.Errorf("pm close: %v", err)
		}
	})
	return d
}

func mptcpDial(h *lab.Host, local string, multipath bool) traffic.DialFunc {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		var c net.Conn
		err := h.NS.Spawn(func() (err error) {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(local))}
			d.SetMultipathTCP(multipath)
			c, err = d.DialContext(ctx, network, address)
			return err
		})
		return c, err
	}
}

func startServer(t *testing.T, h *lab.Host) {
	t.Helper()
	var ln net.Listener
	if err := h.NS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp", "0.0.0.0:5201")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := traffic.NewServer(ln, nil)
	go srv.Serve(context.Background())
	t.Cleanup(func() { srv.Close() })
}

// A subflow whose link is cut is replaced, and comes back within 2 s of the link's return.
func TestLabFullmeshRecreate(t *testing.T) {
	shape := topo.Shape{Rate: 100e6, Delay: 2 * time.Millisecond}
	l := labtest.Up(t, kit.ParallelLinks("pmre", shape, shape))
	a, b := l.Host("a"), l.Host("b")
	var events *pmnl.Stream
	if err := a.NS.Do(func() (err error) { events, err = pmnl.Subscribe(pmnl.Options{}); return err }); err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	d := startPM(t, l, a)
	startServer(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Record every event with the time it arrived.
	type stamped struct {
		at time.Time
		e  pmnl.Event
	}
	got := make(chan stamped, 1024)
	go func() {
		for {
			e, err := events.Next(ctx)
			if err != nil {
				return
			}
			got <- stamped{time.Now(), e}
		}
	}()
	second := netip.MustParseAddr("10.9.1.1")
	// waitUp returns when a subflow from the second link is established after since.
	waitUp := func(since time.Time, within time.Duration) (time.Time, error) {
		timeout := time.After(within)
		for {
			select {
			case s := <-got:
				if s.e.Type == pmnl.EventSubEstablished && s.e.Local.Addr() == second && s.at.After(since) {
					return s.at, nil
				}
			case <-timeout:
				return time.Time{}, fmt.Errorf("none within %v", within)
			}
		}
	}

	// Keep data flowing so that a dead path shows as unacknowledged data.
	bulkDone := make(chan error, 1)
	go func() {
		_, err := traffic.Bulk(ctx, mptcpDial(a, "10.9.0.1:0", true), "10.9.0.2:5201",
			traffic.BulkOptions{Duration: 9 * time.Second, Interval: time.Second})
		bulkDone <- err
	}()
	if _, err := waitUp(time.Time{}, 5*time.Second); err != nil {
		t.Fatalf("no subflow over the second link: %v", err)
	}
	time.Sleep(time.Second)
	link := l.Links()[1]
	link.Cut()
	time.Sleep(3 * time.Second)
	if c := d.Status().Counters; c.DeadSubflows == 0 || c.Destroys == 0 {
		t.Errorf("the cut went unnoticed: %+v", c)
	}
	restored := time.Now()
	link.Restore()
	at, err := waitUp(restored, 5*time.Second)
	if err != nil {
		t.Fatalf("subflow over the restored link not re-created: %v", err)
	}
	gap := at.Sub(restored)
	t.Logf("subflow re-created %v after the link came back; pm counters %+v", gap, d.Status().Counters)
	if gap > 2*time.Second {
		t.Errorf("re-created after %v, want within 2 s", gap)
	}
	if err := <-bulkDone; err != nil {
		t.Errorf("bulk transfer across the cut: %v", err)
	}
}

// A connection opened before the path manager started (under the userspace PM, as after a
// restart of the daemon) is taken up from sock_diag; one opened under the in-kernel PM, which
// the kernel latches per connection, is refused once and forgotten while the other is served.
func TestLabTakesUpExistingConnections(t *testing.T) {
	shape := topo.Shape{Rate: 100e6, Delay: time.Millisecond}
	l := labtest.Up(t, kit.ParallelLinks("pmup", shape, shape))
	a, b := l.Host("a"), l.Host("b")
	var ln net.Listener
	if err := b.NS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp", "0.0.0.0:5000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	open := func() net.Conn {
		c, err := mptcpDial(a, "10.9.0.1:0", true)(context.Background(), "tcp", "10.9.0.2:5000")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte("before the path manager")); err != nil {
			t.Fatal(err)
		}
		return c
	}
	open() // under the in-kernel PM
	if err := a.NS.Sysctl("mptcp/pm_type", "1"); err != nil {
		t.Fatal(err)
	}
	c := open()
	time.Sleep(200 * time.Millisecond) // acknowledged: the connections are fully established
	tok, err := info.Info(c.(*net.TCPConn))
	if err != nil {
		t.Fatal(err)
	}
	var events *pmnl.Stream
	if err := a.NS.Do(func() (err error) { events, err = pmnl.Subscribe(pmnl.Options{}); return err }); err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	d := startPM(t, l, a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		e, err := events.Next(ctx)
		if err != nil {
			t.Fatalf("no subflow for the existing connection: %v; pm %+v", err, d.Status())
		}
		if e.Type == pmnl.EventSubEstablished && e.Token == tok.Token && e.Local.Addr() == netip.MustParseAddr("10.9.1.1") {
			break
		}
	}
	time.Sleep(500 * time.Millisecond)
	st := d.Status()
	if len(st.Connections) != 1 || st.Connections[0].Token != tok.Token || st.Connections[0].ServerSide {
		t.Errorf("connections %+v", st.Connections)
	}
	if n := st.Refused["create:EINVAL"]; n != 1 {
		t.Errorf("the in-kernel PM's connection was refused %d times, want once (%s)", n, st.LastError)
	} else {
		t.Logf("refused once: %s", st.LastError)
	}
}
