package traffic

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*want }

func TestBulkLoopback(t *testing.T) {
	srv := startServer(t)
	for _, tc := range []struct {
		name    string
		reverse bool
		streams int
	}{{"upload", false, 1}, {"download", true, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			var live []Sample
			begin := time.Now()
			res, err := Bulk(t.Context(), NetDial, srv.addr, BulkOptions{
				Duration: time.Second, Interval: 250 * time.Millisecond,
				Reverse: tc.reverse, Streams: tc.streams,
				OnSample: func(s Sample) { live = append(live, s) },
			})
			took := time.Since(begin)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res)
			if res.Goodput <= 0 || res.Bytes <= 0 || res.Steady <= 0 {
				t.Errorf("goodput %v, bytes %d, steady %v", res.Goodput, res.Bytes, res.Steady)
			}
			if len(res.Samples) != 4 || len(live) != 4 {
				t.Fatalf("%d samples, %d seen live; want 4", len(res.Samples), len(live))
			}
			for i, s := range res.Samples {
				if want := time.Duration(i+1) * 250 * time.Millisecond; s.At != want || live[i] != s {
					t.Errorf("sample %d = %+v (live %+v), want At %v", i, s, live[i], want)
				}
			}
			var n int64
			for _, s := range res.Samples {
				n += s.Bytes
				if s.Bytes <= 0 || s.Duration <= 0 || math.Abs(bitsPerSecond(s.Bytes, s.Duration)-s.BitsPerSecond) > 1 {
					t.Errorf("sample %+v: its bytes and duration do not give its rate", s)
				}
			}
			if n > res.Bytes || n < res.Bytes*9/10 {
				t.Errorf("samples hold %d bytes of the %d received", n, res.Bytes)
			}
			if res.MeanAfter(0) <= 0 {
				t.Errorf("MeanAfter(0) = %v", res.MeanAfter(0))
			}
			if res.Duration < time.Second || res.Duration > 1200*time.Millisecond {
				t.Errorf("measured duration %v", res.Duration)
			}
			if took > 3*time.Second {
				t.Errorf("bulk of 1 s took %v", took)
			}
			if !strings.HasPrefix(res.String(), "bulk "+tc.name+": ") {
				t.Errorf("String() = %q", res)
			}
		})
	}
}

// A relay that forwards at 20 Mbit/s proves the meter: the measured goodput must match.
func TestBulkRateLimited(t *testing.T) {
	srv := startServer(t)
	const rate = 20e6
	relay := startTCPRelay(t, srv.addr, rate, -1)
	for _, reverse := range []bool{false, true} {
		res, err := Bulk(t.Context(), NetDial, relay, BulkOptions{Duration: 2 * time.Second, Interval: 500 * time.Millisecond, Reverse: reverse})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res)
		if !within(res.Goodput, rate, 0.10) || !within(res.Steady, rate, 0.10) {
			t.Errorf("reverse=%v: goodput %s, steady %s; want %s ± 10%%", reverse,
				formatBits(res.Goodput), formatBits(res.Steady), formatBits(rate))
		}
	}
}

