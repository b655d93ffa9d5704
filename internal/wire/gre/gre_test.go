package gre

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
)

// unhex decodes a hex string written with spaces for readability.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var decodeTests = []struct {
	name string
	in   string
	want Header
	n    int
	// wire is what Encode writes for want, when it differs from in[:n] (normalisation).
	wire string
}{
	{name: "mpt plain (captured)", in: "0000 0800 4500", want: Header{Protocol: ProtoIPv4}, n: 4},
	{name: "mpt seq (captured)", in: "1000 0800 00000001 4500", want: Header{SeqPresent: true, Protocol: ProtoIPv4, Seq: 1}, n: 8},
	{name: "ipv6", in: "0000 86dd 6000", want: Header{Protocol: ProtoIPv6}, n: 4},
	{name: "braid key", in: "2000 88b5 0000002a 01", want: Header{KeyPresent: true, Protocol: ProtoBraid, Key: 42}, n: 8},
	{name: "checksum", in: "8000 0800 1234 0000", want: Header{ChecksumPresent: true, Protocol: ProtoIPv4, CSum: 0x1234}, n: 8},
	{name: "checksum, Reserved1 ignored", in: "8000 0800 1234 abcd", want: Header{ChecksumPresent: true, Protocol: ProtoIPv4, CSum: 0x1234}, n: 8, wire: "8000 0800 1234 0000"},
	{name: "key seq", in: "3000 88b5 01020304 fffffffe", want: Header{KeyPresent: true, SeqPresent: true, Protocol: ProtoBraid, Key: 0x01020304, Seq: 0xfffffffe}, n: 12},
	{name: "all", in: "b000 86dd beef 0000 deadbeef 00000007 60", want: Header{ChecksumPresent: true, KeyPresent: true, SeqPresent: true, Protocol: ProtoIPv6, CSum: 0xbeef, Key: 0xdeadbeef, Seq: 7}, n: 16},
	{name: "any protocol", in: "0000 ffff", want: Header{Protocol: 0xffff}, n: 4},
}

