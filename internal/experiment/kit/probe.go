package kit

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"time"

	"braid/internal/lab"
)

// EchoServer answers every UDP datagram to addr inside host h with the same bytes, until stop.
func EchoServer(h *lab.Host, addr string) (stop func(), err error) {
	pc, err := h.ListenPacket("udp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		buf := make([]byte, 64)
		for {
			n, src, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], src)
		}
	}()
	return func() { pc.Close() }, nil
}

// Ping sends a UDP echo request every 10 ms from host from to the echo server it runs in host
// to (on addr, port 7) for d, and returns the longest time without a reply.
func Ping(ctx context.Context, from, to *lab.Host, addr netip.Addr, d time.Duration) (time.Duration, error) {
	dst := netip.AddrPortFrom(addr, 7).String()
	stop, err := EchoServer(to, dst)
	if err != nil {
		return 0, err
	}
	defer stop()
	c, err := from.Dial(ctx, "udp", dst)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	got := make(chan time.Time, 1024)
	go func() {
		defer close(got)
		buf := make([]byte, 64)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			got <- time.Now()
		}
	}()
	start := time.Now()
	last := start
	var worst time.Duration
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < d {
		select {
		case at, ok := <-got:
			if ok {
				worst = max(worst, at.Sub(last))
				last = at
			}
		case <-tick.C:
			c.Write([]byte("ping"))
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return max(worst, time.Since(last)), nil
}

// UDPIntegrity sends n datagrams of size bytes with pseudo-random content from host from to an
// echo server in host to (addr, port 7), and reports how many came back and how many of those
// came back changed: the content of datagram i is derived from i, so each echo is checked whole.
func UDPIntegrity(ctx context.Context, from, to *lab.Host, addr netip.Addr, n, size int) (echoed, corrupt int, err error) {
	dst := netip.AddrPortFrom(addr, 7).String()
	pc, err := to.ListenPacket("udp", dst)
	if err != nil {
		return 0, 0, err
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 65536)
		for {
			k, src, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:k], src)
		}
	}()
	c, err := from.Dial(ctx, "udp", dst)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	payload := func(i uint32, b []byte) {
		x := uint64(i)*0x9e3779b97f4a7c15 + 1
		for j := range b {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			b[j] = byte(x)
		}
		binary.BigEndian.PutUint32(b, i)
	}
	seen := make([]bool, n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf, want := make([]byte, 65536), make([]byte, size)
		c.SetReadDeadline(time.Now().Add(time.Duration(n)*time.Millisecond + 5*time.Second))
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			if k < 4 {
				corrupt++
				continue
			}
			i := binary.BigEndian.Uint32(buf)
			payload(i, want)
			if int(i) >= n || k != size || !bytes.Equal(buf[:k], want) {
				corrupt++
				continue
			}
			if !seen[i] {
				seen[i] = true
				echoed++
			}
			if echoed == n {
				return
			}
		}
	}()
	out := make([]byte, size)
	for i := range n {
		payload(uint32(i), out)
		c.Write(out)
		if i%2 == 1 {
			time.Sleep(time.Millisecond) // two datagrams a millisecond at most: below the links' rate
		}
	}
	<-done
	return echoed, corrupt, nil
}