func TestUDPLoopback(t *testing.T) {
	srv := startServer(t)
	const rate = 20e6
	res, err := UDP(t.Context(), NetDial, srv.addr, UDPOptions{Rate: rate, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	// (1200+28)*8 bits per datagram at 20 Mbit/s: about 2036 datagrams in a second.
	if res.Sent < 1900 || res.Sent > 2100 {
		t.Errorf("sent %d datagrams", res.Sent)
	}
	if res.LossPercent > 0.5 || res.Duplicates != 0 {
		t.Errorf("loss %.2f%%, %d duplicates", res.LossPercent, res.Duplicates)
	}
	if !within(res.Rate, rate, 0.05) {
		t.Errorf("achieved %s, want %s ± 5%%", formatBits(res.Rate), formatBits(rate))
	}
	if res.Jitter <= 0 || res.Jitter > 50*time.Millisecond {
		t.Errorf("jitter %v", res.Jitter)
	}
}

func TestUDPRelayDrop(t *testing.T) {
	srv := startServer(t)
	relay := startUDPRelay(t, srv.addr, "drop10")
	res, err := UDP(t.Context(), NetDial, srv.addr, UDPOptions{Rate: 10e6, Duration: time.Second, DataAddr: relay})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if math.Abs(res.LossPercent-10) > 1 {
		t.Errorf("loss %.2f%%, want 10 ± 1", res.LossPercent)
	}
	if res.Reordered != 0 || res.Duplicates != 0 {
		t.Errorf("reordered %d, duplicates %d", res.Reordered, res.Duplicates)
	}
}

func TestUDPRelaySwap(t *testing.T) {
	srv := startServer(t)
	relay := startUDPRelay(t, srv.addr, "swap")
	res, err := UDP(t.Context(), NetDial, srv.addr, UDPOptions{Rate: 5e6, Size: 500, Duration: 500 * time.Millisecond, DataAddr: relay})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Reordered < res.Sent/2-2 || res.Lost != 0 {
		t.Errorf("reordered %d of %d, lost %d", res.Reordered, res.Sent, res.Lost)
	}
}

func TestUDPSendLoopDoesNotAllocate(t *testing.T) {
	sink, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	c, err := net.Dial("udp", sink.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	sendPaced(t.Context(), c, buf, 1e5, 10*time.Millisecond) // warm up
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	sent, _, err := sendPaced(t.Context(), c, buf, 2e4, 200*time.Millisecond)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if allocs := after.Mallocs - before.Mallocs; sent < 1000 || allocs > uint64(sent)/20 {
		t.Errorf("%d allocations for %d datagrams", allocs, sent)
	}
}

func TestRR(t *testing.T) {
	srv := startServer(t)
	for _, newConn := range []bool{false, true} {
		res, err := RR(t.Context(), NetDial, srv.addr, RROptions{Count: 50, NewConn: newConn, RequestSize: 100, ResponseSize: 2000})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res)
		if len(res.Samples) != 50 {
			t.Fatalf("%d samples", len(res.Samples))
		}
		if !(0 < res.Min && res.Min <= res.Median && res.Median <= res.P90 && res.P90 <= res.P99 && res.P99 <= res.Max) {
			t.Errorf("statistics out of order: %v", res)
		}
		if res.Mean < res.Min || res.Mean > res.Max {
			t.Errorf("mean %v outside [%v, %v]", res.Mean, res.Min, res.Max)
		}
	}
}

func TestFile(t *testing.T) {
	srv := startServer(t)
	const size = 10 << 20
	for _, reverse := range []bool{false, true} {
		res, err := File(t.Context(), NetDial, srv.addr, FileOptions{Size: size, Seed: 7, Reverse: reverse})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res)
		if !res.Intact || res.Bytes != size || res.SentSHA256 != res.ReceivedSHA256 || res.Duration <= 0 {
			t.Errorf("reverse=%v: %+v", reverse, res)
		}
	}
	// The same seed gives the same content both ways; another seed does not.
	up, _ := File(t.Context(), NetDial, srv.addr, FileOptions{Size: 1 << 20, Seed: 1})
	down, _ := File(t.Context(), NetDial, srv.addr, FileOptions{Size: 1 << 20, Seed: 1, Reverse: true})
	other, _ := File(t.Context(), NetDial, srv.addr, FileOptions{Size: 1 << 20, Seed: 2})
	if up.SentSHA256 != down.SentSHA256 || up.SentSHA256 == other.SentSHA256 {
		t.Errorf("content is not a function of the seed: %v %v %v", up.SentSHA256, down.SentSHA256, other.SentSHA256)
	}
}

// One flipped byte must be caught.
func TestFileCorrupted(t *testing.T) {
	srv := startServer(t)
	relay := startTCPRelay(t, srv.addr, 0, 3<<20)
	for _, reverse := range []bool{false, true} {
		res, err := File(t.Context(), NetDial, relay, FileOptions{Size: 10 << 20, Reverse: reverse})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res)
		if res.Intact || res.Bytes != 10<<20 || res.SentSHA256 == res.ReceivedSHA256 {
			t.Errorf("reverse=%v: corruption not detected: %+v", reverse, res)
		}
		if !strings.Contains(res.String(), "CORRUPT") {
			t.Errorf("String() = %q", res)
		}
	}
}

func TestStreamDoesNotRepeat(t *testing.T) {
	b := make([]byte, 1<<20)
	newStream(1).Read(b)
	for _, period := range []int{1, 2, 4, 8, 16, 64, 4096, 65536} {
		if string(b[:4096]) == string(b[period:period+4096]) {
			t.Fatalf("stream repeats with period %d", period)
		}
	}
}

