package lisp

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// Golden vectors: captures between OpenOverlayRouter instances and independent clients
// (docs/lisp.md, "Interoperation").
const (
	v1Register     = "30000101ad67a76f40a6650c000100146d697637dc15ae8e41edec2b605edadf1cee31430000000a0218100000000001c0a865000132ff00000500010a630b020132ff00000500010a630c02"
	v2Notify       = "40000001ad67a76f40a6650c000100146c513107b17de228b3e4cf7a4d2ef4e9ea61f16f0000000a0218100000000001c0a865000132ff00000100010a630b020132ff00000100010a630c02"
	v3ECM          = "800000004500003c00024000ff112f49c0a8650ac0a8660a10f610f60028bafa10000001ebea337b5b30e8cb0001c0a8650a00010a630c0200200001c0a8660a"
	v3LIGRequest   = "10000001 55548a581b0aae8e 0000 0001 0a630202 00 20 0001 c0a8660a"
	v4Reply        = "20000001ebea337b5b30e8cb0000000a0218100000000001c0a866000132ff00000500010a6315020132ff00000500010a631602"
	v5Negative     = "2000000155548a581b0aae8e0000000f0009300000000001c0000000"
	v6Unregistered = "00000001 00 20 30 00 0000 0001 c0a86705"
	v7Register     = "38000101b882faec1c0a6db100010014240be655c1432132b7394eb7b3404594bef56870000005a00218100000000001c0a867000132ff00000500010a6302020132ff00000500010a630203"
	v7Notify       = "40000001b882faec1c0a6db10001001489860e467e5666940fdd014b598fcc0ba6fa0e7e000005a00218100000000001c0a867000132ff00000100010a6302020132ff00000100010a630203"
	v9SHA256       = "30000101ad67a76f40a6650c000200201d8bce101f42bd4e55d86ee4ca477addce73dafcbf41b56c3b503fbee516eff70000000a0218100000000001c0a865000132ff00000500010a630b020132ff00000500010a630c02"
)

func site1Record(flags uint16) Record {
	return Record{TTL: 10, MaskLen: 24, Authoritative: true, EID: AddrFrom(ip("192.168.101.0")), Locators: []Locator{
		{Priority: 1, Weight: 50, MPriority: 255, Flags: flags, Addr: AddrFrom(ip("10.99.11.2"))},
		{Priority: 1, Weight: 50, MPriority: 255, Flags: flags, Addr: AddrFrom(ip("10.99.12.2"))},
	}}
}

func TestLispGoldenRegisterNotify(t *testing.T) {
	for _, tt := range []struct {
		name, in, key string
		want          MapRegister
	}{
		{"V1 register", v1Register, "secret-x1", MapRegister{Type: TypeMapRegister, Flags: RegWantNotify, Nonce: 0xad67a76f40a6650c, AlgID: AlgHMACSHA1, Records: []Record{site1Record(LocLocal | LocReachable)}}},
		{"V2 notify", v2Notify, "secret-x1", MapRegister{Type: TypeMapNotify, Nonce: 0xad67a76f40a6650c, AlgID: AlgHMACSHA1, Records: []Record{site1Record(LocReachable)}}},
		{"V9 sha-256", v9SHA256, "secret-x1", MapRegister{Type: TypeMapRegister, Flags: RegWantNotify, Nonce: 0xad67a76f40a6650c, AlgID: AlgHMACSHA256, Records: []Record{site1Record(LocLocal | LocReachable)}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := unhex(t, tt.in)
			var m MapRegister
			n, err := m.Decode(in)
			if err != nil || n != len(in) {
				t.Fatalf("Decode = %d, %v; want %d", n, err, len(in))
			}
			if len(m.AuthData) != AuthLen(tt.want.AlgID) {
				t.Fatalf("auth data %d bytes", len(m.AuthData))
			}
			tt.want.AuthData = m.AuthData
			if !reflect.DeepEqual(m, tt.want) {
				t.Fatalf("Decode =\n%+v\nwant\n%+v", m, tt.want)
			}
			if err := Verify(in, []byte(tt.key)); err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if err := Verify(in, []byte("secret-x3")); !errors.Is(err, ErrAuth) {
				t.Fatalf("Verify with the wrong key = %v, want ErrAuth", err)
			}
			// Built from scratch and signed, the message is byte for byte the capture.
			b := tt.want
			b.AuthData = make([]byte, AuthLen(b.AlgID))
			out := make([]byte, b.Len())
			if b.Encode(out) != len(in) {
				t.Fatal("Encode length")
			}
			if err := Sign(out, []byte(tt.key)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, in) {
				t.Fatalf("Encode+Sign =\n%x\nwant\n%x", out, in)
			}
		})
	}
}

