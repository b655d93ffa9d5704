package tunnel

import (
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"

	"braid/internal/wire/mpt"

	"golang.org/x/sys/unix"
)

// This file is mpt mode's path-status exchange with the peer on MPT's command port (0xA2
// P_STATUS_CHANGE, tunnels.md section 3; docs/tunnel-wire.md). A status change runs MPT's
// four rounds: the initiator sends round 1 with its token, the responder answers round 2 with
// a fresh token of its own (the challenge), the initiator sends round 3 with that token, and
// the responder applies the status and answers round 4. Each round is sent up to
// mptCmdTries times, mptCmdTimeout apart, as in MPT. Unlike MPT, the exchange runs in its own
// goroutine, never from the data path, and no lock is held across it.
//
// The command socket faces the Internet: a datagram is accepted only from one of the
// configured paths' remote addresses, only a 0xA2 of the configured auth_type that names a
// configured path, and with auth_type 2 only with the right SHA-256; with auth_type 1 and 2,
// round 3 must carry the challenge braid sent in round 2. Everything else is counted and
// dropped without an answer.

const (
	mptCmdTimeout = 500 * time.Millisecond
	mptCmdTries   = 6
	// mptChallengeLife is how long a challenge sent in round 2 is accepted in round 3.
	mptChallengeLife = mptCmdTries * mptCmdTimeout
)

// mptCmd is the state of the command port.
type mptCmd struct {
	conn     Conn
	port     uint16 // the peer's command port
	authType uint8
	key      []byte
	replies  chan mptReply // rounds 2 and 4, for the initiator
	wake     chan struct{} // a path's status to announce changed
}

type mptReply struct {
	msg mpt.StatusChange
	src netip.AddrPort
}

// MPT path statuses as braid shows them (MPTPathStatus.Status).
const (
	mptStatusOK       = "ok"
	mptStatusDead     = "path_down"        // no keepalive for the dead time
	mptStatusIfDown   = "if_down"          // the local interface is down
	mptStatusManual   = "path_down_manual" // braid tunnel path down
	mptStatusPeerDown = "peer_down"        // the peer announced the path down
)

// localStatus is the status braid announces for p: OK, or PATH_DOWN when p's interface is
// down or p was taken down by hand (MPT propagates PATH_DOWN for both).
func (p *mptPath) localStatus() uint8 {
	if p.ifDown.Load() || p.manual.Load() {
		return mpt.StatusPathDown
	}
	return mpt.StatusOK
}

// announce asks the command goroutine to tell the peer p's local status.
func (t *MPTTunnel) announce(p *mptPath) {
	if t.cmd == nil {
		return
	}
	p.announce.Store(true)
	select {
	case t.cmd.wake <- struct{}{}:
	default:
	}
}

// SetAdminDown takes path id (1-based) down by hand, MPT's "path down" (PATH_DOWN_MANUAL here,
// PATH_DOWN told to the peer), or brings it back ("path up"). It reports whether the path
// exists.
func (t *MPTTunnel) SetAdminDown(id int, down bool) bool {
	if id < 1 || id > len(t.paths) {
		return false
	}
	p := t.paths[id-1]
	if p.manual.Swap(down) != down {
		if !down {
			p.lastRx.Store(t.now())
			p.alive.Store(true)
		}
		t.log.Info("mpt path set by hand", "path", id, "down", down)
		t.announce(p)
	}
	return true
}

