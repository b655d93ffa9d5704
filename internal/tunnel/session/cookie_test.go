package session

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"
)

// The cookie's round: a responder under load answers an initiation with a cookie reply; the
// initiator opens it and closes its next initiation with mac2, which the responder takes from
// that address only, under the current or the previous secret, and no longer after two
// rotations. A reply opens only for the responder's key and the mac1 it answers.
func TestCookie(t *testing.T) {
	a, _ := GenerateKey()
	b, _ := GenerateKey()
	c, _ := GenerateKey()
	kb := MAC1Key(b.Public())
	_, msg, err := Initiate(a, b.Public(), 7, AllCiphers, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wire := AppendMAC1(bytes.Clone(msg), &kb)
	mac1 := wire[len(msg):]
	src := netip.MustParseAddrPort("192.0.2.1:4500")
	other := netip.MustParseAddrPort("192.0.2.1:4501")
	ck := NewCookies(b.Public())
	now := int64(time.Hour)

	reply := ck.AppendReply(nil, mac1, src, now)
	if len(reply) != CookieReplyLen {
		t.Fatalf("reply of %d bytes, want %d", len(reply), CookieReplyLen)
	}
	if _, err := OpenCookieReply(reply, c.Public(), mac1); !errors.Is(err, ErrCookieReply) {
		t.Errorf("a reply opened under another responder's key: %v", err)
	}
	if _, err := OpenCookieReply(reply, b.Public(), bytes.Repeat([]byte{1}, MAC1Len)); !errors.Is(err, ErrCookieReply) {
		t.Errorf("a reply opened for another initiation: %v", err)
	}
	cookie, err := OpenCookieReply(reply, b.Public(), mac1)
	if err != nil {
		t.Fatal(err)
	}
	with := AppendMAC2(bytes.Clone(wire), &cookie)
	gotMsg, gotMAC1, gotMAC2, ok := SplitInitiation(with, &kb)
	if !ok || !bytes.Equal(gotMsg, msg) || !bytes.Equal(gotMAC1, mac1) || len(gotMAC2) != MAC2Len {
		t.Fatalf("SplitInitiation with mac2: ok %v, msg equal %v, mac1 equal %v, mac2 %d bytes", ok, bytes.Equal(gotMsg, msg), bytes.Equal(gotMAC1, mac1), len(gotMAC2))
	}
	if _, _, m2, ok := SplitInitiation(wire, &kb); !ok || m2 != nil {
		t.Fatalf("SplitInitiation without mac2: ok %v, mac2 %x", ok, m2)
	}
	if !ck.CheckMAC2(wire, gotMAC2, src, now) {
		t.Fatal("the mac2 of a fresh cookie was refused")
	}
	if ck.CheckMAC2(wire, gotMAC2, other, now) {
		t.Error("a cookie was taken from another address")
	}
	if !ck.CheckMAC2(wire, gotMAC2, src, now+int64(CookieSecretLife)+1) {
		t.Error("a cookie of the previous secret was refused")
	}
	if ck.CheckMAC2(wire, gotMAC2, src, now+int64(3*CookieSecretLife)) {
		t.Error("a cookie two secrets old was taken")
	}
	if ck.CheckMAC2(wire, make([]byte, MAC2Len), src, now) {
		t.Error("a zero mac2 was taken")
	}
}

// FuzzCookieReply: a cookie reply opens only when it is the one sealed for the mac1, whatever
// bytes are changed; splitting random initiations never panics and a split always returns a
// mac1 that checks.
func FuzzCookieReply(f *testing.F) {
	b, _ := GenerateKey()
	kb := MAC1Key(b.Public())
	ck := NewCookies(b.Public())
	mac1 := bytes.Repeat([]byte{7}, MAC1Len)
	src := netip.MustParseAddrPort("[2001:db8::1]:4500")
	good := ck.AppendReply(nil, mac1, src, 1)
	f.Add(good, uint16(0))
	f.Add(good[:10], uint16(3))
	f.Add([]byte{}, uint16(0))
	f.Add(AppendMAC1(make([]byte, InitLen), &kb), uint16(1))
	f.Fuzz(func(t *testing.T, in []byte, flip uint16) {
		if _, err := OpenCookieReply(in, b.Public(), mac1); err != nil && !errors.Is(err, ErrCookieReply) {
			t.Fatalf("undocumented error %v", err)
		} else if err == nil && !bytes.Equal(in, good) {
			t.Fatal("a reply other than the one sealed opened")
		}
		mod := bytes.Clone(good)
		mod[int(flip)%len(mod)] ^= byte(flip>>8) | 1
		if _, err := OpenCookieReply(mod, b.Public(), mac1); err == nil {
			t.Fatal("a changed reply opened")
		}
		msg, m1, m2, ok := SplitInitiation(in, &kb)
		if ok {
			if _, ok := CheckMAC1(in[:len(msg)+len(m1)], &kb); !ok || len(m1) != MAC1Len || (m2 != nil && len(m2) != MAC2Len) {
				t.Fatal("SplitInitiation returned parts that do not check")
			}
			if len(msg)+len(m1)+len(m2) != len(in) {
				t.Fatalf("parts of %d+%d+%d bytes from %d", len(msg), len(m1), len(m2), len(in))
			}
		}
	})
}
