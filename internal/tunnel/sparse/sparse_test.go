package sparse

import (
	"encoding/binary"
	"testing"
)

// ip4 builds an IPv4 packet of size bytes from src to dst with protocol proto and, for TCP
// and UDP, ports sport and dport.
func ip4(src, dst byte, proto byte, sport, dport uint16, size int) []byte {
	b := make([]byte, size)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(size))
	b[9] = proto
	copy(b[12:], []byte{10, 0, 0, src})
	copy(b[16:], []byte{10, 0, 1, dst})
	if size >= 24 {
		binary.BigEndian.PutUint16(b[20:], sport)
		binary.BigEndian.PutUint16(b[22:], dport)
	}
	return b
}

const ms = int64(1e6)

// A ping every 10 ms stays sparse; a bulk flow beside it is dense after its first packets,
// and does not take the ping's treatment away.
func TestPingSparseBesideBulk(t *testing.T) {
	var m Meter
	ping := ip4(1, 2, 1, 0, 0, 84)
	bulk := ip4(1, 2, 6, 40000, 5201, 1500)
	now := int64(1)
	dense := 0
	for i := range 1000 { // 10 s
		for range 8 { // 9.6 Mbit/s
			if !m.Sparse(now, bulk) {
				dense++
			}
		}
		if !m.Sparse(now, ping) {
			t.Fatalf("ping %d at %d ms not sparse", i, now/ms)
		}
		now += 10 * ms
	}
	if dense < 8000-4 {
		t.Errorf("the bulk flow was sparse for %d of 8000 packets, want at most its burst (3)", 8000-dense)
	}
}

// A flow that goes over Rate becomes dense, and sparse again once it has been quiet long
// enough to repay its debt.
func TestDenseThenQuiet(t *testing.T) {
	var m Meter
	p := ip4(1, 2, 17, 5000, 53, 1000)
	now := int64(1)
	for i := range 4 {
		if !m.Sparse(now, p) {
			t.Fatalf("packet %d of the first burst not sparse", i)
		}
	}
	if m.Sparse(now, p) {
		t.Fatal("the fifth 1000-byte packet at once is still sparse (burst 4500)")
	}
	now += 100 * ms
	if m.Sparse(now, p) {
		t.Fatal("sparse again after 100 ms, with its debt not repaid")
	}
	now += 2 * Burst * 1e9 / Rate
	if !m.Sparse(now, p) {
		t.Fatal("still dense after a quiet 2×Burst/Rate")
	}
}

// Flows are told apart by their ports: a dense flow does not make another flow between the
// same hosts dense.
func TestFlowsApartByPorts(t *testing.T) {
	var m Meter
	now := int64(1)
	a, b := ip4(1, 2, 6, 1000, 22, 1500), ip4(1, 2, 6, 1001, 22, 100)
	for range 100 {
		m.Sparse(now, a)
	}
	if !m.Sparse(now, b) {
		t.Fatal("a second flow between the same hosts is dense")
	}
}

// Packets that name no flow are never sparse.
func TestNotIP(t *testing.T) {
	var m Meter
	for _, p := range [][]byte{nil, {0x45}, make([]byte, 19), {0x60, 0, 0, 0}, append([]byte{0x4f}, make([]byte, 30)...), append([]byte{0x20}, make([]byte, 60)...)} {
		if m.Sparse(1, p) {
			t.Errorf("% x… is sparse", p[:min(len(p), 4)])
		}
	}
}

// Whatever the bytes, Sparse neither panics nor lets one flow past its budget: over any
// sequence of packets at one instant, the sparse bytes of a flow are at most Burst.
func FuzzSparse(f *testing.F) {
	f.Add(ip4(1, 2, 6, 1, 2, 60), uint8(3))
	f.Add(ip4(1, 2, 17, 1, 2, 1500), uint8(10))
	f.Add(append([]byte{0x60}, make([]byte, 60)...), uint8(5))
	f.Fuzz(func(t *testing.T, pkt []byte, n uint8) {
		var m Meter
		sparse := 0
		for range int(n) {
			if m.Sparse(1, pkt) {
				sparse += len(pkt)
			}
		}
		if sparse > Burst {
			t.Fatalf("%d sparse bytes at one instant, burst %d", sparse, Burst)
		}
	})
}

// The meter's cost per packet, which every packet of a peer with sparse flows on pays once
// on each side.
func BenchmarkSparse(b *testing.B) {
	var m Meter
	p := ip4(1, 2, 6, 40000, 5201, 1500)
	now := int64(1)
	for b.Loop() {
		now += 1000
		m.Sparse(now, p)
	}
}
