package core

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzParseAddr: the package's own address parser agrees with net/netip on every string
// without a zone: the same addresses accepted, the same 16 bytes, the same family.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"10.9.0.1", "0.0.0.0", "255.255.255.255", "01.2.3.4", "1.2.3", "::", "::1", "fe80::1",
		"2001:db8::1", "::ffff:127.0.0.1", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9", "1::2::3", "::1.2.3.4", "12345::", ":1", "1:", "ff02::1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.Contains(s, "%") {
			return
		}
		b, v4, ok := parseAddr(s)
		a, err := netip.ParseAddr(s)
		if ok != (err == nil) {
			t.Fatalf("%q: parseAddr ok %v, netip %v", s, ok, err)
		}
		if !ok {
			return
		}
		if b != a.As16() || v4 != a.Unmap().Is4() {
			t.Fatalf("%q: parseAddr %x v4 %v, netip %v", s, b, v4, a)
		}
	})
}
