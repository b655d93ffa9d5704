package tunnel

import (
	"errors"
	"net/netip"
	"time"

	"braid/internal/sched"
	"braid/internal/tunnel/path"
	"braid/internal/tunnel/session"
	"braid/internal/wire/mpath"
)

// Paths that follow their peer, and paths learned from the peer's packets.
//
// A path is known by the local uplink a packet arrives on and by the peer's own ID for the
// path, which every packet carries in its authenticated header (mpath.Header.Path); its address
// is where the peer's packets on it come from now. A packet that opens on the peer's session
// (AEAD and replay window) and comes from another address than its path's moves the path there:
// a NAT that rebinds, or a modem that reconnects with a new address, costs no handshake and no
// packet. A packet that does not open moves nothing, and is counted apart when its source is
// none of the peer's paths (drop_auth_new_source, drop_replay_new_source). Configured paths
// follow too: their remote is only where the first packets go.
//
// A peer declared without remote addresses (a hub's view of sites behind NAT) starts with no
// path; each (uplink, peer's path ID) from which a packet of its session opens becomes one, on
// the uplinks its declaration names, up to its MaxPaths. At the bound a new one takes the place
// of a learned path on the same uplink that has been down and silent for reuseAfter; while
// there is none it is dropped (drop_path_limit, logged once) and the known paths go on. Its handshake initiations are answered from any address, since
// the handshake itself authenticates the peer's static key; a fixed peer's only from its paths.
// An initiation never makes or moves a path: it can be replayed from anywhere for the 2 s in
// which its copies are expected, a data packet cannot.

// Defaults of a peer's keepalive and learned paths.
const (
	// DefaultKeepalive is the longest a path stays without a packet to the peer: well under
	// the 30 s after which many NATs forget a UDP mapping (RFC 4787 asks for 2 minutes, not
	// all obey). Probes every probe_interval keep it in practice; the keepalive is the bound
	// when they are sparser.
	DefaultKeepalive = 10 * time.Second
	// DefaultMaxPaths bounds the paths learned for one peer: a branch with four uplinks to a
	// hub with four addresses.
	DefaultMaxPaths = 16
)

// reuseAfter is how long a learned path must have been silent (down, nothing heard) before a
// new path of its peer on the same uplink may take its place at max_paths. A variable so that
// tests can shorten it (export_test.go).
var reuseAfter = time.Minute

// moveLogEvery rate-limits the log of moves: a path whose packets come from two sources in
// turn (an attacker replaying captured, undelivered packets) must not flood it.
const moveLogEvery = time.Second

// remote is where the path's packets go now.
func (pp *peerPath) remote() netip.AddrPort { return *pp.dst.Load() }

// pathList is the peer's paths, for readers that do not hold p.mu.
func (p *peer) pathList() []*peerPath { return *p.ro.Load() }

// publishPathsLocked makes p.paths visible to pathList; p.mu is held.
func (p *peer) publishPathsLocked() {
	ps := p.paths
	p.ro.Store(&ps)
}

// pathFrom returns the path that arrives on uplink u from src, by address alone.
func (p *peer) pathFrom(u *uplink, src netip.AddrPort) *peerPath {
	src = unmapPort(src)
	for _, pp := range p.pathList() {
		if pp.up == u && pp.remote() == src {
			return pp
		}
	}
	return nil
}

// pathOf returns the path of a packet that opened on p's session: it arrived on uplink u from
// src and was sent on the peer's path id. A path that moved, or a new path of a peer whose
// paths are learned, is handled by roam; nil (counted) when the packet belongs to no path.
func (p *peer) pathOf(u *uplink, src netip.AddrPort, id uint8) *peerPath {
	src = unmapPort(src)
	for _, pp := range p.pathList() {
		if pp.up == u && pp.peerID.Load() == int32(id) && pp.remote() == src {
			return pp
		}
	}
	return p.roam(u, src, id)
}