func TestGarbageHeaders(t *testing.T) {
	srv := startServer(t, WithHeaderTimeout(300*time.Millisecond))
	good, _ := AppendHeader(nil, Header{Mode: ModeRR, Size: 1, ResponseSize: 1})
	badVersion := append([]byte(nil), good...)
	badVersion[4] = 9
	inputs := [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: example\r\n\r\n"), // foreign protocol: turned away at the magic
		[]byte("BRTF\x01"), // truncated: turned away at the header timeout
		badVersion,         // unknown version
		append([]byte("BRTF"), make([]byte, HeaderLen-4)...),                                             // all zero
		(func() []byte { h, _ := AppendHeader(nil, Header{Mode: ModeBulkData, TestID: 5}); return h })(), // unknown test
	}
	for i, in := range inputs {
		c, err := net.Dial("tcp", srv.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(in)
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil || len(b) != 1 || b[0] == byte(statusOK) {
			t.Errorf("input %d: server answered %x, %v; want one rejection byte and EOF", i, b, err)
		}
	}
	if st := srv.Stats(); st.Rejected != int64(len(inputs)) || st.Accepted != int64(len(inputs)) {
		t.Errorf("stats %+v, want %d rejected", st, len(inputs))
	}
	res, err := RR(t.Context(), NetDial, srv.addr, RROptions{Count: 5})
	if err != nil || len(res.Samples) != 5 {
		t.Fatalf("server no longer serves: %v, %v", res, err)
	}
	// wait for the RR connection's handler to finish
	for deadline := time.Now().Add(2 * time.Second); srv.Stats().Active != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if st := srv.Stats(); st.Active != 0 || st.Rejected != int64(len(inputs)) {
		t.Errorf("stats after RR %+v", st)
	}
}

func TestCloseDuringBulk(t *testing.T) {
	for _, reverse := range []bool{false, true} {
		srv := startServer(t)
		errc := make(chan error, 1)
		go func() {
			_, err := Bulk(t.Context(), NetDial, srv.addr, BulkOptions{Duration: 10 * time.Second, Reverse: reverse})
			errc <- err
		}()
		time.Sleep(300 * time.Millisecond)
		begin := time.Now()
		srv.stop(t)
		select {
		case err := <-errc:
			if err == nil || !strings.HasPrefix(err.Error(), "traffic: ") {
				t.Errorf("reverse=%v: Bulk returned %v, want a traffic error", reverse, err)
			}
			t.Logf("reverse=%v: after %v: %v", reverse, time.Since(begin), err)
		case <-time.After(5 * time.Second):
			t.Fatalf("reverse=%v: Bulk still running 5 s after Close", reverse)
		}
	}
}

func TestContextCancel(t *testing.T) {
	srv := startServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err := Bulk(ctx, NetDial, srv.addr, BulkOptions{Duration: 10 * time.Second})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(begin) > 2*time.Second {
		t.Errorf("Bulk after %v: %v", time.Since(begin), err)
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	_, err = UDP(ctx2, NetDial, srv.addr, UDPOptions{Rate: 1e6, Duration: 10 * time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("UDP: %v", err)
	}
}

// A peer that accepts and then says nothing must not hang a client beyond its timeouts.
func TestSilentPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err = RR(ctx, NetDial, ln.Addr().String(), RROptions{Count: 1})
	if err == nil || time.Since(begin) > 2*time.Second {
		t.Errorf("RR against a silent peer: %v after %v", err, time.Since(begin))
	}
}

func TestServeStopsOnContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ln, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	if _, err := RR(t.Context(), NetDial, ln.Addr().String(), RROptions{Count: 3}); err != nil {
		t.Fatal(err)
	}
	// a UDP test is refused without a UDP socket
	if _, err := UDP(t.Context(), NetDial, ln.Addr().String(), UDPOptions{Duration: 100 * time.Millisecond}); err == nil {
		t.Error("UDP test accepted by a server without a UDP socket")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Serve = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		srv := startServer(t)
		ctx := t.Context()
		if _, err := Bulk(ctx, NetDial, srv.addr, BulkOptions{Duration: 200 * time.Millisecond, Interval: 100 * time.Millisecond, Streams: 2}); err != nil {
			t.Fatal(err)
		}
		if _, err := Bulk(ctx, NetDial, srv.addr, BulkOptions{Duration: 200 * time.Millisecond, Reverse: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := UDP(ctx, NetDial, srv.addr, UDPOptions{Duration: 200 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if _, err := RR(ctx, NetDial, srv.addr, RROptions{Count: 10, NewConn: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := File(ctx, NetDial, srv.addr, FileOptions{Size: 1 << 20, Reverse: true}); err != nil {
			t.Fatal(err)
		}
		srv.stop(t)
	}()
	var now int
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if now = runtime.NumGoroutine(); now <= before {
			return
		}
	}
	buf := make([]byte, 1<<20)
	t.Errorf("goroutines: %d before, %d after\n%s", before, now, buf[:runtime.Stack(buf, true)])
}

// A second that reads short because a loss held the receiver's data back, followed by seconds
// that catch up, lifts the median of the samples above the link's rate; the bytes over the time
// of the samples after the start do not.
func TestMeanAfterCancelsCatchUp(t *testing.T) {
	var r BulkResult
	for _, mbit := range []float64{13.8, 17.0, 20.1, 20.1, 19.6} {
		n := int64(mbit * 1e6 / 8)
		r.Samples = append(r.Samples, Sample{BitsPerSecond: mbit * 1e6, Bytes: n, Duration: time.Second})
	}
	if got, want := r.MeanAfter(1), 19.2e6; math.Abs(got-want) > 1 {
		t.Errorf("MeanAfter(1) = %.0f bit/s, want %.0f", got, want)
	}
	v := []float64{17.0e6, 20.1e6, 20.1e6, 19.6e6}
	if m := median(v); m <= r.MeanAfter(1) {
		t.Errorf("the median %.0f should read above the mean %.0f here", m, r.MeanAfter(1))
	}
	if got := r.MeanAfter(5); got != 0 {
		t.Errorf("MeanAfter past the samples = %v, want 0", got)
	}
	if got, want := r.MeanAfter(0), 18.12e6; math.Abs(got-want) > 1 {
		t.Errorf("MeanAfter(0) = %.0f bit/s, want %.0f", got, want)
	}
}