// readCmd receives the datagrams of the command port until it closes.
func (t *MPTTunnel) readCmd() {
	b := make([]byte, 2048)
	for {
		n, src, err := t.cmd.conn.ReadFromUDPAddrPort(b)
		if err != nil {
			if t.closing.Load() {
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.log.Warn("mpt command port", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		t.command(src, b[:n])
	}
}

// fromPeer reports whether a is one of the paths' remote addresses.
func (t *MPTTunnel) fromPeer(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, p := range t.paths {
		if p.remote.Addr() == a {
			return true
		}
	}
	return false
}

// pathNamed returns the path whose remote address is remote and local address local.
func (t *MPTTunnel) pathNamed(remote, local netip.Addr) *mptPath {
	remote, local = remote.Unmap(), local.Unmap()
	for _, p := range t.paths {
		if p.remote.Addr() == remote && p.local == local {
			return p
		}
	}
	return nil
}

// command handles one datagram of the command port.
func (t *MPTTunnel) command(src netip.AddrPort, b []byte) {
	c := t.cmd
	t.stats.CmdReceived.Add(1)
	if !t.fromPeer(src.Addr()) {
		t.stats.CmdRefusedSource.Add(1)
		return
	}
	if len(b) > 0 && b[0] != mpt.CmdPathStatusChange {
		t.stats.CmdRefusedUnsupported.Add(1)
		return
	}
	var m mpt.StatusChange
	if _, err := m.Decode(b, c.key); err != nil {
		if errors.Is(err, mpt.ErrAuth) {
			t.stats.CmdRefusedAuth.Add(1)
		} else {
			t.stats.CmdRefusedMalformed.Add(1)
		}
		return
	}
	if m.AuthType != c.authType {
		t.stats.CmdRefusedAuth.Add(1)
		return
	}
	p := t.pathNamed(m.Local, m.Remote)
	if p == nil {
		t.stats.CmdRefusedNoPath.Add(1)
		return
	}
	switch m.Round {
	case 2, 4:
		select {
		case c.replies <- mptReply{m, src}:
		default:
		}
		return
	case 1:
		now := t.now()
		p.cmdMu.Lock()
		if p.challengeAt == 0 || now-p.challengeAt > int64(mptChallengeLife) || m.Token != p.request {
			// A retransmitted round 1 (the same token) gets the same challenge.
			rand.Read(p.challenge[:])
			p.challengeAt, p.request = now, m.Token
		}
		tok := p.challenge
		p.cmdMu.Unlock()
		t.replyCmd(p, m, 2, tok, src)
	case 3:
		p.cmdMu.Lock()
		ok := c.authType == mpt.AuthNone ||
			p.challengeAt != 0 && t.now()-p.challengeAt <= int64(mptChallengeLife) && m.Token == p.challenge
		p.cmdMu.Unlock()
		if !ok {
			t.stats.CmdRefusedAuth.Add(1)
			return
		}
		t.peerStatus(p, m.Status)
		t.replyCmd(p, m, 4, m.Token, src)
	default:
		t.stats.CmdRefusedMalformed.Add(1)
	}
}

// replyCmd answers m, a round 1 or 3 for p, with the next round.
func (t *MPTTunnel) replyCmd(p *mptPath, m mpt.StatusChange, round uint8, tok [mpt.TokenLen]byte, dst netip.AddrPort) {
	r := mpt.StatusChange{Status: m.Status, AuthType: t.cmd.authType, Round: round, IPVer: m.IPVer, Local: p.local, Remote: p.remote.Addr()}
	if r.AuthType != mpt.AuthNone {
		r.Token = tok
	}
	if err := t.cmd.conn.Send(r.Append(nil, t.cmd.key), dst); err == nil {
		t.stats.CmdSent.Add(1)
	}
}

// peerStatus applies the status the peer announced for p.
func (t *MPTTunnel) peerStatus(p *mptPath, status uint8) {
	t.stats.CmdApplied.Add(1)
	down := status != mpt.StatusOK
	if p.peerDown.Swap(down) == down {
		return
	}
	if !down {
		p.lastRx.Store(t.now())
		p.alive.Store(true)
	}
	t.log.Info("mpt path status from the peer", "path", p.id+1, "uplink", p.up.name, "remote", p.remote, "status", status)
}

// announcer runs the exchanges that tell the peer the paths' local status, one at a time, the
// latest status of each path winning.
func (t *MPTTunnel) announcer(done <-chan struct{}) {
	c := t.cmd
	for {
		for _, p := range t.paths {
			if !p.announce.Swap(false) {
				continue
			}
			st := p.localStatus()
			if err := t.exchange(p, st, done); err != nil {
				t.stats.CmdExchangeFailed.Add(1)
				if !p.cmdFailing.Swap(true) { // once, not on every retry
					t.log.Warn("mpt path status not confirmed by the peer; is its command port reachable?", "path", p.id+1, "status", st,
						"port", c.port, "err", err)
				}
				if p.localStatus() == mpt.StatusOK {
					// Retried by the timers until the peer answers: a path stays down on the
					// peer's side until it hears OK.
					p.retryAt.Store(t.now() + int64(mptChallengeLife))
				}
			} else {
				p.cmdFailing.Store(false)
				t.log.Info("mpt path status confirmed by the peer", "path", p.id+1, "status", st)
			}
		}
		select {
		case <-done:
			return
		case <-c.wake:
		}
	}
}

// exchange runs MPT's four rounds as the initiator, telling the peer that p's status is st.
func (t *MPTTunnel) exchange(p *mptPath, st uint8, done <-chan struct{}) error {
	c := t.cmd
	ipv := uint8(4)
	if p.remote.Addr().Is6() {
		ipv = 6
	}
	m := mpt.StatusChange{Status: st, AuthType: c.authType, Round: 1, IPVer: ipv, Local: p.local, Remote: p.remote.Addr()}
	if m.AuthType != mpt.AuthNone {
		rand.Read(m.Token[:])
	}
	for len(c.replies) > 0 { // stale replies of an earlier exchange
		<-c.replies
	}
	try := 0
	for _, round := range []uint8{1, 3} {
		m.Round = round
		pkt := m.Append(nil, c.key)
		for {
			if try >= mptCmdTries*2 || round == 1 && try >= mptCmdTries {
				return errors.New("no answer")
			}
			dst := t.cmdDst(p, try)
			try++
			if c.conn.Send(pkt, dst) == nil {
				t.stats.CmdSent.Add(1)
			}
			r, ok, stop := t.awaitReply(p, round+1, m, done)
			if stop {
				return errors.New("closing")
			}
			if ok {
				if round == 1 {
					m.Token = r.Token
					try = mptCmdTries
				}
				break
			}
		}
	}
	return nil
}

// awaitReply waits up to mptCmdTimeout for round of p's exchange.
func (t *MPTTunnel) awaitReply(p *mptPath, round uint8, m mpt.StatusChange, done <-chan struct{}) (mpt.StatusChange, bool, bool) {
	timer := time.NewTimer(mptCmdTimeout)
	defer timer.Stop()
	for {
		select {
		case <-done:
			return mpt.StatusChange{}, false, true
		case <-timer.C:
			return mpt.StatusChange{}, false, false
		case r := <-t.cmd.replies:
			if r.msg.Round != round || r.msg.Status != m.Status || r.msg.Local.Unmap() != p.remote.Addr() {
				continue
			}
			if round == 4 && t.cmd.authType != mpt.AuthNone && r.msg.Token != m.Token {
				t.stats.CmdRefusedAuth.Add(1)
				continue
			}
			return r.msg, true, false
		}
	}
}

// cmdDst returns where try number try of an exchange about p goes: the peer's command port at
// the remote address of a usable path, another than p first (p may be why the exchange runs),
// then p's own; the tries go round the candidates.
func (t *MPTTunnel) cmdDst(p *mptPath, try int) netip.AddrPort {
	var cand []netip.Addr
	seen := map[netip.Addr]bool{}
	for _, q := range t.paths {
		if q != p && q.usable() && !seen[q.remote.Addr()] {
			seen[q.remote.Addr()] = true
			cand = append(cand, q.remote.Addr())
		}
	}
	if !seen[p.remote.Addr()] {
		cand = append(cand, p.remote.Addr())
	}
	return netip.AddrPortFrom(cand[try%len(cand)], t.cmd.port)
}

// ifaceUp reports whether p's interface is up and running, asked with SIOCGIFFLAGS on p's
// uplink socket (so in the socket's network namespace): false when the interface is down, has
// no carrier or no longer exists, true when it cannot tell.
func (p *mptPath) ifaceUp() bool {
	sc, ok := p.up.conn.(syscall.Conn)
	if !ok || p.iface == "" {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	up := true
	raw.Control(func(fd uintptr) {
		ifr, err := unix.NewIfreq(p.iface)
		if err != nil {
			return
		}
		if err := unix.IoctlIfreq(int(fd), unix.SIOCGIFFLAGS, ifr); err != nil {
			up = err != unix.ENODEV
			return
		}
		f := ifr.Uint16()
		up = f&unix.IFF_UP != 0 && f&unix.IFF_RUNNING != 0
	})
	return up
}

// checkIface takes p down at once when its interface goes down, and back up when it returns,
// announcing both to the peer.
func (t *MPTTunnel) checkIface(p *mptPath, now int64) {
	if p.iface == "" {
		return
	}
	down := !p.ifaceUp()
	if p.ifDown.Load() == down {
		return
	}
	p.ifDown.Store(down)
	if !down {
		p.lastRx.Store(now)
		p.alive.Store(true)
		p.nextKA = now // a keepalive at once
	}
	t.log.Info("mpt path interface", "path", p.id+1, "interface", p.iface, "down", down)
	t.announce(p)
}