func TestDecode(t *testing.T) {
	for _, tt := range decodeTests {
		t.Run(tt.name, func(t *testing.T) {
			in := unhex(t, tt.in)
			h := dirty()
			n, err := h.Decode(in)
			if err != nil || n != tt.n || h != tt.want {
				t.Fatalf("Decode(%s) = %d, %v, %+v; want %d, nil, %+v", tt.in, n, err, h, tt.n, tt.want)
			}
			if l := h.Len(); l != n {
				t.Errorf("Len() = %d, want %d", l, n)
			}
			wire := in[:n]
			if tt.wire != "" {
				wire = unhex(t, tt.wire)
			}
			out := make([]byte, n+3)
			if m := tt.want.Encode(out); m != n || !bytes.Equal(out[:m], wire) {
				t.Errorf("Encode = %d, % x; want %d, % x", m, out[:m], n, wire)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		err  error
	}{
		{"empty", "", ErrTruncated},
		{"3 bytes", "0000 08", ErrTruncated},
		{"version 1 (PPTP)", "3001 880b 0000 0000", ErrVersion},
		{"version 7", "0007 0800", ErrVersion},
		{"version before reserved", "4001 0800", ErrVersion},
		{"bit 1, R of RFC 1701", "4000 0800", ErrReserved},
		{"bit 4, s of RFC 1701", "0800 0800", ErrReserved},
		{"bits 5-7, Recur", "0700 0800", ErrReserved},
		{"bit 8", "0080 0800", ErrReserved},
		{"bit 12", "0008 0800", ErrReserved},
		{"reserved before length", "1100 0800", ErrReserved},
		{"C without checksum", "8000 0800 1234", ErrTruncated},
		{"K without key", "2000 88b5 000000", ErrTruncated},
		{"S without seq", "1000 0800", ErrTruncated},
		{"K S without seq", "3000 88b5 00000001 000000", ErrTruncated},
		{"C K S one short", "b000 0800 0000 0000 00000000 000000", ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := dirty()
			n, err := h.Decode(unhex(t, tt.in))
			if err != tt.err || n != 0 || h != (Header{}) {
				t.Errorf("Decode(%s) = %d, %v, %+v; want 0, %v, zero header", tt.in, n, err, h, tt.err)
			}
		})
	}
}

func TestEncodeShortBuffer(t *testing.T) {
	h := Header{KeyPresent: true, SeqPresent: true, Protocol: ProtoBraid, Key: 1, Seq: 2}
	b := bytes.Repeat([]byte{0xee}, 11)
	if n := h.Encode(b); n != 0 {
		t.Errorf("Encode into 11 bytes = %d, want 0", n)
	}
	if !bytes.Equal(b, bytes.Repeat([]byte{0xee}, 11)) {
		t.Errorf("Encode into a short buffer wrote % x", b)
	}
}

// refChecksum is RFC 1071 written as plainly as possible.
func refChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

func TestChecksum(t *testing.T) {
	tests := []struct {
		in   string
		want uint16
	}{
		{"", 0xffff},
		{"00", 0xffff},
		{"0001 f203 f4f5 f6f7", 0x220d}, // RFC 1071 section 3
		{"0001 f203 f4f5 f6", 0x2304},
		{"ffff", 0x0000},
		{"ffff ffff ffff ffff ffff ffff ffff ffff ffff ffff ffff ffff ffff ffff ffff ffff ff", 0x00ff},
	}
	for _, tt := range tests {
		if got := Checksum(unhex(t, tt.in)); got != tt.want {
			t.Errorf("Checksum(%s) = %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 300 {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
			if r.IntN(3) == 0 {
				b[i] = 0xff // long runs of ones exercise the carries
			}
		}
		if got, want := Checksum(b), refChecksum(b); got != want {
			t.Fatalf("Checksum(% x) = %#04x, reference %#04x", b, got, want)
		}
	}
}

func TestPacketChecksum(t *testing.T) {
	// 8000+0800+0000+0000+4500 = cd00, complement 32ff.
	good := unhex(t, "8000 0800 32ff 0000 4500")
	if !VerifyChecksum(good) {
		t.Errorf("VerifyChecksum(% x) = false", good)
	}
	pkt := unhex(t, "8000 0800 ffff 0000 4500")
	if VerifyChecksum(pkt) {
		t.Errorf("VerifyChecksum(% x) = true", pkt)
	}
	if !PutChecksum(pkt) || !bytes.Equal(pkt, good) {
		t.Errorf("PutChecksum gives % x, want % x", pkt, good)
	}
	for _, in := range []string{"", "8000 0800 32ff 00", "0000 0800 ffff 0000 4500", "2000 0800 32ff 0000 4500"} {
		b := unhex(t, in)
		orig := bytes.Clone(b)
		if VerifyChecksum(b) {
			t.Errorf("VerifyChecksum(%s) = true, want false (no C or too short)", in)
		}
		if PutChecksum(b) || !bytes.Equal(b, orig) {
			t.Errorf("PutChecksum(%s) = true or wrote % x", in, b)
		}
	}
}

func TestNoAllocs(t *testing.T) {
	pkt := unhex(t, "b000 86dd beef 0000 deadbeef 00000007 6000 0000 0000 0000")
	bad := unhex(t, "4000 0800")
	buf := make([]byte, 64)
	var h Header
	var sink int
	var ok bool
	for name, f := range map[string]func(){
		"Decode":         func() { sink, _ = h.Decode(pkt) },
		"Decode error":   func() { sink, _ = h.Decode(bad) },
		"Encode":         func() { sink = h.Encode(buf) },
		"Checksum":       func() { sink = int(Checksum(pkt)) },
		"PutChecksum":    func() { ok = PutChecksum(pkt) },
		"VerifyChecksum": func() { ok = VerifyChecksum(pkt) },
	} {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s: %v allocations per run, want 0", name, a)
		}
	}
	_, _ = sink, ok
}

// dirty is a header with every field set, to show that Decode overwrites all of them.
func dirty() Header {
	return Header{ChecksumPresent: true, KeyPresent: true, SeqPresent: true, Protocol: 0xaaaa, CSum: 0xbbbb, Key: 0xcccccccc, Seq: 0xdddddddd}
}

func BenchmarkDecode(b *testing.B) {
	pkt := []byte{0x20, 0, 0x88, 0xb5, 0, 0, 0, 42}
	var h Header
	for b.Loop() {
		if _, err := h.Decode(pkt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkChecksum1500(b *testing.B) {
	pkt := make([]byte, 1500)
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		Checksum(pkt)
	}
}