func TestLispGoldenV7(t *testing.T) {
	for _, s := range []string{v7Register, v7Notify} {
		in := unhex(t, s)
		var m MapRegister
		if n, err := m.Decode(in); err != nil || n != len(in) {
			t.Fatalf("Decode = %d, %v", n, err)
		}
		if err := Verify(in, []byte("secret-x3")); err != nil {
			t.Fatalf("Verify %x: %v", in[:4], err)
		}
		if m.Records[0].TTL != 1440 || m.Records[0].EID.IP != ip("192.168.103.0") || len(m.Records[0].Locators) != 2 {
			t.Fatalf("records %+v", m.Records)
		}
	}
	var m MapRegister
	m.Decode(unhex(t, v7Register))
	if m.Flags != RegProxyReply|RegWantNotify {
		t.Fatalf("flags %#x, want P|M", m.Flags)
	}
}

func TestLispTruncatedSHA1(t *testing.T) {
	// V9: V1 with a 12-byte HMAC-SHA-1-96 field.
	m := MapRegister{Flags: RegWantNotify, Nonce: 0xad67a76f40a6650c, AlgID: AlgHMACSHA1, AuthData: make([]byte, 12), Records: []Record{site1Record(LocLocal | LocReachable)}}
	out := make([]byte, m.Len())
	m.Encode(out)
	if err := Sign(out, []byte("secret-x1")); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(out[16:28]); got != "df2fca4a00eeaa54fa8443df" {
		t.Fatalf("truncated HMAC %s", got)
	}
	if err := Verify(out, []byte("secret-x1")); err != nil {
		t.Fatal(err)
	}
	out[27] ^= 1
	if err := Verify(out, []byte("secret-x1")); !errors.Is(err, ErrAuth) {
		t.Fatalf("flipped bit: %v", err)
	}
}

func TestLispAuthErrors(t *testing.T) {
	base := unhex(t, v1Register)
	for _, tt := range []struct {
		name string
		edit func([]byte) []byte
		err  error
	}{
		{"algorithm 0", func(b []byte) []byte { b[13] = 0; return b }, ErrNoAuth},
		{"algorithm 9", func(b []byte) []byte { b[13] = 9; return b }, ErrAlgorithm},
		{"sha-1 with 32 bytes announced", func(b []byte) []byte { b[15] = 32; return b }, ErrAuthLength},
		{"sha-256 with 20 bytes", func(b []byte) []byte { b[13] = 2; return b }, ErrAuthLength},
		{"auth longer than message", func(b []byte) []byte { b[14] = 0xff; return b }, ErrTruncated},
		{"map-request", func(b []byte) []byte { b[0] = 0x10; return b }, ErrType},
		{"short", func(b []byte) []byte { return b[:10] }, ErrTruncated},
		{"zeroed digest", func(b []byte) []byte { clear(b[16:36]); return b }, ErrAuth},
		{"record changed", func(b []byte) []byte { b[len(b)-1]++; return b }, ErrAuth},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.edit(bytes.Clone(base))
			if err := Verify(b, []byte("secret-x1")); !errors.Is(err, tt.err) {
				t.Fatalf("Verify = %v, want %v", err, tt.err)
			}
		})
	}
}

func TestLispGoldenECMRequest(t *testing.T) {
	in := unhex(t, v3ECM)
	var e ECM
	n, err := e.Decode(in)
	if err != nil || n != 32 {
		t.Fatalf("ECM Decode = %d, %v", n, err)
	}
	wantInner := IPUDP{Src: netip.MustParseAddrPort("192.168.101.10:4342"), Dst: netip.MustParseAddrPort("192.168.102.10:4342"), TTL: 255, ID: 2, DF: true, PayloadLen: 32}
	if e.Inner != wantInner || e.Flags != 0 {
		t.Fatalf("inner %+v", e.Inner)
	}
	var r MapRequest
	m, err := r.Decode(in[n:])
	if err != nil || m != 32 {
		t.Fatalf("MapRequest Decode = %d, %v", m, err)
	}
	want := MapRequest{Nonce: 0xebea337b5b30e8cb, SourceEID: AddrFrom(ip("192.168.101.10")), ITRRLOCs: []Addr{AddrFrom(ip("10.99.12.2"))},
		Records: []RequestRecord{{MaskLen: 32, EID: AddrFrom(ip("192.168.102.10"))}}}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("request %+v", r)
	}
	// Built from scratch: the same bytes, checksums included.
	out := make([]byte, len(in))
	want.Encode(out[n:])
	if e.Encode(out) != n || !bytes.Equal(out, in) {
		t.Fatalf("Encode =\n%x\nwant\n%x", out, in)
	}
}

