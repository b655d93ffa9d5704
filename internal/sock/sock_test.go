package sock

import (
	"bytes"
	"net/netip"
	"testing"
	"time"
)

func listenLoop(t *testing.T) *Conn {
	t.Helper()
	c, err := Listen(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func addr(c *Conn) netip.AddrPort {
	return c.LocalAddr().(interface{ AddrPort() netip.AddrPort }).AddrPort()
}

// Ten datagrams leave in one SendSegments call and arrive as ten datagrams of the right sizes
// and contents, whether the receiver coalesces (one read, seg = 1000) or not (ten reads).
func TestSegmentsOverLoopback(t *testing.T) {
	for _, gro := range []bool{false, true} {
		tx, rx := listenLoop(t), listenLoop(t)
		if gro && !rx.EnableGRO() {
			t.Fatal("UDP_GRO refused")
		}
		var b []byte
		for i := range 10 {
			size := 1000
			if i == 9 {
				size = 321 // the last may be shorter
			}
			b = append(b, bytes.Repeat([]byte{byte(i + 1)}, size)...)
		}
		if err := tx.SendSegments(b, 1000, addr(rx)); err != nil {
			t.Fatal(err)
		}
		rx.SetReadDeadline(time.Now().Add(2 * time.Second))
		var got [][]byte
		buf, oob := make([]byte, 65536), make([]byte, 128)
		for total := 0; total < len(b); {
			n, seg, src, err := rx.ReadSegments(buf, oob)
			if err != nil {
				t.Fatalf("gro %v: after %d bytes: %v", gro, total, err)
			}
			if src != addr(tx) {
				t.Fatalf("source %v, want %v", src, addr(tx))
			}
			if !gro && n != seg {
				t.Fatalf("without GRO a read returned %d bytes of %d-byte segments", n, seg)
			}
			for off := 0; off < n; off += seg {
				got = append(got, bytes.Clone(buf[off:min(off+seg, n)]))
			}
			total += n
		}
		if len(got) != 10 {
			t.Fatalf("gro %v: %d datagrams, want 10", gro, len(got))
		}
		for i, d := range got {
			want := 1000
			if i == 9 {
				want = 321
			}
			if len(d) != want || d[0] != byte(i+1) || d[len(d)-1] != byte(i+1) {
				t.Fatalf("gro %v: datagram %d: %d bytes of %d", gro, i, len(d), d[0])
			}
		}
	}
}

// One datagram, or a segment size covering everything, is an ordinary send.
func TestSegmentsSingle(t *testing.T) {
	tx, rx := listenLoop(t), listenLoop(t)
	if err := tx.SendSegments([]byte("hello"), 1000, addr(rx)); err != nil {
		t.Fatal(err)
	}
	rx.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf, oob := make([]byte, 100), make([]byte, 128)
	n, seg, _, err := rx.ReadSegments(buf, oob)
	if err != nil || n != 5 || seg != 5 || string(buf[:n]) != "hello" {
		t.Fatalf("%d %d %v %q", n, seg, err, buf[:n])
	}
}
