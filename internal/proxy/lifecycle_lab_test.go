package proxy_test

import (
	"context"
	"io"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/proxy"
	"braid/internal/wire/socks5"
)

// TestProxyLifecycle runs a proxy in process inside a lab host (pool 0: it dials nothing) and
// checks what its listeners do with bad requests, that Run drains and returns when its context
// ends, and that no goroutine outlives Close.
func TestProxyLifecycle(t *testing.T) {
	l := labtest.Up(t, labtest.Pair(topo.Shape{}))
	a, b := l.Host("a"), l.Host("b")
	before := runtime.NumGoroutine()
	pf := netip.MustParsePrefix
	var p *proxy.Proxy
	err := b.NS.Do(func() error {
		var err error
		p, err = proxy.New(proxy.Options{Pool: 0, HeaderTimeout: 500 * time.Millisecond, DrainTimeout: 2 * time.Second, Tenants: []proxy.Tenant{{
			Name: "blue", Networks: []netip.Prefix{pf("10.99.0.0/24")}, PeerPort: 7101, Socks: netip.MustParseAddrPort("10.99.0.2:1080"),
			Peers: []proxy.Peer{{Name: "far", Addrs: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.1:7101")}, Networks: []netip.Prefix{pf("10.50.0.0/16")}}},
		}}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()

	// SOCKS5: a destination no peer serves is refused with REP 0x02.
	c, err := a.Dial(dctx, "tcp", "10.99.0.2:1080")
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req, _ := socks5.Request{Cmd: socks5.CmdConnect, Dst: socks5.Addr{IP: netip.MustParseAddr("192.0.2.1"), Port: 80}}.Append([]byte{5, 1, 0})
	c.Write(req)
	reply, _ := io.ReadAll(c)
	c.Close()
	if len(reply) < 4 || reply[0] != 5 || reply[1] != 0 || reply[3] != socks5.RepNotAllowed {
		t.Errorf("socks reply %x, want selection 0500 then 05 02", reply)
	}
	// BIND is not served.
	c, err = a.Dial(dctx, "tcp", "10.99.0.2:1080")
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req, _ = socks5.Request{Cmd: socks5.CmdBind, Dst: socks5.Addr{IP: netip.MustParseAddr("10.50.0.1"), Port: 80}}.Append([]byte{5, 1, 0})
	c.Write(req)
	reply, _ = io.ReadAll(c)
	c.Close()
	if len(reply) < 4 || reply[3] != socks5.RepCommandUnsupported {
		t.Errorf("bind reply %x", reply)
	}
	// The peer port (plaintext here): the ready byte, then a truncated header times out.
	c, err = a.Dial(dctx, "tcp", "10.99.0.2:7101")
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte{socks5.DialectVersion, 19})
	start := time.Now()
	got, _ := io.ReadAll(c)
	c.Close()
	if len(got) != 1 || got[0] != 0x00 /* the ready byte */ || time.Since(start) > 2*time.Second {
		t.Errorf("truncated header: got %x after %v", got, time.Since(start))
	}
	st := p.Status()
	for _, r := range []string{proxy.ReasonNoRoute, proxy.ReasonCommand, proxy.ReasonTimeout} {
		if st.Tenants[0].Refused[r] != 1 {
			t.Errorf("refused %s = %d, want 1 (%v)", r, st.Tenants[0].Refused[r], st.Tenants[0].Refused)
		}
	}
	// An idle peer connection, as a pooled one: Run must still end.
	idle, err := a.Dial(dctx, "tcp", "10.99.0.2:7101")
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	p.Close()
	// proxy.New connections are refused once it has stopped.
	if c, err := a.Dial(dctx, "tcp", "10.99.0.2:1080"); err == nil {
		c.Close()
		t.Error("the SOCKS listener still accepts after Close")
	}
	var after int
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if after = runtime.NumGoroutine(); after <= before {
			return
		}
	}
	buf := make([]byte, 1<<16)
	t.Errorf("goroutines: %d before, %d after Close\n%s", before, after, buf[:runtime.Stack(buf, true)])
}
