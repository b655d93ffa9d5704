package app

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"braid/internal/experiment/federation"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/pmnl"
	"braid/internal/netconf"
	"braid/internal/proxy/ident"
	"braid/internal/traffic"
	"braid/internal/wire/socks5"
)

// originServer runs on host s: it tells each connection the address it came from, then echoes.
type originServer struct {
	accepted atomic.Int64
}

func (o *originServer) serve(t *testing.T, h *lab.Host, addr string) {
	ln, err := h.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			o.accepted.Add(1)
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s\n", c.RemoteAddr())
				io.Copy(c, c)
			}()
		}
	}()
}

// whoami connects through the proxies and returns the address the origin saw and the open
// connection.
func whoami(ctx context.Context, h *lab.Host, addr string) (string, net.Conn, error) {
	c, err := h.Dial(ctx, "tcp", addr)
	if err != nil {
		return "", nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return "", nil, err
	}
	c.SetDeadline(time.Time{})
	return strings.TrimSpace(line), c, nil
}

// whoamiFrom is whoami from the local address src.
func whoamiFrom(ctx context.Context, h *lab.Host, src, addr string) (string, net.Conn, error) {
	var c net.Conn
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	err := h.NS.Spawn(func() error {
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return "", nil, err
	}
	return strings.TrimSpace(line), c, nil
}

func refused(t *testing.T, ctx context.Context, h *lab.Host, reason string) uint64 {
	t.Helper()
	st, err := roles.ProxyStatus(ctx, h)
	if err != nil {
		t.Fatalf("status of %s: %v", h.Name, err)
	}
	var n uint64
	for _, tn := range st.Proxy.Tenants {
		n += tn.Refused[reason]
	}
	return n
}

// TestProxyLab runs two braid proxies between two sites joined by two uplinks and checks what a
// user would: bytes arrive intact both ways over IPv4 and IPv6, the server sees the client's
// own address, curl works through the SOCKS5 port, unauthenticated or misbehaving peers and
// other tenants are refused (and counted) while everyone else is served, each connection has a
// subflow per uplink pair, SIGTERM drains, and no rule survives the process (SIGKILL included,
// with --cleanup).
func TestProxyLab(t *testing.T) {
	labtest.Require(t)
	l := labtest.Up(t, federation.FederationTopology("proxy", true, topo.Shape{}, topo.Shape{}))
	c, p1h, p2h, s := l.Host("c"), l.Host("p1"), l.Host("p2"), l.Host("s")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	k1, k2, err := roles.ProxyKeys()
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	t.Setenv("BRAID_TEST_MAIN", "1") // the proxies and --cleanup run this binary as braid
	dir := t.TempDir()
	site1 := federation.FedSite{Side: 1, Links: 2, Key: k1, PeerKey: k2.Public(), Drain: 20 * time.Second}
	site2 := federation.FedSite{Side: 2, Links: 2, Key: k2, PeerKey: k1.Public()}
	p1, err := roles.StartProxy(p1h, self, dir, site1.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	p2, err := roles.StartProxy(p2h, self, dir, site2.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p1.Stop()
		p2.Stop()
		if t.Failed() {
			t.Logf("p1 log:\n%s\np2 log:\n%s", p1.Log(), p2.Log())
		}
	})
	if err := roles.WaitProxyPair(ctx, p1, p2, true, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	stop, err := kit.StartServer(ctx, s, federation.FedServer4+":5201")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	stop6, err := kit.StartServer(ctx, s, "["+federation.FedServer6+"]:5201")
	if err != nil {
		t.Fatal(err)
	}
	defer stop6()
	origin := &originServer{}
	origin.serve(t, s, federation.FedServer4+":5300")
	origin.serve(t, s, "["+federation.FedServer6+"]:5300")
	origin.serve(t, s, federation.FedServerRed+":5300")

	t.Run("intact", func(t *testing.T) {
		for _, tc := range []struct {
			addr string
			size int64
		}{
			{federation.FedServer4 + ":5201", 1 << 10},
			{"[" + federation.FedServer6 + "]:5201", 1 << 10},
			{federation.FedServer4 + ":5201", 32 << 20},
			{"[" + federation.FedServer6 + "]:5201", 32 << 20},
			{federation.FedServer4 + ":5201", 1 << 30},
			{"[" + federation.FedServer6 + "]:5201", 1 << 30},
		} {
			for _, rev := range []bool{false, true} {
				start := time.Now()
				r, err := traffic.File(ctx, c.Dial, tc.addr, traffic.FileOptions{Size: tc.size, Seed: uint64(tc.size), Reverse: rev})
				if err != nil {
					t.Fatalf("%s %d bytes reverse=%v: %v", tc.addr, tc.size, rev, err)
				}
				if !r.Intact {
					t.Errorf("%s: %v", tc.addr, r)
				}
				t.Logf("%s %v (%.1f s)", tc.addr, r, time.Since(start).Seconds())
			}
		}
	})

	t.Run("original-source", func(t *testing.T) {
		for _, tc := range []struct{ addr, want string }{
			{federation.FedServer4 + ":5300", federation.FedClient4},
			{"[" + federation.FedServer6 + "]:5300", federation.FedClient6},
			{"[" + federation.FedServer6 + "]:5300", federation.FedClient6},
		} {
			start := time.Now()
			seen, conn, err := whoami(ctx, c, tc.addr)
			if err != nil {
				t.Fatalf("%s: %v", tc.addr, err)
			}
			t.Logf("%s: the server saw %s (first byte after %v)", tc.addr, seen, time.Since(start))
			local := addrOf(conn.LocalAddr())
			conn.Close()
			if ap, err := netip.ParseAddrPort(seen); err != nil || ap.Addr().String() != tc.want || ap.Port() != local.Port() {
				t.Errorf("the server saw %s, the client is %s", seen, local)
			}
		}
	})

	t.Run("subflows", func(t *testing.T) {
		// A download long enough to look at: every uplink pair carries a subflow.
		done := make(chan error, 1)
		go func() {
			_, err := traffic.Bulk(ctx, c.Dial, federation.FedServer4+":5201", traffic.BulkOptions{Duration: 3 * time.Second, Reverse: true})
			done <- err
		}()
		var best int
		var unacked, inFlight bool // at the sender (p2), at the MPTCP level and on a subflow
		for deadline := time.Now().Add(2500 * time.Millisecond); time.Now().Before(deadline) && (best < 4 || !unacked || !inFlight); {
			time.Sleep(200 * time.Millisecond)
			st, err := roles.ProxyStatus(ctx, p1h)
			if err != nil {
				t.Fatal(err)
			}
			for _, cs := range st.Proxy.Connections {
				if cs.Role == "out" && cs.MPTCP {
					best = max(best, len(cs.Subflows))
				}
			}
			st, err = roles.ProxyStatus(ctx, p2h)
			if err != nil {
				t.Fatal(err)
			}
			for _, cs := range st.Proxy.Connections {
				if cs.Role != "in" || !cs.MPTCP || max(cs.BytesUp, cs.Down) < 1<<20 {
					continue // not the download's connection (a pooled one, the first bytes)
				}
				// A saturating sender has data not yet acknowledged, and acknowledgements
				// keep coming.
				unacked = unacked || cs.Unacked > 0 && cs.LastAck < time.Second
				for _, s := range cs.Subflows {
					inFlight = inFlight || s.Unacked > 0 && s.LastAck < time.Second
				}
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if best < 4 {
			t.Errorf("at most %d subflows on a connection, want 4 (2 uplinks at each site)", best)
		}
		if !unacked || !inFlight {
			t.Errorf("the sending proxy's status never showed the download's data in flight: MPTCP level %v, a subflow %v", unacked, inFlight)
		}
	})

	t.Run("half-close-and-reset", func(t *testing.T) {
		// A server that reads to the end of the request, answers, and closes; and one that
		// resets after reading a line.
		ln, err := s.Listen("tcp", federation.FedServer4+":5301")
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
				go func() {
					b, _ := io.ReadAll(c) // until the client's half-close
					fmt.Fprintf(c, "got %d bytes", len(b))
					c.Close()
				}()
			}
		}()
		rl, err := s.Listen("tcp", federation.FedServer4+":5302")
		if err != nil {
			t.Fatal(err)
		}
		defer rl.Close()
		go func() {
			for {
				c, err := rl.Accept()
				if err != nil {
					return
				}
				bufio.NewReader(c).ReadString('\n')
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		}()
		conn, err := c.Dial(ctx, "tcp", federation.FedServer4+":5301")
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write(make([]byte, 100000))
		conn.(*net.TCPConn).CloseWrite()
		reply, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || string(reply) != "got 100000 bytes" {
			t.Errorf("after a half-close: %q %v", reply, err)
		}
		conn, err = c.Dial(ctx, "tcp", federation.FedServer4+":5302")
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "hello\n")
		_, err = io.ReadAll(conn)
		conn.Close()
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the server's reset reached the client as %v, want ECONNRESET", err)
		}
	})

	t.Run("curl-socks5", func(t *testing.T) {
		ln, err := s.Listen("tcp", federation.FedServer4+":5400")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello %s\n", r.RemoteAddr)
		}))
		out, err := c.Run(ctx, "curl", "-sS", "--max-time", "10", "--socks5", federation.FedSocks, "http://"+federation.FedServer4+":5400/")
		if err != nil {
			t.Fatalf("curl: %v: %s", err, out)
		}
		if !strings.HasPrefix(string(out), "hello "+federation.FedClient4+":") {
			t.Errorf("curl got %q, want the server to see the client %s", out, federation.FedClient4)
		}
		// The same port refuses a destination of another tenant (red) with REP 0x02.
		out, err = c.Run(ctx, "curl", "-sS", "--max-time", "10", "--socks5", federation.FedSocks, "http://"+federation.FedServerRed+":5300/")
		if err == nil || !strings.Contains(string(out), "SOCKS5") {
			t.Errorf("curl to tenant red's network through blue's SOCKS port: %v %q, want a SOCKS refusal", err, out)
		}
	})

	t.Run("bad-peers", func(t *testing.T) {
		before := origin.accepted.Load()
		peerAddr := fmt.Sprintf("10.9.0.2:%d", federation.FedBluePeer)
		// A peer with a key p2 does not know.
		rogue, _ := ident.Generate()
		cert, _ := ident.Certificate(rogue)
		authBefore := refused(t, ctx, p2h, "auth_failed")
		raw, err := p1h.Dial(ctx, "tcp", peerAddr)
		if err != nil {
			t.Fatal(err)
		}
		raw.SetDeadline(time.Now().Add(5 * time.Second))
		tc := tls.Client(raw, ident.ClientConfig(cert, k2.Public()))
		err = tc.Handshake()
		if err == nil {
			b, _ := (socks5.Header{Dst: netip.MustParseAddrPort(federation.FedServer4 + ":5300"), Src: netip.MustParseAddrPort("10.1.0.1:40000")}).Append(nil)
			tc.Write(b)
			_, err = tc.Read(make([]byte, 1))
		}
		raw.Close()
		if err == nil {
			t.Error("a peer with an unknown key was served")
		}
		// Plaintext to an encrypted proxy.
		raw, err = p1h.Dial(ctx, "tcp", peerAddr)
		if err != nil {
			t.Fatal(err)
		}
		raw.SetDeadline(time.Now().Add(5 * time.Second))
		b, _ := (socks5.Header{Dst: netip.MustParseAddrPort(federation.FedServer4 + ":5300"), Src: netip.MustParseAddrPort("10.1.0.1:40001")}).Append(nil)
		raw.Write(b)
		n, _ := io.Copy(io.Discard, raw)
		raw.Close()
		if n > 7 { // at most a TLS alert
			t.Errorf("plaintext peer got %d bytes back", n)
		}
		deadline := time.Now().Add(3 * time.Second)
		for refused(t, ctx, p2h, "auth_failed") < authBefore+2 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if got := refused(t, ctx, p2h, "auth_failed"); got < authBefore+2 {
			t.Errorf("auth_failed %d, want at least %d", got, authBefore+2)
		}

		// With p1's own key (what a compromised or misconfigured peer could send): malformed,
		// unknown address types, another tenant's destination, a source outside the peer's
		// networks. Each is reset promptly and counted.
		myCert, _ := ident.Certificate(k1)
		for _, bad := range []struct {
			name, reason string
			bytes        []byte
		}{
			{"truncated", "malformed", []byte{socks5.DialectVersion, 19, socks5.AtypIPv4Source, 10, 2}},
			{"unknown atyp", "addr_type", []byte{socks5.DialectVersion, 9, 0x09, 10, 2, 0, 1, 0, 80}},
			{"socks5 request", "malformed", []byte{5, 1, 0, 1, 10, 2, 0, 1, 0, 80}},
			{"other tenant", "dst_not_allowed", must(socks5.Header{Dst: netip.MustParseAddrPort(federation.FedServerRed + ":5300"), Src: netip.MustParseAddrPort("10.1.0.1:40002")}.Append(nil))},
			{"foreign source", "src_not_allowed", must(socks5.Header{Dst: netip.MustParseAddrPort(federation.FedServer4 + ":5300"), Src: netip.MustParseAddrPort("192.0.2.1:40003")}.Append(nil))},
		} {
			before := refused(t, ctx, p2h, bad.reason)
			raw, err := p1h.Dial(ctx, "tcp", peerAddr)
			if err != nil {
				t.Fatal(err)
			}
			raw.SetDeadline(time.Now().Add(8 * time.Second))
			tc := tls.Client(raw, ident.ClientConfig(myCert, k2.Public()))
			if err := tc.Handshake(); err != nil {
				t.Fatalf("%s: handshake with the right key: %v", bad.name, err)
			}
			start := time.Now()
			tc.Write(bad.bytes)
			if bad.name == "truncated" {
				tc.CloseWrite()
			}
			got, _ := io.ReadAll(tc) // the ready byte, then the end
			raw.Close()
			if len(got) > 1 {
				t.Errorf("%s: %d bytes came back", bad.name, len(got))
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("%s: refused after %v", bad.name, d)
			}
			if n := refused(t, ctx, p2h, bad.reason); n != before+1 {
				t.Errorf("%s: %s count %d -> %d", bad.name, bad.reason, before, n)
			}
		}
		if n := origin.accepted.Load(); n != before {
			t.Errorf("the origin got %d connections from refused peers", n-before)
		}
		// Everyone else is still served.
		if seen, conn, err := whoami(ctx, c, federation.FedServer4+":5300"); err != nil {
			t.Errorf("after the bad peers: %v", err)
		} else {
			conn.Close()
			if !strings.HasPrefix(seen, federation.FedClient4+":") {
				t.Errorf("after the bad peers the server saw %s", seen)
			}
		}
	})

	t.Run("tenants", func(t *testing.T) {
		// Red reaches red.
		seen, conn, err := whoamiFrom(ctx, c, federation.FedClientRed, federation.FedServerRed+":5300")
		if err != nil {
			t.Fatalf("red to red: %v", err)
		}
		conn.Close()
		// The client's blue address is not intercepted for red's destination (no rule selects
		// it) and the sites have no other route: it cannot get there.
		if !strings.HasPrefix(seen, federation.FedClientRed+":") {
			t.Errorf("red: the server saw %s", seen)
		}
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(federation.FedClient4)}}
		err = c.NS.Spawn(func() error {
			cc, err := d.DialContext(dctx, "tcp", federation.FedServerRed+":5300")
			if err == nil {
				cc.Close()
			}
			return err
		})
		dcancel()
		if err == nil {
			t.Error("tenant blue's address reached tenant red's network")
		}
	})

	t.Run("drain", func(t *testing.T) {
		_, conn, err := whoami(ctx, c, federation.FedServer4+":5300")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := p1.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		// New connections are refused at once...
		start := time.Now()
		if _, c2, err := whoami(ctx, c, federation.FedServer4+":5300"); err == nil {
			c2.Close()
			t.Error("a new connection was relayed while draining")
		} else if d := time.Since(start); d > 2*time.Second {
			t.Errorf("a new connection was refused after %v", d)
		}
		// ...the one under way still works...
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte("still there\n")); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || line != "still there\n" {
			t.Fatalf("the connection under way: %q %v", line, err)
		}
		select {
		case <-p1.Done():
			t.Fatal("the proxy exited with a connection under way")
		default:
		}
		// ...and when it ends, the proxy exits cleanly and removes its rules.
		conn.Close()
		select {
		case <-p1.Done():
		case <-time.After(10 * time.Second):
			st, err := roles.ProxyStatus(ctx, p1h)
			if err == nil {
				for _, cs := range st.Proxy.Connections {
					t.Logf("still open: %+v", cs)
				}
			}
			t.Fatal("the proxy did not exit after its last connection")
		}
		if err := p1.Err(); err != nil {
			t.Errorf("exit: %v", err)
		}
		if left := leftovers(t, p1h); len(left) > 0 {
			t.Errorf("after a clean exit: %v", left)
		}
	})

	t.Run("sigkill-cleanup", func(t *testing.T) {
		if left := leftovers(t, p2h); len(left) == 0 {
			t.Fatal("the running proxy has no rules installed")
		}
		p2.Signal(syscall.SIGKILL)
		<-p2.Done()
		if left := leftovers(t, p2h); len(left) == 0 {
			t.Fatal("SIGKILL left nothing: the test would prove nothing")
		}
		out, err := p2h.Run(ctx, self, "proxy", "--cleanup", "--config", p2.File)
		if err != nil {
			t.Fatalf("--cleanup: %v: %s", err, out)
		}
		if !strings.Contains(string(out), "removed nftables table inet braid_proxy") {
			t.Errorf("--cleanup said %q", out)
		}
		if left := leftovers(t, p2h); len(left) > 0 {
			t.Errorf("after --cleanup: %v", left)
		}
	})
}

