package emu

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"braid/internal/lab/topo"
)

const ms = int64(time.Millisecond)

func TestShaperDelayOnly(t *testing.T) {
	s := NewShaper(topo.Shape{Delay: 10 * time.Millisecond}, 1500, 1)
	for i := range int64(100) {
		at, v := s.Admit(i*ms, 1500, 1)
		if v != Pass || at != i*ms+10*ms {
			t.Fatalf("packet %d: deliver %d verdict %v, want %d Pass", i, at, v, i*ms+10*ms)
		}
	}
}

// Back-to-back packets leave at exactly the configured rate.
func TestShaperRate(t *testing.T) {
	const rate = 10e6 // 10 Mbit/s: 1500 bytes take 1.2 ms
	s := NewShaper(topo.Shape{Rate: rate, QueuePackets: 1000}, 1500, 1)
	var last int64
	for range 500 {
		at, v := s.Admit(0, 1500, 1)
		if v != Pass {
			t.Fatal("dropped within the queue bound")
		}
		last = at
	}
	want := int64(500 * 1500 * 8 * 1e9 / rate)
	if last != want {
		t.Errorf("500 packets of 1500 B at 10 Mbit/s depart by %d ns, want %d", last, want)
	}
	// An idle link does not bank credit: a packet after a pause waits its own serialisation.
	at, _ := s.Admit(10*int64(time.Second), 1500, 1)
	if got := at - 10*int64(time.Second); got != 1_200_000 {
		t.Errorf("after idle: serialisation %d ns, want 1.2 ms", got)
	}
}

func TestShaperQueueBoundPackets(t *testing.T) {
	s := NewShaper(topo.Shape{Rate: 1e6, QueuePackets: 10}, 1500, 1)
	var pass, drop int
	for range 50 {
		if _, v := s.Admit(0, 1000, 1); v == Pass {
			pass++
		} else if v == DropQueue {
			drop++
		}
	}
	if pass != 10 || drop != 40 {
		t.Errorf("pass %d drop %d, want 10 and 40", pass, drop)
	}
	if p, b := s.Backlog(0); p != 10 || b != 10000 {
		t.Errorf("backlog %d packets %d bytes, want 10 and 10000", p, b)
	}
	// Once the first packet has left (8 ms at 1 Mbit/s) there is room for one more.
	if _, v := s.Admit(8*ms, 1000, 1); v != Pass {
		t.Errorf("no room after one departure: %v", v)
	}
	if _, v := s.Admit(8*ms, 1000, 1); v != DropQueue {
		t.Errorf("room for two after one departure: %v", v)
	}
}

func TestShaperQueueBoundBytesCountsSegments(t *testing.T) {
	s := NewShaper(topo.Shape{Rate: 1e9, QueueBytes: 100_000}, 1500, 1)
	if _, v := s.Admit(0, 65000, 44); v != Pass {
		t.Fatal("first super-packet dropped by an empty queue")
	}
	if _, v := s.Admit(0, 65000, 44); v != DropQueue {
		t.Fatal("second super-packet passed a full byte bound")
	}
	s = NewShaper(topo.Shape{Rate: 1e9, QueuePackets: 50}, 1500, 1)
	s.Admit(0, 65000, 44)
	if _, v := s.Admit(0, 9000, 6); v != Pass {
		t.Error("44+6 segments should fit 50")
	}
	if _, v := s.Admit(0, 1500, 1); v != DropQueue {
		t.Error("51 segments passed a bound of 50")
	}
}

// The default queue is one bandwidth-delay product of the round trip, at least 64 packets.
func TestQueueLimitsDefault(t *testing.T) {
	if p, b := QueueLimits(topo.Shape{Rate: 100e6, Delay: 50 * time.Millisecond}, 1500); p != 0 || b != 1_250_000 {
		t.Errorf("100 Mbit/s, 50 ms: %d packets %d bytes, want 0 and 1250000", p, b)
	}
	if _, b := QueueLimits(topo.Shape{Rate: 1e6, Delay: time.Millisecond}, 1500); b != 64*1500 {
		t.Errorf("small BDP: %d bytes, want 64 packets", b)
	}
	if p, b := QueueLimits(topo.Shape{QueuePackets: 7}, 1500); p != 7 || b != 0 {
		t.Errorf("configured: %d %d", p, b)
	}
}

func TestShaperLossRate(t *testing.T) {
	for _, loss := range []float64{1, 5, 50} {
		s := NewShaper(topo.Shape{Loss: loss}, 1500, 42)
		const n = 200_000
		lost := 0
		for i := range n {
			if _, v := s.Admit(int64(i), 100, 1); v == DropLoss {
				lost++
			}
		}
		got := 100 * float64(lost) / n
		// 4 standard deviations of a binomial count
		sd := 100 * math.Sqrt(loss/100*(1-loss/100)/n)
		if math.Abs(got-loss) > 4*sd {
			t.Errorf("loss %g %%: dropped %.3f %%", loss, got)
		}
	}
	s := NewShaper(topo.Shape{Loss: 100}, 1500, 1)
	if _, v := s.Admit(0, 100, 1); v != DropLoss {
		t.Error("100 % loss passed a packet")
	}
}

