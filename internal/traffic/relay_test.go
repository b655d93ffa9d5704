package traffic

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// testServer is a Server on 127.0.0.1 with its TCP listener and UDP socket on the same port.
type testServer struct {
	*Server
	addr    string
	serveCh chan error
}

func startServer(t *testing.T, opts ...ServerOption) *testServer {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	for try := 0; ; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		p, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			ln, pc = l, p
			break
		}
		l.Close()
		if try > 20 {
			t.Fatal(err)
		}
	}
	s := &testServer{Server: NewServer(ln, pc, opts...), addr: ln.Addr().String(), serveCh: make(chan error, 1)}
	go func() { s.serveCh <- s.Serve(context.Background()) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop closes the server and waits for Serve; it may be called more than once.
func (s *testServer) stop(t *testing.T) {
	t.Helper()
	s.Close()
	select {
	case err, ok := <-s.serveCh:
		if ok {
			close(s.serveCh)
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
}

// bucket is a token bucket: wait(n) returns when n more bytes may pass at rate bytes/s.
type bucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func newBucket(bitsPerSecond float64) *bucket {
	b := &bucket{rate: bitsPerSecond / 8, burst: 16 << 10, last: time.Now()}
	b.tokens = b.burst
	return b
}

func (b *bucket) wait(n int) {
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= float64(n)
	if b.tokens < 0 {
		time.Sleep(time.Duration(-b.tokens / b.rate * float64(time.Second)))
	}
}

// tcpRelay forwards every connection accepted on its own loopback port to target. Each direction
// of each connection is limited to rate bit/s (0: unlimited); if flipAt >= 0, the byte at that
// offset of each direction is inverted.
type tcpRelay struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	rate   float64
	flipAt int64
	target string
}

func startTCPRelay(t *testing.T, target string, rate float64, flipAt int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &tcpRelay{ln: ln, rate: rate, flipAt: flipAt, target: target}
	r.wg.Go(r.accept)
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return ln.Addr().String()
}

func (r *tcpRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns = append(r.conns, c)
	return true
}

func (r *tcpRelay) accept() {
	for {
		a, err := r.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", r.target)
		if err != nil {
			a.Close()
			continue
		}
		r.track(a)
		r.track(b)
		r.wg.Go(func() { r.copy(b, a) })
		r.wg.Go(func() { r.copy(a, b) })
	}
}

// copy forwards src to dst; EOF is passed on as a half-close, an error closes both.
func (r *tcpRelay) copy(dst, src net.Conn) {
	var bk *bucket
	if r.rate > 0 {
		bk = newBucket(r.rate)
	}
	buf := make([]byte, 8<<10)
	var off int64
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if r.flipAt >= off && r.flipAt < off+int64(n) {
				buf[r.flipAt-off] ^= 0xff
			}
			off += int64(n)
			if bk != nil {
				bk.wait(n)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				dst.Close()
				src.Close()
				return
			}
		}
		if err != nil {
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				tc.CloseWrite()
				return
			}
			dst.Close()
			src.Close()
			return
		}
	}
}

// udpRelay forwards datagrams from its own loopback port to target, transforming the sequence:
// "drop10" drops every 10th datagram, "swap" exchanges adjacent pairs.
func startUDPRelay(t *testing.T, target, mode string) string {
	t.Helper()
	in, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	out, err := net.Dial("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64<<10)
		var held []byte
		for count := 1; ; {
			in.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			n, _, err := in.ReadFrom(buf)
			if err != nil {
				if isTimeout(err) {
					if held != nil {
						out.Write(held)
						held = nil
					}
					continue
				}
				return
			}
			switch mode {
			case "drop10":
				if count%10 != 0 {
					out.Write(buf[:n])
				}
			case "swap":
				if held == nil {
					held = append([]byte(nil), buf[:n]...)
				} else {
					out.Write(buf[:n])
					out.Write(held)
					held = nil
				}
			default:
				out.Write(buf[:n])
			}
			count++
		}
	})
	t.Cleanup(func() {
		in.Close()
		wg.Wait()
		out.Close()
	})
	return in.LocalAddr().String()
}
