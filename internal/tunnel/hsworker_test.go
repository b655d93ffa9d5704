package tunnel

import (
	"crypto/rand"
	"net/netip"
	"testing"
	"time"

	"braid/internal/tunnel/session"
)

// Under load, a sender that receives at its address (so it has cookies) and floods valid
// initiations gets at most hsPerSourceBurst of them worked on at once, the rest counted
// (drop_handshake_rate); a mac2 made with another address's cookie gets a cookie reply, no work.
func TestHandshakePerSourceLimit(t *testing.T) {
	s := newFuzzSite(t)
	tt := s.t
	now := tt.now()
	tt.loadUntil.Store(now + int64(time.Hour))
	key := session.MAC1Key(tt.pub)
	cookieFor := func(src netip.AddrPort, mac1 []byte) session.Cookie {
		c, err := session.OpenCookieReply(tt.cookies.AppendReply(nil, mac1, src, tt.now()), tt.pub, mac1)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for range 50 {
		msg := make([]byte, session.InitLen)
		rand.Read(msg)
		b := session.AppendMAC1(msg, &key)
		c := cookieFor(s.src, b[len(msg):])
		tt.initiation(s.u, s.src, 0, session.AppendMAC2(b, &c))
	}
	queued, limited := len(tt.hsq), tt.stats.DropHandshakeRate.Load()
	if queued != hsPerSourceBurst || limited != 50-hsPerSourceBurst {
		t.Errorf("50 valid initiations from one address under load: %d worked on, %d limited; want %d and %d", queued, limited, hsPerSourceBurst, 50-hsPerSourceBurst)
	}
	msg := make([]byte, session.InitLen)
	rand.Read(msg)
	b := session.AppendMAC1(msg, &key)
	c := cookieFor(netip.MustParseAddrPort("192.0.2.99:4754"), b[len(msg):])
	sent := tt.stats.CookiesSent.Load()
	tt.initiation(s.u, s.src, 0, session.AppendMAC2(b, &c))
	if tt.stats.CookiesSent.Load() != sent+1 || len(tt.hsq) != queued {
		t.Error("a mac2 made with another address's cookie was not answered with a cookie reply")
	}
}

// The per-address table is bounded: a full table refuses new addresses until buckets refill.
func TestHandshakeSourceTableBounded(t *testing.T) {
	var l hsSourceLimit
	now := int64(time.Hour)
	for i := range hsSources {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		if !l.take(a, now) {
			t.Fatalf("address %d refused before the table is full", i)
		}
	}
	extra := netip.MustParseAddr("192.0.2.1")
	if l.take(extra, now) {
		t.Error("a full table took a new address")
	}
	if !l.take(extra, now+int64(time.Second)) {
		t.Error("a new address was refused after every bucket refilled")
	}
	if len(l.m) > hsSources {
		t.Errorf("table of %d entries, bound %d", len(l.m), hsSources)
	}
}