func TestLispGoldenLIGRequest(t *testing.T) {
	in := unhex(t, v3LIGRequest)
	var r MapRequest
	if n, err := r.Decode(in); err != nil || n != len(in) {
		t.Fatalf("Decode = %d, %v", n, err)
	}
	if r.SourceEID.AFI != AFINone || r.ITRRLOCs[0].IP != ip("10.99.2.2") || r.Nonce != 0x55548a581b0aae8e {
		t.Fatalf("%+v", r)
	}
	out := make([]byte, r.Len())
	if r.Encode(out) != len(in) || !bytes.Equal(out, in) {
		t.Fatalf("Encode = %x", out)
	}
}

func TestLispGoldenReplies(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string
		want MapReply
	}{
		{"V4 positive", v4Reply, MapReply{Nonce: 0xebea337b5b30e8cb, Records: []Record{{TTL: 10, MaskLen: 24, Authoritative: true, EID: AddrFrom(ip("192.168.102.0")), Locators: []Locator{
			{Priority: 1, Weight: 50, MPriority: 255, Flags: LocLocal | LocReachable, Addr: AddrFrom(ip("10.99.21.2"))},
			{Priority: 1, Weight: 50, MPriority: 255, Flags: LocLocal | LocReachable, Addr: AddrFrom(ip("10.99.22.2"))}}}}}},
		{"V5 negative", v5Negative, MapReply{Nonce: 0x55548a581b0aae8e, Records: []Record{{TTL: 15, MaskLen: 9, Action: ActNativelyForward, Authoritative: true, EID: AddrFrom(ip("192.0.0.0"))}}}},
		{"V6 unregistered", "20000001 0000000000000000" + v6Unregistered, MapReply{Records: []Record{{TTL: 1, MaskLen: 32, Action: ActNativelyForward, Authoritative: true, EID: AddrFrom(ip("192.168.103.5"))}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := unhex(t, tt.in)
			var m MapReply
			if n, err := m.Decode(in); err != nil || n != len(in) {
				t.Fatalf("Decode = %d, %v", n, err)
			}
			if !reflect.DeepEqual(m, tt.want) {
				t.Fatalf("Decode =\n%+v\nwant\n%+v", m, tt.want)
			}
			out := make([]byte, tt.want.Len())
			if tt.want.Encode(out) != len(in) || !bytes.Equal(out, in) {
				t.Fatalf("Encode = %x", out)
			}
		})
	}
}

func TestLispDataHeader(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want DataHeader
	}{
		{"88abcdef 00012301", DataHeader{Flags: DataNonce | DataIID, Nonce: 0xabcdef, InstanceID: 0x123, LSB: 1}},
		{"c8abcdef 00012301", DataHeader{Flags: DataNonce | DataIID | DataLSB, Nonce: 0xabcdef, InstanceID: 0x123, LSB: 1}},
		{"c0010203 00000003", DataHeader{Flags: DataNonce | DataLSB, Nonce: 0x010203, LSB: 3}},
		{"10005007 00000000", DataHeader{Flags: DataMapVersion, SrcMapVersion: 5, DstMapVersion: 7}},
		{"00000000 00000000", DataHeader{}},
	} {
		in := unhex(t, tt.in)
		h := DataHeader{Flags: 0xff, Nonce: 9, LSB: 7}
		if n, err := h.Decode(append(in, 0x45)); err != nil || n != 8 || h != tt.want {
			t.Errorf("Decode(%s) = %d, %v, %+v; want %+v", tt.in, n, err, h, tt.want)
		}
		out := make([]byte, 8)
		if tt.want.Encode(out) != 8 || !bytes.Equal(out, in) {
			t.Errorf("Encode(%+v) = %x", tt.want, out)
		}
	}
	var h DataHeader
	if _, err := h.Decode(unhex(t, "90000000 00000000")); err != ErrDataFlags {
		t.Errorf("N and V: %v", err)
	}
	if _, err := h.Decode(make([]byte, 7)); err != ErrTruncated {
		t.Errorf("7 bytes: %v", err)
	}
}