// roam finds or makes the path of an authenticated packet the fast lookup missed: the path the
// peer calls id on u, moved to src if it came from elsewhere; a configured path at src that
// had not heard the peer's ID yet; or a new learned path.
func (p *peer) roam(u *uplink, src netip.AddrPort, id uint8) *peerPath {
	t := p.t
	p.mu.Lock()
	var byID, byAddr *peerPath
	for _, pp := range p.paths {
		if pp.up != u {
			continue
		}
		if pp.peerID.Load() == int32(id) {
			byID = pp
		}
		if byAddr == nil && pp.remote() == src {
			byAddr = pp
		}
	}
	switch {
	case byID != nil:
		if from := byID.remote(); from != src {
			byID.dst.Store(&src)
			byID.movedAt, byID.moves = time.Now(), byID.moves+1
			t.stats.PathMoves.Add(1)
			logIt := time.Since(byID.movedLog) >= moveLogEvery
			if logIt {
				byID.movedLog = byID.movedAt
			}
			p.mu.Unlock()
			if logIt {
				t.log.Info("path moved", "peer", p.name, "path", byID.id+1, "uplink", u.name, "from", from, "to", src)
			}
			return byID
		}
		p.mu.Unlock()
		return byID
	case byAddr != nil:
		// The first packet on a configured path, or a peer that numbers its paths anew
		// (restarted with another site file): the address names the path.
		byAddr.peerID.Store(int32(id))
		p.mu.Unlock()
		return byAddr
	}
	tmpl, learnable := p.learnable(u)
	switch {
	case !learnable:
		p.mu.Unlock()
		t.stats.DropUnknownPath.Add(1)
		return nil
	case len(p.paths) >= int(p.maxPaths.Load()):
		if old := p.staleLocked(u, t.now()); old != nil {
			// The peer numbers its paths anew (it restarted with another site file) or one
			// of its uplinks went for good: the path silent longest takes the new one.
			from, oldID := old.remote(), old.peerID.Load()
			old.peerID.Store(int32(id))
			old.dst.Store(&src)
			old.movedAt, old.moves = time.Now(), old.moves+1
			p.mu.Unlock()
			t.stats.PathMoves.Add(1)
			t.log.Info("learned path reused", "peer", p.name, "path", old.id+1, "uplink", u.name,
				"from", from, "peer_path", oldID+1, "to", src, "now_peer_path", id+1, "silent_for", reuseAfter)
			return old
		}
		p.mu.Unlock()
		t.stats.DropPathLimit.Add(1)
		if !p.limitWarned.Swap(true) {
			t.log.Warn("peer has as many learned paths as max_paths: packets on a new one are dropped (drop_path_limit) while none has been silent long enough to be reused",
				"peer", p.name, "max_paths", p.maxPaths.Load(), "uplink", u.name, "from", src, "reuse_after", reuseAfter)
		}
		return nil
	}
	now := t.now()
	tmpl.Remote = src
	pp, err := p.newPath(p.freeIDLocked(), u, tmpl, now)
	if err != nil {
		p.mu.Unlock()
		t.stats.DropUnknownPath.Add(1)
		return nil
	}
	pp.learned, pp.learnedAt = true, time.Now()
	pp.peerID.Store(int32(id))
	p.paths = append(p.paths, pp)
	p.snap = append(p.snap, sched.Path{})
	p.publishPathsLocked()
	p.mu.Unlock()
	t.stats.PathsLearned.Add(1)
	t.log.Info("path learned", "peer", p.name, "path", pp.id+1, "uplink", u.name, "remote", src, "peer_path", id+1)
	return pp
}

// staleLocked returns the learned path on u that has been silent longest, if it is down and
// has heard nothing for reuseAfter; p.mu is held.
func (p *peer) staleLocked(u *uplink, now int64) *peerPath {
	var best *peerPath
	var bestHeard int64
	for _, pp := range p.paths {
		if pp.up != u || !pp.learned {
			continue
		}
		s := pp.est.Snapshot()
		if s.State == path.Up || now-s.LastHeard < int64(reuseAfter) {
			continue
		}
		if best == nil || s.LastHeard < bestHeard {
			best, bestHeard = pp, s.LastHeard
		}
	}
	return best
}

// knows reports whether src on u is the address of one of p's paths.
func (p *peer) knows(u *uplink, src netip.AddrPort) bool { return p.pathFrom(u, src) != nil }

// countOpenFailure counts a packet that did not open on p's session: apart when it came from an
// address that is none of the peer's paths, since such a packet is what an attacker who wants
// to move a path sends (and it moves none).
func (t *Tunnel) countOpenFailure(p *peer, u *uplink, src netip.AddrPort, err error) {
	fresh := !p.knows(u, src)
	switch {
	case errors.Is(err, session.ErrReplay) && fresh:
		t.stats.DropReplayNewSource.Add(1)
	case errors.Is(err, session.ErrReplay):
		t.stats.DropReplay.Add(1)
	case fresh:
		t.stats.DropAuthNewSource.Add(1)
	default:
		t.stats.DropAuth.Add(1)
	}
}

// keepalive sends an empty feedback on a path that has sent nothing for the peer's keepalive
// interval, so that the NATs along it keep their mapping (probes do it while they are more
// frequent). The peer accepts it as a packet of the path and ignores its content. Timers
// goroutine only.
func (t *Tunnel) keepalive(p *peer, pp *peerPath, now int64) {
	n := pp.txPackets.Load()
	if n != pp.kaPackets || pp.kaAt == 0 {
		pp.kaPackets, pp.kaAt = n, now
		return
	}
	if now-pp.kaAt < p.keepalive.Load() {
		return
	}
	pp.kaAt = now
	var fb mpath.Feedback
	if t.sendSealed(p, pp, mpath.TypeFeedback, fb.Encode) {
		t.stats.KeepalivesSent.Add(1)
	}
}

func unmapPort(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// origin says how the status should describe a path: configured or learned, and its moves.
func (pp *peerPath) origin() string {
	if pp.learned {
		return "learned"
	}
	return "configured"
}

// how says how the path's remote address was found: configured, learned, or roamed (moved
// there by the peer's packets). p.mu is held.
func (pp *peerPath) how() string {
	if pp.moves > 0 {
		return "roamed"
	}
	return pp.origin()
}
