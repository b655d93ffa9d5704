package tunnel

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync"
	"time"

	"braid/internal/tunnel/session"
	"braid/internal/wire/mpath"
)

// Handshake initiations are the one message anyone may send a tunnel that costs it real work:
// four X25519 operations before the sender is known to be a peer. They are sorted in the
// uplink's receive loop by what costs almost nothing, and the crypto runs in one worker of its
// own, within a budget, so that a flood of them stalls neither the uplink's data nor the
// device (issue 18 item 11; docs/security.md, "Tunnel"):
//
//  1. the MAC that closes an initiation (session.CheckMAC1, keyed with this side's public key)
//     drops junk and scans: one BLAKE2s;
//  2. the sender's address must be one a peer may initiate from: a path's remote, or any
//     address on an uplink where a peer without fixed remotes learns its paths;
//  3. under load (the budget ran out, or the queue is an eighth full, within the last
//     hsLoadFor), only initiations closed by a valid mac2 go on: the others are answered with
//     a cookie reply (session/cookie.go, as WireGuard's), which tells their sender the cookie of
//     its address, and the sender's next initiation from there carries mac2. A flood from
//     spoofed addresses costs one cookie reply each and takes no place from a peer that
//     receives at its address (cookies_sent);
//  4. the worker takes at most hsRate initiations a second (bursts of hsBurst) and holds at
//     most hsQueue waiting; beyond that they are dropped and counted (drop_handshake_busy).
//     A peer's initiation lost that way is sent again 500 ms later.
//
// A sender that does receive at its address can get cookies: under load, each address may
// have at most hsPerSourceRate initiations a second worked on (bursts of hsPerSourceBurst), as
// WireGuard's rate limiter; the table of addresses holds at most hsSources, addresses that
// proved they receive there (drop_handshake_rate beyond).
const (
	hsQueue   = 64
	hsRate    = 500 // a second: about a tenth of a core of X25519 on this machine
	hsBurst   = 100
	hsLoadFor = time.Second

	hsPerSourceRate  = 20
	hsPerSourceBurst = 5
	hsSources        = 4096
)

// hsSourceLimit is the per-address budget of initiations under load.
type hsSourceLimit struct {
	mu sync.Mutex
	m  map[netip.Addr]*hsBucket
}

type hsBucket struct {
	tokens float64
	at     int64
}

// take reports whether an initiation from a may be worked on at now.
func (l *hsSourceLimit) take(a netip.Addr, now int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[netip.Addr]*hsBucket{}
	}
	b := l.m[a]
	if b == nil {
		if len(l.m) >= hsSources {
			// Forget the addresses whose bucket has filled up again since.
			for k, v := range l.m {
				if time.Duration(now-v.at) >= time.Second*hsPerSourceBurst/hsPerSourceRate {
					delete(l.m, k)
				}
			}
			if len(l.m) >= hsSources {
				return false
			}
		}
		b = &hsBucket{tokens: hsPerSourceBurst, at: now}
		l.m[a] = b
	}
	b.tokens = min(b.tokens+float64(now-b.at)/float64(time.Second)*hsPerSourceRate, hsPerSourceBurst)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// hsJob is one initiation for the worker.
type hsJob struct {
	u   *uplink
	src netip.AddrPort
	id  uint8
	msg []byte
}

// hsBudget is the worker's token bucket.
type hsBudget struct {
	mu     sync.Mutex
	tokens float64
	at     int64
}

func (b *hsBudget) take(now int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.tokens+float64(now-b.at)/float64(time.Second)*hsRate, hsBurst)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// initiation sorts an initiation that arrived on u from src (the sender's path id) and hands
// it to the handshake worker.
func (t *Tunnel) initiation(u *uplink, src netip.AddrPort, id uint8, body []byte) {
	msg, mac1, mac2, ok := session.SplitInitiation(body, &t.mac1)
	if !ok {
		if len(body) == session.V1InitLen {
			// Protocol version 1 had no MAC: an older braid, or junk of that length.
			t.stats.DropVersion.Add(1)
			if !t.v1Warned.Swap(true) {
				t.log.Warn("handshake initiation of protocol version 1 refused (an older braid: upgrade it); not authenticated, so the sender is not known", "from", src)
			}
			return
		}
		t.stats.DropHandshakeMAC.Add(1)
		return
	}
	src = unmapPort(src)
	if !t.mayInitiate(u, src) {
		t.stats.DropUnknownPath.Add(1)
		return
	}
	now := t.now()
	if len(t.hsq) >= hsQueue/8 {
		t.loadUntil.Store(now + int64(hsLoadFor))
	}
	if now < t.loadUntil.Load() {
		if !t.cookies.CheckMAC2(body[:len(msg)+len(mac1)], mac2, src, now) {
			reply := t.cookies.AppendReply(make([]byte, 0, session.CookieReplyLen), mac1, src, now)
			t.sendClearTo(u, src, 0, cookieReplyKey(mac1), mpath.TypeCookieReply, reply)
			t.stats.CookiesSent.Add(1)
			return
		}
		if !t.hsSources.take(src.Addr(), now) {
			t.stats.DropHandshakeRate.Add(1)
			return
		}
	}
	if !t.hsBudget.take(now) {
		t.loadUntil.Store(now + int64(hsLoadFor))
		t.stats.DropHandshakeBusy.Add(1)
		return
	}
	select {
	case t.hsq <- hsJob{u: u, src: src, id: id, msg: append([]byte(nil), msg...)}:
	default:
		t.loadUntil.Store(now + int64(hsLoadFor))
		t.stats.DropHandshakeBusy.Add(1)
	}
}

// cookieReplyKey is the GRE key of a cookie reply to the initiation closed by mac1: its first
// four bytes, which name the initiation to its sender (the sender index is sealed).
func cookieReplyKey(mac1 []byte) uint32 {
	return binary.BigEndian.Uint32(mac1)
}

// onCookieReply takes a cookie reply to one of this side's initiations, received on u from
// src, for the path of the initiation's peer at that address.
func (t *Tunnel) onCookieReply(u *uplink, src netip.AddrPort, key uint32, body []byte) {
	src = unmapPort(src)
	for _, p := range t.peerList() {
		p.mu.Lock()
		if p.hs == nil || cookieReplyKey(p.hsMAC1[:]) != key {
			p.mu.Unlock()
			continue
		}
		mac1 := p.hsMAC1
		p.mu.Unlock()
		c, err := session.OpenCookieReply(body, p.pub, mac1[:])
		if err != nil {
			continue
		}
		pp := p.pathFrom(u, src)
		if pp == nil {
			break
		}
		p.mu.Lock()
		pp.cookie, pp.cookieAt = c, t.now()
		p.mu.Unlock()
		t.stats.CookiesReceived.Add(1)
		return
	}
	t.stats.DropCookieReply.Add(1)
}

// mayInitiate reports whether some peer may initiate from src on u.
func (t *Tunnel) mayInitiate(u *uplink, src netip.AddrPort) bool {
	for _, p := range t.peerList() {
		if _, learnable := p.learnable(u); learnable || p.pathFrom(u, src) != nil {
			return true
		}
	}
	return false
}

// handshakes is the handshake worker.
func (t *Tunnel) handshakes(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-t.hsq:
			t.onInit(j.u, j.src, j.id, j.msg)
		}
	}
}
