package proxy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/proxy"
	"braid/internal/proxy/ident"
	"braid/internal/wire/socks5"
)

// The hostile lab: host a is both the attacker (10.99.0.1) and, from its second address
// (10.99.0.3), the tenant's legitimate peer; host b runs the proxies in process and a server
// in the tenant's network (b's own address).
const (
	hAttacker = "10.99.0.1"
	hPeer     = "10.99.0.3"
	hProxy    = "10.99.0.2"
	hOrigin   = hProxy + ":5300"
)

func hostileTopology() *topo.Topology {
	pf := netip.MustParsePrefix
	return &topo.Topology{Name: "phostile", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}, Links: []topo.Link{{Kernel: true,
		A: topo.Endpoint{Host: "a", Addrs: []netip.Prefix{pf(hAttacker + "/24"), pf(hPeer + "/24")}},
		B: topo.Endpoint{Host: "b", Addrs: []netip.Prefix{pf(hProxy + "/24")}}}}}
}

// syncBuffer is a log destination read while the proxy writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// dialFrom opens TCP from src (an address of h) to addr.
func dialFrom(ctx context.Context, h *lab.Host, src, addr string) (net.Conn, error) {
	var c net.Conn
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	err := h.NS.Spawn(func() error {
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

func startProxy(t *testing.T, h *lab.Host, o proxy.Options) *proxy.Proxy {
	t.Helper()
	var p *proxy.Proxy
	if err := h.NS.Do(func() error {
		var err error
		p, err = proxy.New(o)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		p.Close()
	})
	return p
}

func refusedOf(p *proxy.Proxy, reason string) uint64 {
	var n uint64
	for _, t := range p.Status().Tenants {
		n += t.Refused[reason]
	}
	return n
}

// waitCount waits up to 2 s for f to reach want.
func waitCount(f func() uint64, want uint64) uint64 {
	deadline := time.Now().Add(2 * time.Second)
	for f() < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return f()
}

// TestProxyHostile performs the attacks on a proxy's listeners from a lab host and checks
// that none does harm, while the legitimate peer and clients are still served:
//   - plaintext: a connection from an address that is no peer's gets no ready byte and no
//     relay (it was an open relay into the tenant's networks);
//   - a peer's header without a source is refused unless the tenant allows it (reloaded in
//     place to show both);
//   - the SOCKS5 listener refuses clients outside the tenant's networks and its allow-list;
//   - connections that never authenticate are capped: beyond the cap they are reset at once
//     and counted; a real peer, from its own address, is served while they hold the cap (its
//     addresses have a cap of their own) and once they are gone.
func TestProxyHostile(t *testing.T) {
	l := labtest.Up(t, hostileTopology())
	a, b := l.Host("a"), l.Host("b")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	pf := netip.MustParsePrefix

	var accepted atomic.Int64
	ln, err := b.Listen("tcp", hOrigin)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			fmt.Fprintf(c, "hello %s\n", c.RemoteAddr())
			c.Close()
		}
	}()

	logs := &syncBuffer{}
	blue := proxy.Tenant{Name: "blue", Networks: []netip.Prefix{pf(hProxy + "/32")}, PeerPort: 7101,
		Socks: netip.MustParseAddrPort(hProxy + ":1080"), SocksClients: []netip.Prefix{pf(hPeer + "/32")},
		Peers: []proxy.Peer{{Name: "far", Addrs: []netip.AddrPort{netip.MustParseAddrPort(hPeer + ":7101")}, Networks: []netip.Prefix{pf("10.50.0.0/16")}}}}
	plain := startProxy(t, b, proxy.Options{Pool: 0, HeaderTimeout: time.Second, DrainTimeout: time.Second, Tenants: []proxy.Tenant{blue},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if !strings.Contains(logs.String(), "level=WARN msg=\"PLAINTEXT between proxies") {
		t.Errorf("no warning of plaintext at start; the log:\n%s", logs)
	}
	header := must(socks5.Header{Dst: netip.MustParseAddrPort(hOrigin)}.Append(nil))

	// ask sends header on a new connection from src and returns what came back and whether
	// the origin got a connection.
	ask := func(t *testing.T, src string, hdr []byte) (got []byte, relayed bool) {
		t.Helper()
		before := accepted.Load()
		c, err := dialFrom(ctx, a, src, hProxy+":7101")
		if errors.Is(err, syscall.ECONNRESET) { // reset before connect returned
			time.Sleep(50 * time.Millisecond)
			return nil, accepted.Load() > before
		}
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write(hdr)
		got, _ = io.ReadAll(c)
		time.Sleep(50 * time.Millisecond)
		return got, accepted.Load() > before
	}

	t.Run("plaintext-open-relay", func(t *testing.T) {
		// The tenant allows sourceless requests, so only the peer check stands in the way.
		blue.AllowSourceless = true
		if _, err := plain.Reload([]proxy.Tenant{blue}); err != nil {
			t.Fatal(err)
		}
		authBefore := refusedOf(plain, proxy.ReasonAuth)
		dialsBefore := refusedOf(plain, proxy.ReasonDstUnreachable)
		got, relayed := ask(t, hAttacker, header)
		if relayed || len(got) > 0 {
			t.Errorf("from %s (no peer's address): %d bytes back (%q), relayed to the origin: %v", hAttacker, len(got), got, relayed)
		}
		if n := waitCount(func() uint64 { return refusedOf(plain, proxy.ReasonAuth) }, authBefore+1); n != authBefore+1 {
			t.Errorf("auth_failed %d, want %d", n, authBefore+1)
		}
		if n := refusedOf(plain, proxy.ReasonDstUnreachable); n != dialsBefore {
			t.Errorf("the proxy tried to connect for the attacker (dst_unreachable %d -> %d)", dialsBefore, n)
		}
		// The peer's own address gets the ready byte and its header is judged (here a
		// destination outside the tenant: refused without connecting; the in-process proxy's
		// own connections would leave from the test's namespace, not b's).
		before := refusedOf(plain, proxy.ReasonDstDenied)
		got, _ = ask(t, hPeer, must(socks5.Header{Dst: netip.MustParseAddrPort("10.99.0.99:5300")}.Append(nil)))
		if len(got) != 1 || got[0] != 0 {
			t.Errorf("from the peer's address: %q, want the ready byte", got)
		}
		if n := waitCount(func() uint64 { return refusedOf(plain, proxy.ReasonDstDenied) }, before+1); n != before+1 {
			t.Errorf("dst_not_allowed %d, want %d", n, before+1)
		}
	})

	t.Run("sourceless", func(t *testing.T) {
		blue.AllowSourceless = false
		if _, err := plain.Reload([]proxy.Tenant{blue}); err != nil {
			t.Fatal(err)
		}
		before := refusedOf(plain, proxy.ReasonNoSource)
		dialsBefore := refusedOf(plain, proxy.ReasonDstUnreachable)
		got, relayed := ask(t, hPeer, header)
		if relayed || len(got) > 1 {
			t.Errorf("a header without a source, from the peer: %q back, relayed %v", got, relayed)
		}
		if n := waitCount(func() uint64 { return refusedOf(plain, proxy.ReasonNoSource) }, before+1); n != before+1 {
			t.Errorf("no_source %d, want %d", n, before+1)
		}
		if n := refusedOf(plain, proxy.ReasonDstUnreachable); n != dialsBefore {
			t.Errorf("the proxy tried to connect from its own address (dst_unreachable %d -> %d)", dialsBefore, n)
		}
	})

	t.Run("socks-outsider", func(t *testing.T) {
		greet := []byte{socks5.Version, 1, socks5.MethodNoAuth}
		before := refusedOf(plain, proxy.ReasonSrcDenied)
		var got []byte
		c, err := dialFrom(ctx, a, hAttacker, hProxy+":1080")
		switch {
		case errors.Is(err, syscall.ECONNRESET): // reset before connect returned
		case err != nil:
			t.Fatal(err)
		default:
			c.SetDeadline(time.Now().Add(3 * time.Second))
			c.Write(greet)
			got, _ = io.ReadAll(c)
			c.Close()
		}
		if len(got) > 0 {
			t.Errorf("a SOCKS client outside the tenant got %x", got)
		}
		if n := waitCount(func() uint64 { return refusedOf(plain, proxy.ReasonSrcDenied) }, before+1); n != before+1 {
			t.Errorf("src_not_allowed %d, want %d", n, before+1)
		}
		// The allow-listed client is answered.
		c, err = dialFrom(ctx, a, hPeer, hProxy+":1080")
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write(greet)
		sel := make([]byte, 2)
		_, err = io.ReadFull(c, sel)
		c.Close()
		if err != nil || sel[0] != socks5.Version || sel[1] != socks5.MethodNoAuth {
			t.Errorf("the allowed SOCKS client: %x %v", sel, err)
		}
	})

	t.Run("reload-listeners", func(t *testing.T) {
		// The SOCKS listener moves: the old port stops answering, the new one serves, the peer
		// listener (same port) keeps its socket.
		moved := blue
		moved.Socks = netip.MustParseAddrPort(hProxy + ":1081")
		var ch proxy.Change
		err := b.NS.Do(func() error { // listeners open in the caller's namespace
			var err error
			ch, err = plain.Reload([]proxy.Tenant{moved})
			return err
		})
		if err != nil || fmt.Sprint(ch.TenantsChanged) != "[blue]" {
			t.Fatalf("reload: %v %v", ch, err)
		}
		if c, err := dialFrom(ctx, a, hPeer, hProxy+":1080"); err == nil {
			c.Close()
			t.Error("the old SOCKS port still accepts")
		}
		c, err := dialFrom(ctx, a, hPeer, hProxy+":1081")
		if err != nil {
			t.Fatalf("the new SOCKS port: %v", err)
		}
		c.Close()
		// A port that cannot be opened refuses the whole reload: nothing changes.
		busy, err := b.Listen("tcp", hProxy+":1082")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		worse := moved
		worse.Socks = netip.MustParseAddrPort(hProxy + ":1082")
		worse.Peers = nil
		if err := b.NS.Do(func() error { _, err := plain.Reload([]proxy.Tenant{worse}); return err }); err == nil {
			t.Fatal("a reload onto a port in use succeeded")
		}
		if c, err := dialFrom(ctx, a, hPeer, hProxy+":1081"); err != nil {
			t.Errorf("after a refused reload the SOCKS port is gone: %v", err)
		} else {
			c.Close()
		}
		if st := plain.Status(); len(st.Tenants) != 1 || len(st.Tenants[0].PoolReady) != 1 {
			t.Errorf("after a refused reload: %+v", st.Tenants)
		}
		if err := b.NS.Do(func() error { _, err := plain.Reload([]proxy.Tenant{blue}); return err }); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("unauthenticated-cap", func(t *testing.T) {
		key, _ := ident.Generate()
		farKey, _ := ident.Generate()
		cert, _ := ident.Certificate(key)
		farCert, _ := ident.Certificate(farKey)
		const max = 4
		enc := startProxy(t, b, proxy.Options{Pool: 0, HeaderTimeout: 3 * time.Second, DrainTimeout: time.Second, Cert: &cert, MaxUnauthenticated: max,
			Tenants: []proxy.Tenant{{Name: "green", Networks: []netip.Prefix{pf(hProxy + "/32")}, PeerPort: 7201,
				Peers: []proxy.Peer{{Name: "far", Key: farKey.Public(), Addrs: []netip.AddrPort{netip.MustParseAddrPort(hPeer + ":7201")}, Networks: []netip.Prefix{pf("10.50.0.0/16")}}}}}})
		var silent []net.Conn
		defer func() {
			for _, c := range silent {
				c.Close()
			}
		}()
		for range max {
			c, err := dialFrom(ctx, a, hAttacker, hProxy+":7201")
			if err != nil {
				t.Fatal(err)
			}
			silent = append(silent, c)
		}
		deadline := time.Now().Add(2 * time.Second)
		for enc.Status().Unauthenticated < max && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := enc.Status().Unauthenticated; n != max {
			t.Fatalf("unauthenticated %d, want %d", n, max)
		}
		// One more is reset at once, not held for the handshake timeout.
		start := time.Now()
		c, rerr := dialFrom(ctx, a, hAttacker, hProxy+":7201")
		switch {
		case errors.Is(rerr, syscall.ECONNRESET): // reset before connect returned
		case rerr != nil:
			t.Fatal(rerr)
		default:
			c.SetDeadline(time.Now().Add(5 * time.Second))
			_, rerr = c.Read(make([]byte, 1))
			c.Close()
		}
		if d := time.Since(start); rerr == nil || d > time.Second {
			t.Errorf("beyond the cap: read %v after %v, want a reset at once", rerr, d)
		}
		if n := refusedOf(enc, proxy.ReasonUnauthLimit); n != 1 {
			t.Errorf("unauth_limit %d, want 1", n)
		}
		// The real peer's address has a cap of its own: it is served while the flood holds
		// the other one full.
		peerReady := func(when string) {
			t.Helper()
			raw, err := dialFrom(ctx, a, hPeer, hProxy+":7201")
			if err != nil {
				t.Fatalf("the peer %s: %v", when, err)
			}
			defer raw.Close()
			raw.SetDeadline(time.Now().Add(3 * time.Second))
			tc := tls.Client(raw, ident.ClientConfig(farCert, key.Public()))
			ready := make([]byte, 1)
			if err := tc.Handshake(); err != nil {
				t.Fatalf("the peer's handshake %s: %v", when, err)
			}
			if _, err := io.ReadFull(tc, ready); err != nil || ready[0] != 0 {
				t.Errorf("the peer %s: %x %v", when, ready, err)
			}
		}
		peerReady("during the flood")
		if st := enc.Status(); st.Unauthenticated != max || st.UnauthenticatedPeers != 0 {
			t.Errorf("after the peer's connection: unauthenticated %d, from peers %d; want %d and 0", st.Unauthenticated, st.UnauthenticatedPeers, max)
		}
		// The flood ends; the real peer authenticates and gets the ready byte.
		for _, c := range silent {
			c.Close()
		}
		silent = nil
		deadline = time.Now().Add(2 * time.Second)
		for enc.Status().Unauthenticated > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		peerReady("after the flood")
		if n := enc.Status().Unauthenticated; n != 0 {
			t.Errorf("an authenticated peer still counted: unauthenticated %d", n)
		}
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
