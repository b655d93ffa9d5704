package mpt

import (
	"bytes"
	"encoding/hex"
	"net/netip"
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

var dataTests = []struct {
	name    string
	in      string
	payload string
	seq     uint32
	hasSeq  bool
	err     error
	ipVer   int    // for the encoding; 0: do not encode
	wire    string // what EncodeData writes, when it differs from the header of in
}{
	{name: "plain (captured)", in: "0000 0800 4500 0014", payload: "4500 0014", ipVer: 4},
	{name: "seq 1 (captured)", in: "1000 0800 00000001 4500 0014", payload: "4500 0014", seq: 1, hasSeq: true, ipVer: 4},
	{name: "ipv6 connection", in: "0000 86dd 6000", payload: "6000", ipVer: 6},
	{name: "ipv6 packet in an ipv4 connection", in: "1000 0800 fffffffe 6000", payload: "6000", seq: 0xfffffffe, hasSeq: true, ipVer: 4},
	{name: "empty payload", in: "0000 0800", payload: "", ipVer: 4},
	{name: "empty payload with seq", in: "1000 0800 00000002", payload: "", seq: 2, hasSeq: true, ipVer: 4},
	{name: "C and K ignored, as MPT does", in: "a000 0800 4500 0014 0000 0000", payload: "4500 0014 0000 0000", ipVer: 4, wire: "0000 0800"},
	{name: "reserved bits, version, protocol ignored", in: "1fff 1234 00000003 45", payload: "45", seq: 3, hasSeq: true, ipVer: 6, wire: "1000 86dd 00000003"},
	{name: "keepalive", in: "0000 0800 a1 00000000 04 0000", payload: "a1 00000000 04 0000", err: ErrCommand, ipVer: 4},
	{name: "command with seq", in: "1000 0800 00000009 a0", payload: "a0", seq: 9, hasSeq: true, err: ErrCommand, ipVer: 4},
	{name: "0x9f is not a command", in: "0000 0800 9f", payload: "9f", ipVer: 4},
	{name: "0xff is a command", in: "0000 0800 ff", payload: "ff", err: ErrCommand, ipVer: 4},
	{name: "empty", in: "", err: ErrTruncated},
	{name: "3 bytes", in: "0000 08", err: ErrTruncated},
	{name: "S without seq", in: "1000 0800 000000", err: ErrTruncated},
}

func TestDecodeData(t *testing.T) {
	for _, tt := range dataTests {
		t.Run(tt.name, func(t *testing.T) {
			in := unhex(t, tt.in)
			payload, seq, hasSeq, err := DecodeData(in)
			if err != tt.err || seq != tt.seq || hasSeq != tt.hasSeq {
				t.Fatalf("DecodeData(%s) = _, %d, %v, %v; want %d, %v, %v", tt.in, seq, hasSeq, err, tt.seq, tt.hasSeq, tt.err)
			}
			if tt.err == ErrTruncated {
				if payload != nil {
					t.Fatalf("payload % x with ErrTruncated", payload)
				}
				return
			}
			want := unhex(t, tt.payload)
			if !bytes.Equal(payload, want) {
				t.Fatalf("payload % x, want % x", payload, want)
			}
			hl := len(in) - len(payload)
			if len(payload) > 0 && &payload[0] != &in[hl] {
				t.Errorf("payload is a copy, not a sub-slice of the input")
			}
			wire := in[:hl]
			if tt.wire != "" {
				wire = unhex(t, tt.wire)
			}
			out := make([]byte, 12)
			if n := EncodeData(out, tt.ipVer, seq, hasSeq); n != hl || !bytes.Equal(out[:n], wire) {
				t.Errorf("EncodeData = %d, % x; want %d, % x", n, out[:n], hl, wire)
			}
		})
	}
}

func TestEncodeDataRejects(t *testing.T) {
	b := bytes.Repeat([]byte{0xee}, 8)
	for _, c := range []struct {
		b       []byte
		ipVer   int
		withSeq bool
	}{
		{b, 0, false}, {b, 5, false}, {b, 46, true}, {b[:3], 4, false}, {b[:7], 6, true},
	} {
		if n := EncodeData(c.b, c.ipVer, 1, c.withSeq); n != 0 {
			t.Errorf("EncodeData(%d bytes, %d, 1, %v) = %d, want 0", len(c.b), c.ipVer, c.withSeq, n)
		}
	}
	if !bytes.Equal(b, bytes.Repeat([]byte{0xee}, 8)) {
		t.Errorf("rejected EncodeData wrote % x", b)
	}
}

// golden is the captured 44-byte keepalive of an ip_ver 4 connection, with MPT's sample tunnel
// addresses (10.0.0.2 local, 10.0.0.1 remote).
const golden = "00 00 08 00" + " a1" + " 00 00 00 00" + " 04" + " 00 00" +
	" 00 00 00 00 00 00 00 00 00 00 ff ff 0a 00 00 02" +
	" 00 00 00 00 00 00 00 00 00 00 ff ff 0a 00 00 01"

func TestKeepaliveGolden(t *testing.T) {
	want := unhex(t, golden)
	if len(want) != 44 {
		t.Fatalf("golden is %d bytes, want 44", len(want))
	}
	k := Keepalive{IPVer: 4, Local: netip.MustParseAddr("10.0.0.2"), Remote: netip.MustParseAddr("10.0.0.1")}
	b := make([]byte, SeqHeaderLen, 64)
	b = k.Append(b[:EncodeData(b, 4, 0, false)])
	if !bytes.Equal(b, want) {
		t.Fatalf("keepalive\n% x\nwant\n% x", b, want)
	}

	payload, _, hasSeq, err := DecodeData(want)
	if err != ErrCommand || hasSeq || payload[0] != CmdKeepalive {
		t.Fatalf("DecodeData(golden) = % x, %v, %v", payload, hasSeq, err)
	}
	got := Keepalive{IPVer: 6, Local: netip.MustParseAddr("::1"), Remote: netip.MustParseAddr("1.2.3.4")}
	if n, err := got.Decode(payload); n != KeepaliveLen || err != nil || got != k {
		t.Fatalf("Decode = %d, %v, %+v; want %d, nil, %+v", n, err, got, KeepaliveLen, k)
	}
	if !got.Local.Is4() || !got.Remote.Is4() {
		t.Errorf("addresses %v, %v are not unmapped IPv4", got.Local, got.Remote)
	}
}

func TestKeepalive(t *testing.T) {
	v6 := "a1 00000000 06 0000 fec00000000000000000000000000002 fec00000000000000000000000000001"
	tests := []struct {
		name string
		in   string
		want Keepalive
		err  error
		wire string // Append's output when it differs from in
	}{
		{name: "ipv6", in: v6, want: Keepalive{IPVer: 6, Local: netip.MustParseAddr("fec0::2"), Remote: netip.MustParseAddr("fec0::1")}},
		{name: "ipv6 connection, mapped address stays IPv6",
			in:   "a1 00000000 06 0000 00000000000000000000ffff0a000002 00000000000000000000000000000001",
			want: Keepalive{IPVer: 6, Local: netip.MustParseAddr("::ffff:10.0.0.2"), Remote: netip.MustParseAddr("::1")}},
		{name: "ipv4 connection, unmapped address stays IPv6",
			in:   "a1 00000000 04 0000 00000000000000000000000000000000 00000000000000000000ffff0a000001",
			want: Keepalive{IPVer: 4, Local: netip.IPv6Unspecified(), Remote: netip.MustParseAddr("10.0.0.1")}},
		{name: "unused bytes ignored",
			in:   "a1 80020401 04 abcd 00000000000000000000ffff0a000002 00000000000000000000ffff0a000001",
			want: Keepalive{IPVer: 4, Local: netip.MustParseAddr("10.0.0.2"), Remote: netip.MustParseAddr("10.0.0.1")},
			wire: "a1 00000000 04 0000 00000000000000000000ffff0a000002 00000000000000000000ffff0a000001"},
		{name: "empty", in: "", err: ErrTruncated},
		{name: "39 bytes", in: v6[:len(v6)-2], err: ErrTruncated},
		{name: "41 bytes", in: v6 + "00", err: ErrTrailing},
		{name: "with GRE header", in: "00000800 " + v6[:len(v6)-8], err: ErrNotKeepalive},
		{name: "path status change", in: "a2" + v6[2:], err: ErrNotKeepalive},
		{name: "ip_ver 0", in: "a1 00000000 00 0000" + v6[19:], err: ErrIPVersion},
		{name: "ip_ver 5", in: "a1 00000000 05 0000" + v6[19:], err: ErrIPVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := unhex(t, tt.in)
			got := dirtyKeepalive
			n, err := got.Decode(in)
			if err != tt.err || got != tt.want {
				t.Fatalf("Decode = %d, %v, %+v; want %v, %+v", n, err, got, tt.err, tt.want)
			}
			if err != nil {
				if n != 0 {
					t.Errorf("n = %d with an error", n)
				}
				return
			}
			if n != KeepaliveLen {
				t.Errorf("n = %d, want %d", n, KeepaliveLen)
			}
			wire := in
			if tt.wire != "" {
				wire = unhex(t, tt.wire)
			}
			if out := tt.want.Append([]byte{0xee}); !bytes.Equal(out[1:], wire) || out[0] != 0xee {
				t.Errorf("Append = % x, want ee % x", out, wire)
			}
		})
	}
}