// TestProxyLabRedirectPlaintext runs the other interception mode (REDIRECT, the original
// destination from SO_ORIGINAL_DST) with plaintext between the proxies (splice on every copy)
// and the kernel's own path manager: bytes intact over IPv4 and IPv6, the client's address seen
// by the server, more than one subflow, a stopped peer refused at once, and nothing left
// (rules, routes, endpoints) after the proxies stop.
func TestProxyLabRedirectPlaintext(t *testing.T) {
	labtest.Require(t)
	l := labtest.Up(t, federation.FederationTopology("proxyr", true, topo.Shape{}, topo.Shape{}))
	c, p1h, p2h, s := l.Host("c"), l.Host("p1"), l.Host("p2"), l.Host("s")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	self, _ := os.Executable()
	t.Setenv("BRAID_TEST_MAIN", "1")
	dir := t.TempDir()
	p1, err := roles.StartProxy(p1h, self, dir, federation.FedSite{Side: 1, Links: 2, Plaintext: true, Mode: "redirect", PM: "kernel"}.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	p2, err := roles.StartProxy(p2h, self, dir, federation.FedSite{Side: 2, Links: 2, Plaintext: true, Mode: "redirect", PM: "kernel"}.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			p1.Stop()
			p2.Stop()
		}
		if t.Failed() {
			t.Logf("p1 log:\n%s\np2 log:\n%s", p1.Log(), p2.Log())
		}
	})
	if err := roles.WaitProxyPair(ctx, p1, p2, true, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	origin := &originServer{}
	origin.serve(t, s, federation.FedServer4+":5300")
	origin.serve(t, s, "["+federation.FedServer6+"]:5300")
	for _, addr := range []string{federation.FedServer4 + ":5201", "[" + federation.FedServer6 + "]:5201"} {
		stop, err := kit.StartServer(ctx, s, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		for _, rev := range []bool{false, true} {
			r, err := traffic.File(ctx, c.Dial, addr, traffic.FileOptions{Size: 64 << 20, Seed: 3, Reverse: rev})
			if err != nil {
				t.Fatalf("%s: %v", addr, err)
			}
			if !r.Intact {
				t.Errorf("%s: %v", addr, r)
			}
			t.Logf("%s: %v", addr, r)
		}
	}
	for _, tc := range []struct{ addr, want string }{
		{federation.FedServer4 + ":5300", federation.FedClient4},
		{"[" + federation.FedServer6 + "]:5300", federation.FedClient6},
	} {
		seen, conn, err := whoami(ctx, c, tc.addr)
		if err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		conn.Close()
		if ap, err := netip.ParseAddrPort(seen); err != nil || ap.Addr().String() != tc.want {
			t.Errorf("%s: the server saw %s, want %s", tc.addr, seen, tc.want)
		}
	}
	// The kernel's path manager adds subflows from the endpoints and announced addresses.
	_, conn, err := whoami(ctx, c, federation.FedServer4+":5300")
	if err != nil {
		t.Fatal(err)
	}
	best := 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && best < 2; time.Sleep(100 * time.Millisecond) {
		st, err := roles.ProxyStatus(ctx, p1h)
		if err != nil {
			t.Fatal(err)
		}
		for _, cs := range st.Proxy.Connections {
			best = max(best, len(cs.Subflows))
		}
	}
	conn.Close()
	if best < 2 {
		t.Errorf("kernel path manager: at most %d subflows", best)
	}
	// An unreachable peer: p2 stops; a client of p1 is refused at once and p1 counts it.
	stopped = true
	if err := p2.Stop(); err != nil {
		t.Errorf("p2: exit %v", err)
	}
	start := time.Now()
	if _, c2, err := whoami(ctx, c, federation.FedServer4+":5300"); err == nil {
		c2.Close()
		t.Error("a connection was relayed to a stopped peer")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("refused after %v", d)
	}
	if n := refused(t, ctx, p1h, "peer_unreachable"); n == 0 {
		t.Error("peer_unreachable not counted")
	}
	for _, p := range []*roles.ProxyProc{p1, p2} {
		if err := p.Stop(); err != nil {
			t.Errorf("%s: exit %v", p.Host.Name, err)
		}
		if left := leftovers(t, p.Host); len(left) > 0 {
			t.Errorf("%s: left %v", p.Host.Name, left)
		}
		pc, err := pmnl.Dial(pmnl.Options{NetNS: p.Host.NS.Handle()})
		if err != nil {
			t.Fatal(err)
		}
		eps, err := pc.Endpoints(ctx)
		pc.Close()
		if err != nil || len(eps) > 0 {
			t.Errorf("%s: endpoints left: %v %v", p.Host.Name, eps, err)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func addrOf(a net.Addr) netip.AddrPort {
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func leftovers(t *testing.T, h *lab.Host) []string {
	t.Helper()
	var out []string
	err := h.NS.Do(func() error {
		var err error
		out, err = netconf.Leftovers(0x1b5, 4755)
		return err
	})
	if err != nil && !errors.Is(err, netconf.ErrNoNft) {
		t.Fatal(err)
	}
	return out
}
