package mpath

import (
	"bytes"
	"encoding/hex"
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

// vector is one hand-written encoding: in decodes to want, consuming n bytes, and want encodes
// to wire (in[:n] unless set: the normalisation).
type vector[T any] struct {
	name string
	in   string
	want T
	n    int
	wire string
}

// errVector is an input that Decode rejects with err.
type errVector struct {
	name string
	in   string
	err  error
}

// codec is what every message type of this package implements.
type codec[T any] interface {
	*T
	Decode([]byte) (int, error)
	Encode([]byte) int
}

// testVectors decodes each vector into a dirty value, then encodes the expected value.
func testVectors[T comparable, P codec[T]](t *testing.T, dirty T, vs []vector[T], errs []errVector) {
	t.Helper()
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			in := unhex(t, v.in)
			got := dirty
			n, err := P(&got).Decode(in)
			if err != nil || n != v.n || got != v.want {
				t.Fatalf("Decode(%s) = %d, %v, %+v; want %d, nil, %+v", v.in, n, err, got, v.n, v.want)
			}
			wire := in[:n]
			if v.wire != "" {
				wire = unhex(t, v.wire)
			}
			out := bytes.Repeat([]byte{0xee}, n+5)
			if m := P(&v.want).Encode(out); m != len(wire) || !bytes.Equal(out[:m], wire) {
				t.Errorf("Encode = %d, % x; want %d, % x", m, out[:m], len(wire), wire)
			}
			if len(wire) > 0 {
				short := bytes.Repeat([]byte{0xee}, len(wire)-1)
				if m := P(&v.want).Encode(short); m != 0 || !bytes.Equal(short, bytes.Repeat([]byte{0xee}, len(wire)-1)) {
					t.Errorf("Encode into %d bytes = %d, wrote % x; want 0, nothing", len(short), m, short)
				}
			}
		})
	}
	for _, v := range errs {
		t.Run(v.name, func(t *testing.T) {
			got := dirty
			n, err := P(&got).Decode(unhex(t, v.in))
			var zero T
			if err != v.err || n != 0 || got != zero {
				t.Errorf("Decode(%s) = %d, %v, %+v; want 0, %v, zero", v.in, n, err, got, v.err)
			}
		})
	}
}

var (
	dirtyHeader   = Header{Type: 0xaa, Path: 0xbb, Flags: 0xcccc, Counter: 0xdddddddddddddddd}
	dirtyPrefix   = DataPrefix{Seq: 0xaaaaaaaa, PathSeq: 0xbbbbbbbb}
	dirtyProbe    = Probe{Seq: 0xaaaaaaaa, Timestamp: 0xbbbbbbbb, Padding: 77}
	dirtyFeedback = Feedback{Bytes: 1<<64 - 1, Packets: 1, Lost: 2, ReorderPackets: 3, ReorderKiB: 4, Time: 5, ReorderFreeKiB: 6}
	dirtyReply    = ProbeReply{Seq: 5, Timestamp: 6, Hold: 7, Feedback: dirtyFeedback}
	dirtyMTUAck   = MTUAck{Seq: 8, Size: 9}
	dirtyNack     = Nack{First: 8, Count: 9, Path: 10}
	dirtyGapNack  = GapNack{First: 11, Missing: 12}
)

var headerVectors = []vector[Header]{
	{name: "data", in: "01 00 0000 0000000000000001 aabbcc", want: Header{Type: TypeData, Counter: 1}, n: 12},
	{name: "probe", in: "02 01 0000 0000000000000000", want: Header{Type: TypeProbe, Path: 1}, n: 12},
	{name: "probe reply", in: "03 fe 0000 0102030405060708", want: Header{Type: TypeProbeReply, Path: 254, Counter: 0x0102030405060708}, n: 12},
	{name: "feedback", in: "04 07 0000 ffffffffffffffff", want: Header{Type: TypeFeedback, Path: 7, Counter: 1<<64 - 1}, n: 12},
	{name: "clear data", in: "01 01 0001 0000000000000004", want: Header{Type: TypeData, Path: 1, Flags: FlagClear, Counter: 4}, n: 12},
	{name: "sparse clear data", in: "01 01 0003 0000000000000004", want: Header{Type: TypeData, Path: 1, Flags: FlagClear | FlagSparse, Counter: 4}, n: 12},
	{name: "mtu probe", in: "05 02 0000 0000000000000009 00", want: Header{Type: TypeMTUProbe, Path: 2, Counter: 9}, n: 12},
	{name: "mtu ack", in: "06 03 0000 000000000000000a", want: Header{Type: TypeMTUAck, Path: 3, Counter: 10}, n: 12},
	{name: "nack", in: "07 04 0000 000000000000000b", want: Header{Type: TypeNack, Path: 4, Counter: 11}, n: 12},
	{name: "gap nack", in: "08 05 0000 000000000000000c", want: Header{Type: TypeGapNack, Path: 5, Counter: 12}, n: 12},
	{name: "handshake init", in: "10 00 0000 0000000000000000 01", want: Header{Type: TypeHandshakeInit}, n: 12},
	{name: "handshake response", in: "11 00 0000 0000000000000002", want: Header{Type: TypeHandshakeResp, Counter: 2}, n: 12},
	{name: "cookie reply", in: "12 00 0000 0000000000000000", want: Header{Type: TypeCookieReply}, n: 12},
	{name: "reserved path accepted", in: "01 ff 0000 0000000000000003", want: Header{Type: TypeData, Path: PathReserved, Counter: 3}, n: 12},
}

