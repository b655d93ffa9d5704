package mpt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// Golden 0xA2 messages, written byte by byte from tunnels.md section 3's layout ("cmd | status |
// auth_type | auth_len | auth | round | ip_ver | 2 pad | 16 B | 16 B"), not by the encoder.
var statusTests = []struct {
	name string
	hex  string // without the SHA-256 of auth_type 2, which the test computes separately
	s    StatusChange
}{
	{"auth 0, path down, round 1",
		"a2 80 00 00 01 04 0000 00000000000000000000ffffc0000201 00000000000000000000ffffc6336401",
		StatusChange{Status: StatusPathDown, Round: 1, IPVer: 4, Local: netip.MustParseAddr("192.0.2.1"), Remote: netip.MustParseAddr("198.51.100.1")}},
	{"auth 0, ok, round 4, IPv6",
		"a2 00 00 00 04 06 0000 20010db8000000000000000000000001 20010db8000000000000000000000002",
		StatusChange{Status: StatusOK, Round: 4, IPVer: 6, Local: netip.MustParseAddr("2001:db8::1"), Remote: netip.MustParseAddr("2001:db8::2")}},
	{"auth 1, if down, round 2",
		"a2 81 01 04 deadbeef 02 04 0000 00000000000000000000ffffc0000201 00000000000000000000ffffc6336401",
		StatusChange{Status: StatusIfDown, AuthType: AuthToken, Token: [4]byte{0xde, 0xad, 0xbe, 0xef}, Round: 2, IPVer: 4,
			Local: netip.MustParseAddr("192.0.2.1"), Remote: netip.MustParseAddr("198.51.100.1")}},
	{"auth 2, ok, round 3",
		"a2 00 02 24 01020304 HASH 03 04 0000 00000000000000000000ffffc0000201 00000000000000000000ffffc6336401",
		StatusChange{Status: StatusOK, AuthType: AuthSHA256, Token: [4]byte{1, 2, 3, 4}, Round: 3, IPVer: 4,
			Local: netip.MustParseAddr("192.0.2.1"), Remote: netip.MustParseAddr("198.51.100.1")}},
}

var testKey = []byte("braid test key")

// statusGolden returns the bytes of a statusTests entry, the hash of auth_type 2 computed over the
// message with 32 zero bytes in its place, followed by the key.
func statusGolden(t testing.TB, h string) []byte {
	h = strings.ReplaceAll(h, " ", "")
	if !strings.Contains(h, "HASH") {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	zero, err := hex.DecodeString(strings.Replace(h, "HASH", strings.Repeat("00", 32), 1))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(bytes.Clone(zero), testKey...))
	copy(zero[8:40], sum[:])
	return zero
}

func TestStatusChangeGolden(t *testing.T) {
	for _, tt := range statusTests {
		t.Run(tt.name, func(t *testing.T) {
			want := statusGolden(t, tt.hex)
			if got := tt.s.Append(nil, testKey); !bytes.Equal(got, want) {
				t.Errorf("Append:\n got % x\nwant % x", got, want)
			}
			if n := tt.s.Len(); n != len(want) {
				t.Errorf("Len %d, want %d", n, len(want))
			}
			var s StatusChange
			if n, err := s.Decode(want, testKey); err != nil || n != len(want) || s != tt.s {
				t.Errorf("Decode = %d, %v, %+v; want %+v", n, err, s, tt.s)
			}
		})
	}
}

