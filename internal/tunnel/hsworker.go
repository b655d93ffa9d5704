package tunnel

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"braid/internal/tunnel/session"
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
//  3. the worker takes at most hsRate initiations a second (bursts of hsBurst) and holds at
//     most hsQueue waiting; beyond that they are dropped and counted (drop_handshake_busy).
//     A peer's initiation lost that way is sent again 500 ms later.
const (
	hsQueue = 64
	hsRate  = 500 // a second: about a tenth of a core of X25519 on this machine
	hsBurst = 100
)

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
	msg, ok := session.CheckMAC1(body, &t.mac1)
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
	if !t.mayInitiate(u, unmapPort(src)) {
		t.stats.DropUnknownPath.Add(1)
		return
	}
	if !t.hsBudget.take(t.now()) {
		t.stats.DropHandshakeBusy.Add(1)
		return
	}
	select {
	case t.hsq <- hsJob{u: u, src: src, id: id, msg: append([]byte(nil), msg...)}:
	default:
		t.stats.DropHandshakeBusy.Add(1)
	}
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
