package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a stream socketpair: a connection with half-close and no
// network.
func pair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

func testConn() *conn {
	return &conn{t: &tenant{c: newCounters()}}
}

// End of stream travels as a half-close: each side can still send after the other finished.
func TestRelayHalfClose(t *testing.T) {
	client, s := pair(t)
	m, peer := pair(t)
	c := testConn()
	done := make(chan struct{})
	go func() { relay(c, s, m); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	client.SetDeadline(deadline)
	peer.SetDeadline(deadline)

	client.Write([]byte("request"))
	client.(*net.UnixConn).CloseWrite()
	got, err := io.ReadAll(peer) // ends: the client's FIN came through
	if err != nil || string(got) != "request" {
		t.Fatalf("peer read %q, %v", got, err)
	}
	peer.Write([]byte("a longer response"))
	peer.(*net.UnixConn).CloseWrite()
	got, err = io.ReadAll(client)
	if err != nil || string(got) != "a longer response" {
		t.Fatalf("client read %q, %v", got, err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("relay did not end after both directions ended")
	}
	if c.up.Load() != 7 || c.down.Load() != 17 {
		t.Errorf("counted up %d down %d, want 7 and 17", c.up.Load(), c.down.Load())
	}
}

// failingConn fails its reads with a reset.
type failingConn struct{ net.Conn }

func (failingConn) Read([]byte) (int, error) { return 0, syscall.ECONNRESET }

// An error on one side ends both: the other end's read ends instead of waiting forever.
func TestRelayErrorEndsBoth(t *testing.T) {
	_, s := pair(t)
	m, peer := pair(t)
	c := testConn()
	done := make(chan struct{})
	go func() { relay(c, failingConn{s}, m); close(done) }()
	peer.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(peer); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the peer side stayed open after the client side failed")
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("relay did not return")
	}
	if !c.closed.Load() {
		t.Error("the connection was not marked closed")
	}
}

func TestReadyReader(t *testing.T) {
	a, b := pair(t)
	var refused atomic.Int32
	r := &readyReader{Conn: a, onRefused: func() { refused.Add(1) }}
	b.Write([]byte{readyByte, 'x', 'y'})
	buf := make([]byte, 8)
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "xy" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	// A peer that closes before accepting is a refusal, reported once.
	c, d := pair(t)
	r = &readyReader{Conn: c, onRefused: func() { refused.Add(1) }}
	d.Close()
	for range 2 {
		if _, err := r.Read(buf); !errors.Is(err, errPeerRefused) {
			t.Errorf("read after refusal: %v", err)
		}
	}
	if refused.Load() != 1 {
		t.Errorf("refusals counted %d, want 1", refused.Load())
	}
}

func TestRouteLongestPrefix(t *testing.T) {
	pf := netip.MustParsePrefix
	t1 := &tenantState{}
	wide := &peer{Peer: Peer{Name: "wide", Networks: []netip.Prefix{pf("10.0.0.0/8")}}}
	narrow := &peer{Peer: Peer{Name: "narrow", Networks: []netip.Prefix{pf("10.2.0.0/16"), pf("fd02::/64")}}}
	t1.peers = []*peer{wide, narrow}
	for _, tc := range []struct {
		addr string
		want *peer
	}{{"10.2.3.4", narrow}, {"10.3.0.1", wide}, {"fd02::1", narrow}, {"192.0.2.1", nil}, {"fd03::1", nil}} {
		if got := t1.route(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("route(%s) = %v", tc.addr, got)
		}
	}
}

// A destination's first bytes and what follows them closely leave in one write; what comes
// after a gap is written apart.
func TestCopyFirstGathers(t *testing.T) {
	srcW, src := pair(t)
	dst, dstR := pair(t)
	go func() {
		srcW.Write([]byte{1})
		for t := time.Now(); time.Since(t) < 150*time.Microsecond; {
		} // a timer this short can sleep a millisecond
		srcW.Write(make([]byte, 64))
		time.Sleep(20 * time.Millisecond)
		srcW.Write([]byte{2})
	}()
	var n atomic.Uint64
	start := time.Now()
	if err := copyFirst(dst, src, &n); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Millisecond {
		t.Errorf("copyFirst took %v, waited for the late byte", took)
	}
	if n.Load() != 65 {
		t.Fatalf("first write carried %d bytes, want 65", n.Load())
	}
	buf := make([]byte, 128)
	dstR.SetReadDeadline(time.Now().Add(time.Second))
	if k, err := io.ReadAtLeast(dstR, buf, 65); err != nil || k != 65 {
		t.Fatalf("read %d, %v; want 65 bytes", k, err)
	}
	// The deadline is cleared: the byte 20 ms later is read.
	if k, err := src.Read(buf); err != nil || k != 1 || buf[0] != 2 {
		t.Fatalf("then read %d, %v", k, err)
	}
}
