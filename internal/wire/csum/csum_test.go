package csum

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// ref is RFC 1071's loop, word by word.
func ref(b []byte, initial uint16) uint16 {
	s := uint32(initial)
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

func TestSumMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 200 {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		init := uint16(r.Uint32())
		if got, want := Sum(b, init), ref(b, init); got != want && !(got == 0xffff && want == 0) && !(got == 0 && want == 0xffff) {
			t.Fatalf("len %d: Sum %#x, reference %#x", n, got, want)
		}
	}
	// All ones stays all ones (negative zero), as RFC 1071 sums do.
	if got := Sum([]byte{0xff, 0xff, 0xff, 0xff}, 0); got != 0xffff {
		t.Fatalf("Sum of ones %#x", got)
	}
}

// RFC 1071 section 3's example: the sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2.
func TestRFC1071Example(t *testing.T) {
	if got := Sum([]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}, 0); got != 0xddf2 {
		t.Fatalf("Sum %#x, want 0xddf2", got)
	}
	if got := Checksum([]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}); got != 0x220d {
		t.Fatalf("Checksum %#x, want 0x220d", got)
	}
}

// A UDP datagram captured with its checksum verifies to zero with Pseudo.
func TestPseudoUDP(t *testing.T) {
	src, dst := []byte{192, 0, 2, 1}, []byte{198, 51, 100, 2}
	udp := []byte{0x30, 0x39, 0x00, 0x35, 0x00, 0x0c, 0x00, 0x00, 'a', 'b', 'c', 'd'}
	c := ^Sum(udp, Pseudo(src, dst, 17, len(udp)))
	binary.BigEndian.PutUint16(udp[6:], c)
	if got := ^Sum(udp, Pseudo(src, dst, 17, len(udp))); got != 0 {
		t.Fatalf("verify %#x", got)
	}
	if ref(append(append(append(append([]byte{}, src...), dst...), 0, 17, 0, 12), udp...), 0) != 0xffff {
		t.Fatal("the reference disagrees with Pseudo")
	}
}

func TestSumAllocs(t *testing.T) {
	b := make([]byte, 1500)
	if a := testing.AllocsPerRun(100, func() { Sum(b, 0) }); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

func BenchmarkSum1500(b *testing.B) {
	buf := make([]byte, 1500)
	b.SetBytes(1500)
	for b.Loop() {
		Sum(buf, 0)
	}
}

func FuzzSum(f *testing.F) {
	f.Add([]byte{1, 2, 3}, uint16(7))
	f.Fuzz(func(t *testing.T, b []byte, init uint16) {
		got, want := Sum(b, init), ref(b, init)
		if got != want && !(got == 0xffff && want == 0) && !(got == 0 && want == 0xffff) {
			t.Fatalf("Sum %#x, reference %#x", got, want)
		}
	})
}