var headerErrors = []errVector{
	{"empty", "", ErrTruncated},
	{"11 bytes", "01 00 0000 00000000000000", ErrTruncated},
	{"truncated before type", "00 00 0000 00000000000000", ErrTruncated},
	{"type 0", "00 00 0000 0000000000000000", ErrType},
	{"type 9", "09 00 0000 0000000000000000", ErrType},
	{"flag on a gap nack", "08 00 0001 0000000000000000", ErrUnknownFlags},
	{"type 15", "0f 00 0000 0000000000000000", ErrType},
	{"type 19", "13 00 0000 0000000000000000", ErrType},
	{"type 255", "ff 00 0000 0000000000000000", ErrType},
	{"type before flags", "00 00 0001 0000000000000000", ErrType},
	{"flag 0x0004", "01 00 0004 0000000000000000", ErrUnknownFlags},
	{"sparse flag on a probe", "02 00 0002 0000000000000000", ErrUnknownFlags},
	{"clear flag on a probe", "02 00 0001 0000000000000000", ErrUnknownFlags},
	{"clear flag on a reply", "03 00 0001 0000000000000000", ErrUnknownFlags},
	{"flag 0x8000", "01 00 8000 0000000000000000", ErrUnknownFlags},
}

func TestHeader(t *testing.T) { testVectors(t, dirtyHeader, headerVectors, headerErrors) }

var prefixVectors = []vector[DataPrefix]{
	{name: "with packet", in: "00000001 00000002 4500", want: DataPrefix{Seq: 1, PathSeq: 2}, n: 8},
	{name: "alone", in: "fffffffe 01020304", want: DataPrefix{Seq: 0xfffffffe, PathSeq: 0x01020304}, n: 8},
}

var prefixErrors = []errVector{
	{"empty", "", ErrTruncated},
	{"7 bytes", "00000001 000000", ErrTruncated},
}

func TestDataPrefix(t *testing.T) { testVectors(t, dirtyPrefix, prefixVectors, prefixErrors) }

var probeVectors = []vector[Probe]{
	{name: "no padding", in: "0000000a 0000000b", want: Probe{Seq: 10, Timestamp: 11}, n: 8},
	{name: "padding", in: "0000000a 0000000b 0000 0000 00", want: Probe{Seq: 10, Timestamp: 11, Padding: 5}, n: 13},
	{name: "padding content ignored", in: "0000000a 0000000b 0102 03", want: Probe{Seq: 10, Timestamp: 11, Padding: 3}, n: 11, wire: "0000000a 0000000b 0000 00"},
}

var probeErrors = []errVector{
	{"empty", "", ErrTruncated},
	{"7 bytes", "0000000a 000000", ErrTruncated},
}

func TestProbe(t *testing.T) {
	testVectors(t, dirtyProbe, probeVectors, probeErrors)
	b := make([]byte, 100)
	if n := (&Probe{Padding: -1}).Encode(b); n != 0 {
		t.Errorf("Encode with negative padding = %d, want 0", n)
	}
}

var feedbackVectors = []vector[Feedback]{
	{name: "counts", in: "0000000000010000 00000064 00000002 00000003 00000004 fffffff0 000000c8", want: Feedback{Bytes: 65536, Packets: 100, Lost: 2, ReorderPackets: 3, ReorderKiB: 4, Time: 0xfffffff0, ReorderFreeKiB: 200}, n: 32},
	{name: "unbounded", in: "0000000000000001 00000001 00000000 00000000 00000000 00000001 ffffffff", want: Feedback{Bytes: 1, Packets: 1, Time: 1, ReorderFreeKiB: NoReorderBound}, n: 32},
	{name: "zero", in: "0000000000000000 00000000 00000000 00000000 00000000 00000000 00000000", want: Feedback{}, n: 32},
}