func TestStatusChangeErrors(t *testing.T) {
	ok0 := statusGolden(t, statusTests[0].hex)
	ok2 := statusGolden(t, statusTests[3].hex)
	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 1; return b }
	for _, tt := range []struct {
		name string
		b    []byte
		key  []byte
		err  error
	}{
		{"short", ok0[:3], nil, ErrTruncated},
		{"keepalive", append([]byte{CmdKeepalive}, ok0[1:]...), nil, ErrNotStatusChange},
		{"auth_type 3", func() []byte { b := bytes.Clone(ok0); b[2] = 3; return b }(), nil, ErrAuthType},
		{"auth_len wrong", func() []byte { b := bytes.Clone(ok0); b[3] = 4; return b }(), nil, ErrAuthType},
		{"truncated", ok0[:39], nil, ErrTruncated},
		{"trailing", append(bytes.Clone(ok0), 0), nil, ErrTrailing},
		{"ip_ver 5", func() []byte { b := bytes.Clone(ok0); b[5] = 5; return b }(), nil, ErrIPVersion},
		{"wrong key", ok2, []byte("other"), ErrAuth},
		{"hash flipped", flip(ok2, 20), testKey, ErrAuth},
		{"token flipped", flip(ok2, 4), testKey, ErrAuth},
		{"status flipped", flip(ok2, 1), testKey, ErrAuth},
		{"address flipped", flip(ok2, len(ok2)-1), testKey, ErrAuth},
	} {
		s := StatusChange{Status: 9, Round: 9}
		if n, err := s.Decode(tt.b, tt.key); !errors.Is(err, tt.err) || n != 0 || s != (StatusChange{}) {
			t.Errorf("%s: Decode = %d, %v, %+v; want %v and zero", tt.name, n, err, s, tt.err)
		}
	}
}

// FuzzStatusChange: Decode on arbitrary input returns a documented error and a zero value, or
// a value that Append encodes back to the same bytes (up to the padding and the mapped-address
// normalisation, which the round trip of the decoded value must then keep); and Append then
// Decode on values built by the fuzzer gives the value back.
func FuzzStatusChange(f *testing.F) {
	for _, tt := range statusTests {
		f.Add(statusGolden(f, tt.hex), tt.s.Status, tt.s.AuthType, tt.s.Round, true, []byte("k"))
	}
	f.Fuzz(func(t *testing.T, b []byte, status, authType, round uint8, v6 bool, key []byte) {
		s := StatusChange{Status: 1, Round: 1}
		n, err := s.Decode(b, key)
		switch {
		case err == nil:
			if n != len(b) {
				t.Fatalf("n %d for %d bytes", n, len(b))
			}
			out := s.Append(nil, key)
			if len(out) != len(b) {
				t.Fatalf("re-encoded length %d, want %d", len(out), len(b))
			}
			var s2 StatusChange
			if _, err := s2.Decode(out, key); err != nil || s2 != s {
				t.Fatalf("round trip of decoded: %v, %+v != %+v", err, s2, s)
			}
		case errors.Is(err, ErrTruncated), errors.Is(err, ErrTrailing), errors.Is(err, ErrNotStatusChange),
			errors.Is(err, ErrAuthType), errors.Is(err, ErrIPVersion), errors.Is(err, ErrAuth):
			if n != 0 || s != (StatusChange{}) {
				t.Fatalf("error %v with %d, %+v", err, n, s)
			}
		default:
			t.Fatalf("undocumented error %v", err)
		}

		in := StatusChange{Status: status, AuthType: authType % 3, Round: round, IPVer: 4,
			Local: netip.AddrFrom4([4]byte{b4(b, 0), 1, 2, 3}), Remote: netip.AddrFrom4([4]byte{4, 5, 6, b4(b, 1)})}
		if v6 {
			in.IPVer = 6
			in.Local, in.Remote = netip.AddrFrom16([16]byte{0x20, 1, 15: b4(b, 2)}), netip.IPv6Loopback()
		}
		if in.AuthType != AuthNone {
			copy(in.Token[:], b)
		}
		enc := in.Append([]byte{0xee}, key)
		if len(enc) != 1+in.Len() || enc[0] != 0xee {
			t.Fatalf("Append wrote %d bytes, want %d after the prefix", len(enc)-1, in.Len())
		}
		var got StatusChange
		if _, err := got.Decode(enc[1:], key); err != nil || got != in {
			t.Fatalf("Decode(Append(%+v)) = %+v, %v", in, got, err)
		}
	})
}

func b4(b []byte, i int) byte {
	if i < len(b) {
		return b[i]
	}
	return 0
}