func TestShaperJitterKeepsOrder(t *testing.T) {
	s := NewShaper(topo.Shape{Delay: 20 * time.Millisecond, Jitter: 10 * time.Millisecond}, 1500, 3)
	var last int64
	var spread bool
	for i := range int64(1000) {
		now := i * 100_000
		at, _ := s.Admit(now, 100, 1)
		if at < last {
			t.Fatalf("packet %d delivered before its predecessor", i)
		}
		if d := at - now; d < 20*ms || d > 30*ms+ms {
			// order keeping may hold a packet back behind a slow predecessor, by less than the jitter
			t.Fatalf("packet %d delayed %d ns, outside 20..31 ms", i, d)
		}
		if at-now > 25*ms {
			spread = true
		}
		last = at
	}
	if !spread {
		t.Error("jitter never added more than 5 ms")
	}
}

func TestShaperDownDropsAll(t *testing.T) {
	s := NewShaper(topo.Shape{}, 1500, 1)
	s.SetDown(true)
	if _, v := s.Admit(0, 100, 1); v != DropDown {
		t.Error("a cut link passed a packet")
	}
	s.SetDown(false)
	if _, v := s.Admit(0, 100, 1); v != Pass {
		t.Error("a restored link dropped a packet")
	}
}

func TestShaperAllocs(t *testing.T) {
	s := NewShaper(topo.Shape{Rate: 1e9, Delay: time.Millisecond, Loss: 1, Jitter: time.Microsecond}, 1500, 1)
	var now int64
	allocs := testing.AllocsPerRun(1000, func() {
		now += 1000
		s.Admit(now, 1500, 1)
	})
	if allocs != 0 {
		t.Errorf("Admit allocates %.1f times per packet", allocs)
	}
}

func vnetTCP(gsoType byte, gsoSize int, ipv6 bool, payload int) []byte {
	hdr := make([]byte, vnetHdrLen)
	hdr[1] = gsoType
	binary.NativeEndian.PutUint16(hdr[4:6], uint16(gsoSize))
	var ip []byte
	if ipv6 {
		ip = make([]byte, 40)
		ip[0] = 0x60
	} else {
		ip = make([]byte, 20)
		ip[0] = 0x45
	}
	tcp := make([]byte, 32)
	tcp[12] = 8 << 4 // 32-byte header: timestamps
	b := append(hdr, ip...)
	b = append(b, tcp...)
	return append(b, make([]byte, payload)...)
}

func TestWireSize(t *testing.T) {
	for _, c := range []struct {
		name        string
		b           []byte
		vnet        bool
		bytes, segs int
	}{
		{"plain", make([]byte, 1500), false, 1500, 1},
		{"vnet, no gso", vnetTCP(gsoNone, 0, false, 100), true, 152, 1},
		{"tso4 44 segments", vnetTCP(gsoTCPv4, 1448, false, 44*1448), true, 44 * 1500, 44},
		{"tso4 partial last", vnetTCP(gsoTCPv4, 1448, false, 2*1448+10), true, 2*1448 + 10 + 3*52, 3},
		{"tso6", vnetTCP(gsoTCPv6, 1428, true, 10*1428), true, 10 * 1500, 10},
		{"tso4 with ecn", vnetTCP(gsoTCPv4|gsoECN, 1448, false, 4*1448), true, 4 * 1500, 4},
		{"truncated", []byte{1, 2, 3}, true, 0, 1},
		{"garbage ip", append(make([]byte, vnetHdrLen), make([]byte, 60)...), true, 60, 1},
	} {
		if c.name == "garbage ip" {
			c.b[1] = gsoTCPv4
			binary.NativeEndian.PutUint16(c.b[4:6], 1000)
		}
		bytes, segs := wireSize(c.b, c.vnet)
		if bytes != c.bytes || segs != c.segs {
			t.Errorf("%s: %d bytes %d segments, want %d and %d", c.name, bytes, segs, c.bytes, c.segs)
		}
	}
}

func FuzzWireSize(f *testing.F) {
	f.Add(vnetTCP(gsoTCPv4, 1448, false, 3000), true)
	f.Add(vnetTCP(gsoTCPv6, 1, true, 5), true)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, b []byte, vnet bool) {
		bytes, segs := wireSize(b, vnet)
		if segs < 1 || bytes < 0 {
			t.Fatalf("%d bytes %d segments", bytes, segs)
		}
		if n := len(b); bytes < n-vnetHdrLen && vnet || !vnet && bytes != n {
			t.Fatalf("wire bytes %d below the packet's own %d", bytes, n)
		}
	})
}