func TestLispInstanceIDAddr(t *testing.T) {
	r := MapReply{Nonce: 1, Records: []Record{{TTL: 1, MaskLen: 64, EID: AddrWithIID(ip("fd02::"), 291, 32), Locators: []Locator{{Priority: 1, Weight: 1, Addr: AddrFrom(ip("2001:db8::1"))}}}}}
	out := make([]byte, r.Len())
	r.Encode(out)
	// LCAF header: AFI 16387, rsvd, flags, type 2, IID mask-len 32, length 4+2+16.
	if !bytes.Contains(out, unhex(t, "4003 00 00 02 20 0016 00000123 0002 fd02")) {
		t.Fatalf("LCAF not as RFC 8060 draws it: %x", out)
	}
	var d MapReply
	if n, err := d.Decode(out); err != nil || n != len(out) || !reflect.DeepEqual(d, r) {
		t.Fatalf("Decode = %d, %v, %+v", n, err, d)
	}
	p, ok := d.Records[0].Prefix()
	if !ok || p != netip.MustParsePrefix("fd02::/64") {
		t.Fatalf("Prefix = %v, %v", p, ok)
	}
	// An LCAF of an unknown type (here AS number, type 3) is carried, not refused.
	unk := unhex(t, "20000001 0000000000000001 00000001 0110 0000 0000 4003 0000 0300 0004 0000fde8 01010000 0000 0001 0a000001")
	if n, err := d.Decode(unk); err != nil || n != len(unk) || d.Records[0].EID.LCAFType != 3 || len(d.Records[0].EID.Raw) != 4 {
		t.Fatalf("unknown LCAF: %d, %v, %+v", n, err, d)
	}
}

func TestLispDecodeErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string
		dec  func([]byte) error
		err  error
	}{
		{"reply empty", "", decReply, ErrTruncated},
		{"reply as request", v4Reply, decRequest, ErrType},
		{"reply truncated in locator", v4Reply[:len(v4Reply)-4], decReply, ErrTruncated},
		{"reply unknown AFI", strings.Replace(v4Reply, "00000001c0a86600", "00000009c0a86600", 1), decReply, ErrAFI},
		{"reply with 3 records announced", "20000003" + v4Reply[8:], decReply, ErrTruncated},
		{"request without records", "10000000 55548a581b0aae8e 0000 0001 0a630202", decRequest, ErrNoRecords},
		{"request with 2 ITR-RLOCs announced", "10000101 55548a581b0aae8e 0000 0001 0a630202 00 20 0001 c0a8660a", decRequest, ErrAFI},
		{"register truncated", v1Register[:60], decRegister, ErrTruncated},
		{"register as reply", v1Register, decReply, ErrType},
		{"register of type 6", "6" + v1Register[1:], decRegister, ErrType},
		{"ecm inner not udp", strings.Replace(v3ECM, "ff112f49", "ff062f49", 1), decECM, ErrInner},
		{"ecm udp length wrong", strings.Replace(v3ECM, "0028bafa", "0030bafa", 1), decECM, ErrLength},
		{"ecm ip length wrong", strings.Replace(v3ECM, "4500003c", "4500004c", 1), decECM, ErrLength},
		{"ecm longer than data", strings.Replace(strings.Replace(v3ECM, "4500003c", "4500004c", 1), "0028bafa", "0038bafa", 1), decECM, ErrTruncated},
		{"ecm inner version 5", strings.Replace(v3ECM, "4500003c", "5500003c", 1), decECM, ErrInner},
		{"lcaf iid too short", "20000001 0000000000000001 00000001 0020 0000 0000 4003 0000 0200 0002 0000", decReply, ErrLength},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.dec(unhex(t, tt.in)); !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
		})
	}
}

func decReply(b []byte) error    { var m MapReply; _, err := m.Decode(b); return err }
func decRequest(b []byte) error  { var m MapRequest; _, err := m.Decode(b); return err }
func decRegister(b []byte) error { var m MapRegister; _, err := m.Decode(b); return err }
func decECM(b []byte) error      { var m ECM; _, err := m.Decode(b); return err }

func TestLispIPv6ECM(t *testing.T) {
	req := MapRequest{Nonce: 7, SourceEID: AddrFrom(ip("fd01::1")), ITRRLOCs: []Addr{AddrFrom(ip("2001:db8::1")), AddrFrom(ip("192.0.2.1"))},
		Records: []RequestRecord{{MaskLen: 128, EID: AddrFrom(ip("fd02::1"))}}}
	e := ECM{Inner: IPUDP{Src: netip.MustParseAddrPort("[fd01::1]:4342"), Dst: netip.MustParseAddrPort("[fd02::1]:4342"), TTL: 64, PayloadLen: uint16(req.Len())}}
	b := make([]byte, e.Len()+req.Len())
	req.Encode(b[e.Len():])
	if e.Encode(b) != 52 {
		t.Fatal("Encode")
	}
	var d ECM
	n, err := d.Decode(b)
	if err != nil || n != 52 || d != e {
		t.Fatalf("Decode = %d, %v, %+v", n, err, d)
	}
	// The UDP checksum over the pseudo-header verifies: the sum of everything is 0xffff.
	s := sum(b[ECMHeaderLen+8:ECMHeaderLen+40], 17+uint32(8+req.Len()))
	if fold(sum(b[ECMHeaderLen+40:], s)) != 0xffff {
		t.Fatal("UDP checksum does not verify")
	}
}