var dirtyKeepalive = Keepalive{IPVer: 9, Local: netip.MustParseAddr("2001:db8::1%eth0"), Remote: netip.MustParseAddr("192.0.2.1")}

func TestNoAllocs(t *testing.T) {
	pkt := unhex(t, "1000 0800 00000001 4500 0014")
	ka := unhex(t, golden)[4:]
	ka6 := unhex(t, "a1 00000000 06 0000 20010db8000000000000000000000001 fec00000000000000000000000000001")
	buf := make([]byte, 0, 64)
	k := Keepalive{IPVer: 4, Local: netip.MustParseAddr("10.0.0.2"), Remote: netip.MustParseAddr("10.0.0.1")}
	var sink int
	for name, f := range map[string]func(){
		"DecodeData":        func() { _, _, _, _ = DecodeData(pkt) },
		"DecodeData error":  func() { _, _, _, _ = DecodeData(pkt[:5]) },
		"EncodeData":        func() { sink = EncodeData(buf[:8], 4, 7, true) },
		"Keepalive.Decode":  func() { sink, _ = k.Decode(ka) },
		"Keepalive.Append":  func() { sink = len(k.Append(buf[:0])) },
		"Keepalive.Decode6": func() { sink, _ = k.Decode(ka6) },
	} {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s: %v allocations per run, want 0", name, a)
		}
	}
	_ = sink
}