var feedbackErrors = []errVector{
	{"empty", "", ErrTruncated},
	{"24 bytes (before the receiver time)", "0000000000010000 00000064 00000002 00000003 00000004", ErrTruncated},
	{"28 bytes (before the free room)", "0000000000010000 00000064 00000002 00000003 00000004 00000000", ErrTruncated},
	{"31 bytes", "0000000000010000 00000064 00000002 00000003 00000004 00000000 000000", ErrTruncated},
	{"33 bytes", "0000000000010000 00000064 00000002 00000003 00000004 00000000 00000000 00", ErrTrailing},
}

func TestFeedback(t *testing.T) { testVectors(t, dirtyFeedback, feedbackVectors, feedbackErrors) }

var replyVectors = []vector[ProbeReply]{
	{
		name: "reply",
		in:   "0000000a 0000000b 000003e8 0102030405060708 00000005 00000006 00000007 00000008 00000009 0000000a",
		want: ProbeReply{Seq: 10, Timestamp: 11, Hold: 1000, Feedback: Feedback{Bytes: 0x0102030405060708, Packets: 5, Lost: 6, ReorderPackets: 7, ReorderKiB: 8, Time: 9, ReorderFreeKiB: 10}},
		n:    44,
	},
}

var replyErrors = []errVector{
	{"empty", "", ErrTruncated},
	{"no feedback", "0000000a 0000000b 000003e8", ErrTruncated},
	{"36 bytes (before the receiver time)", "0000000a 0000000b 000003e8 0102030405060708 00000005 00000006 00000007 00000008", ErrTruncated},
	{"43 bytes", "0000000a 0000000b 000003e8 0102030405060708 00000005 00000006 00000007 00000008 00000009 000000", ErrTruncated},
	{"45 bytes", "0000000a 0000000b 000003e8 0102030405060708 00000005 00000006 00000007 00000008 00000009 0000000a 00", ErrTrailing},
}

func TestProbeReply(t *testing.T) { testVectors(t, dirtyReply, replyVectors, replyErrors) }

var mtuAckVectors = []vector[MTUAck]{
	{name: "ack", in: "00000007 000005c8", want: MTUAck{Seq: 7, Size: 1480}, n: 8},
	{name: "max", in: "ffffffff ffffffff", want: MTUAck{Seq: 1<<32 - 1, Size: 1<<32 - 1}, n: 8},
}

var mtuAckErrors = []errVector{
	{"empty", "", ErrTruncated},
	{"7 bytes", "00000007 000005", ErrTruncated},
	{"9 bytes", "00000007 000005c8 00", ErrTrailing},
}

func TestMTUAck(t *testing.T) { testVectors(t, dirtyMTUAck, mtuAckVectors, mtuAckErrors) }

var nackVectors = []vector[Nack]{
	{name: "one", in: "00000007 0001 02", want: Nack{First: 7, Count: 1, Path: 2}, n: 7},
	{name: "max", in: "ffffffff ffff ff", want: Nack{First: 1<<32 - 1, Count: 1<<16 - 1, Path: 255}, n: 7},
}

var nackErrors = []errVector{
	{"empty", "", ErrTruncated},
	{"6 bytes", "00000007 0001", ErrTruncated},
	{"8 bytes", "00000007 0001 02 00", ErrTrailing},
}

func TestNack(t *testing.T) { testVectors(t, dirtyNack, nackVectors, nackErrors) }

var gapNackVectors = []vector[GapNack]{
	{name: "first only", in: "00000007 8000000000000000", want: GapNack{First: 7, Missing: 1 << 63}, n: 12},
	{name: "wraps", in: "fffffffe 4000000000000001", want: GapNack{First: 1<<32 - 2, Missing: 1<<62 | 1}, n: 12},
	{name: "max", in: "ffffffff ffffffffffffffff", want: GapNack{First: 1<<32 - 1, Missing: 1<<64 - 1}, n: 12},
}

var gapNackErrors = []errVector{
	{"empty", "", ErrTruncated},
	{"11 bytes", "00000007 80000000000000", ErrTruncated},
	{"13 bytes", "00000007 8000000000000000 00", ErrTrailing},
}

func TestGapNack(t *testing.T) { testVectors(t, dirtyGapNack, gapNackVectors, gapNackErrors) }

var innerTests = []struct {
	name string
	in   string
	v    int
	err  error
}{
	{"ipv4 header only", "4500 0014 0000 4000 4011 0000 0a000001 0a000002", 4, nil},
	{"ipv4 udp", "4500 001c 0000 4000 4011 0000 0a000001 0a000002 1234 5678 0008 0000", 4, nil},
	{"ipv4 options", "4600 0018 0000 4000 4011 0000 0a000001 0a000002 01010101", 4, nil},
	{"ipv6 header only", "6000 0000 0000 3b40 " + strings.Repeat("00", 32), 6, nil},
	{"ipv6 payload", "6000 0000 0002 3b40 " + strings.Repeat("00", 32) + "abcd", 6, nil},
	{"empty", "", 0, ErrInnerPacket},
	{"one byte", "45", 0, ErrInnerPacket},
	{"ipv4 19 bytes", "4500 0013 0000 4000 4011 0000 0a000001 0a0000", 0, ErrInnerPacket},
	{"ipv4 IHL 4", "4400 0014 0000 4000 4011 0000 0a000001 0a000002", 0, ErrInnerPacket},
	{"ipv4 total longer", "4500 0015 0000 4000 4011 0000 0a000001 0a000002", 0, ErrInnerPacket},
	{"ipv4 total shorter", "4500 0014 0000 4000 4011 0000 0a000001 0a000002 00", 0, ErrInnerPacket},
	{"ipv4 total inside header", "4f00 0018 0000 4000 4011 0000 0a000001 0a000002 00000000", 0, ErrInnerPacket},
	{"ipv6 39 bytes", "6000 0000 0000 3b40 " + strings.Repeat("00", 31), 0, ErrInnerPacket},
	{"ipv6 payload longer", "6000 0000 0003 3b40 " + strings.Repeat("00", 32) + "abcd", 0, ErrInnerPacket},
	{"ipv6 payload shorter", "6000 0000 0001 3b40 " + strings.Repeat("00", 32) + "abcd", 0, ErrInnerPacket},
	{"version 5", "5500 0014 0000 4000 4011 0000 0a000001 0a000002", 0, ErrInnerPacket},
	{"version 0", "0500 0014 0000 4000 4011 0000 0a000001 0a000002", 0, ErrInnerPacket},
	{"mpt command", "a100 0000 0400 0000", 0, ErrInnerPacket},
}

func TestInnerVersion(t *testing.T) {
	for _, tt := range innerTests {
		v, err := InnerVersion(unhex(t, tt.in))
		if v != tt.v || err != tt.err {
			t.Errorf("%s: InnerVersion = %d, %v; want %d, %v", tt.name, v, err, tt.v, tt.err)
		}
	}
}

func TestNoAllocs(t *testing.T) {
	buf := make([]byte, 1500)
	hdr := unhex(t, "01 00 0000 0000000000000001")
	bad := unhex(t, "01 00 0001 0000000000000001")
	reply := unhex(t, "0000000a 0000000b 000003e8 0102030405060708 00000005 00000006 00000007 00000008 00000009 0000000a")
	inner := unhex(t, "6000 0000 0000 3b40 "+strings.Repeat("00", 32))
	var (
		h    Header
		d    DataPrefix
		p    = Probe{Padding: 1000}
		f    Feedback
		r    ProbeReply
		a    MTUAck
		sink int
	)
	for name, fn := range map[string]func(){
		"Header.Decode":       func() { sink, _ = h.Decode(hdr) },
		"Header.Decode error": func() { sink, _ = h.Decode(bad) },
		"Header.Encode":       func() { sink = h.Encode(buf) },
		"DataPrefix.Decode":   func() { sink, _ = d.Decode(reply) },
		"DataPrefix.Encode":   func() { sink = d.Encode(buf) },
		"Probe.Encode":        func() { sink = p.Encode(buf) },
		"Probe.Decode":        func() { sink, _ = p.Decode(buf[:1008]) },
		"ProbeReply.Decode":   func() { sink, _ = r.Decode(reply) },
		"ProbeReply.Encode":   func() { sink = r.Encode(buf) },
		"Feedback.Decode":     func() { sink, _ = f.Decode(reply[12:]) },
		"Feedback.Encode":     func() { sink = f.Encode(buf) },
		"MTUAck.Decode":       func() { sink, _ = a.Decode(reply[:MTUAckLen]) },
		"MTUAck.Encode":       func() { sink = a.Encode(buf) },
		"InnerVersion":        func() { sink, _ = InnerVersion(inner) },
		"InnerVersion error":  func() { sink, _ = InnerVersion(hdr) },
	} {
		if a := testing.AllocsPerRun(100, fn); a != 0 {
			t.Errorf("%s: %v allocations per run, want 0", name, a)
		}
	}
	_ = sink
}
