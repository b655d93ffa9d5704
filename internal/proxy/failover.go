package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"braid/internal/mptcp/info"
	"braid/internal/mptcp/pmnl"
)

// Send-side failover. MPTCP reacts to a dead path only after several retransmission timeouts,
// and MP_PRIO from the far end never arrives over a dead path, so each proxy watches what it
// sends itself: every failoverPoll it reads MPTCP_FULL_INFO of every relayed connection, and
// a subflow with data in flight and no acknowledgement for deadAckAge (at least 150 ms, one
// and a half base RTTs on long paths) is set to backup through the userspace path manager
// (SET_FLAGS), which moves new data to the other subflows at once. When it is acknowledged again it is set
// back. A subflow still dead after destroyAfter is closed (SUBFLOW_DESTROY): MPTCP then
// re-sends what was in flight on it over the others at once instead of after its
// retransmission timers, and the connection's client side (the fullmesh policy) joins again
// over that path, retrying until the path is back.
//
// The backup flag moves only new data: what the dead subflow holds (in flight and queued in
// it, a megabyte and more on the federation paper's wired path) stays there until the subflow
// is closed, and the receiver can deliver nothing past it; meanwhile the kernel fills the
// other subflows' send buffers with newer data, which the re-sent data then waits behind. So
// the close follows at once (destroyAfter was 600 ms, and the detection took two smoothed
// RTTs, 480 ms behind the wired path's full queue: a cut of it stalled the download for
// 2-3 s; see docs/proxy.md). The silence is counted in base RTTs (tcpi_min_rtt), not
// smoothed ones: the smoothed RTT of a subflow behind a full queue is twice the path's, and a
// busy subflow is acknowledged continuously, so one that hears nothing for one and a half
// path RTTs has lost its path or its whole window. Not before its retransmission timeout,
// though (SRTT + 4 RTTVAR): two subflows share the LTE link's queue, and one of them went
// 244 ms without an acknowledgement (base RTT 160 ms, smoothed 300 ms) while the other's data
// filled the queue ahead of its own; closed, it stranded its data behind the other's.
//
// The receiving end of a subflow has nothing unacknowledged to judge by, and the sender's
// close does not reach it over the cut path: it kept the subflow, so its path manager (the
// one that joins, when it is the client side) made no new one when the path came back. Every
// MPTCP connection of the proxies sends keepalives on idle subflows every second
// (mptcpKeepAlive), so a subflow that has heard nothing from its peer for peerSilentAfter
// (or four RTTs on longer paths) has lost it, and is closed as well.
//
// Closing the dead subflow makes MPTCP re-send everything not yet acknowledged at the
// connection level, from the oldest byte on, over the live subflows; but TCP sends what a
// subflow has queued in order, so the re-sent data waits behind the data the kernel's scheduler
// had already queued on the live subflows and not yet sent (tcpi_notsent_bytes), which on the
// federation paper's links was 0-1 MB on the LTE subflows (up to 0.8 s at 10 Mbit/s; the
// scheduler fills subflows by its own estimate whatever TCP_NOTSENT_LOWAT says). Nothing
// further can be delivered in order meanwhile: that queue was most of a cut's gap (1.1-2.1 s
// when it was large, 0.6-0.7 s when it was empty). So when a dead subflow is closed, every other
// live subflow whose unsent queue would take longer than FailoverMaxBacklog to send at its
// delivery rate is aborted (a reset, through sock_diag: a subflow closed through the path
// manager keeps sending its queue before its FIN), keeping at least the one whose queue drains
// first. MPTCP re-sends the aborted subflows' data too, and the far end's path manager joins
// again over their paths, which are alive.
const (
	failoverPoll    = 25 * time.Millisecond
	deadAckAge      = 150 * time.Millisecond
	destroyAfter    = 0               // the poll after the one that set it to backup
	reinjectHold    = 5 * time.Second // at most
	suspectWait     = 100 * time.Millisecond
	peerSilentAfter = 2500 * time.Millisecond

	// DefaultFailoverMaxBacklog is the default of Options.FailoverMaxBacklog.
	DefaultFailoverMaxBacklog = 100 * time.Millisecond
	// DefaultSendBacklog is the default of Options.SendBacklog (relay.go).
	DefaultSendBacklog = 100 * time.Millisecond
)

type subflowKey struct {
	conn          uint64
	local, remote netip.AddrPort
}

// failover runs the monitor until ctx ends.
func (p *Proxy) failover(ctx context.Context, c *pmnl.Client) {
	var diag *info.Diag // for aborting subflows; opened on first use
	defer func() {
		if diag != nil {
			diag.Close()
		}
	}()
	if p.o.FailoverMaxBacklog > 0 {
		var err error
		if diag, err = info.OpenDiag(info.Options{}); err != nil {
			p.log.Warn("failover: no sock_diag socket; live subflows are not reset on a failover", "err", err)
		}
	}
	marked := map[subflowKey]time.Time{} // subflows set to backup, since when
	closed := map[subflowKey]bool{}      // closed here; listed until the kernel lets them go
	busy := map[subflowKey]time.Time{}   // subflows with data in flight, since when (at the latest)
	passes := map[uint64]time.Time{}     // connections: when a close of ours last made the kernel re-send
	tick := time.NewTicker(failoverPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p.mu.Lock()
		live := make([]*conn, 0, len(p.conns))
		for _, cn := range p.conns {
			live = append(live, cn)
		}
		p.mu.Unlock()
		seen := map[subflowKey]bool{}
		liveIDs := map[uint64]bool{}
		for _, cn := range live {
			liveIDs[cn.id] = true
			full, err := info.Full(cn.mp)
			if err != nil {
				continue
			}
			now := time.Now()
			for _, s := range full.Subflows {
				k := subflowKey{cn.id, s.Local, s.Remote}
				seen[k] = true
				if s.TCP.Unacked == 0 {
					delete(busy, k)
				} else if _, ok := busy[k]; !ok {
					// The oldest data in flight left no later than the last data sent.
					busy[k] = now.Add(-s.TCP.LastDataSent)
				}
			}
			maxBacklog := p.o.FailoverMaxBacklog
			if diag == nil {
				maxBacklog = 0 // no resets: a dead subflow is closed instead
			}
			for _, a := range failoverDecide(now, cn.id, full.Subflows, marked, closed, busy, maxBacklog, passes[cn.id]) {
				s := a.sub
				switch a.kind {
				case failBackup:
					if p.setBackup(ctx, c, full.Info.Token, s, true) {
						marked[a.key] = time.Now()
						cn.t.c.failovers.Add(1)
						if p.limiter.allow("failover") {
							p.log.Info("path failed: subflow set to backup", "tenant", cn.t.Name, "conn", cn.id, "local", s.Local, "remote", s.Remote,
								"unacked", s.TCP.Unacked, "last_ack", s.TCP.LastAckRecv)
						}
					}
				case failRestore:
					if p.setBackup(ctx, c, full.Info.Token, s, p.backupAddr(s.Local.Addr())) {
						delete(marked, a.key)
						cn.t.c.restores.Add(1)
						if p.limiter.allow("restore") {
							p.log.Info("path back: subflow in use again", "tenant", cn.t.Name, "conn", cn.id, "local", s.Local, "remote", s.Remote)
						}
					}
				case failAbort:
					err := p.abortSubflow(diag, s)
					if errors.Is(err, info.ErrNoDestroy) {
						p.log.Warn("failover: the kernel does not let subflows be reset; dead subflows are closed instead", "err", err)
						diag.Close()
						diag = nil
						continue
					}
					closed[a.key] = true
					if err == nil {
						passes[cn.id] = now
						cn.t.c.aborted.Add(1)
						if p.limiter.allow("abort") {
							p.log.Info("path failed: live subflow with a long queue reset, so that the dead one's data is re-sent first", "tenant", cn.t.Name, "conn", cn.id,
								"local", s.Local, "remote", s.Remote, "notsent", s.TCP.NotsentBytes, "delivery_rate", s.TCP.DeliveryRate)
						}
					} else if p.limiter.allow("abort-err") {
						p.log.Warn("reset subflow", "conn", cn.id, "local", s.Local, "remote", s.Remote, "err", err)
					}
				case failClose:
					err := c.DestroySubflow(ctx, pmnl.Subflow{Token: full.Info.Token, Local: pmnl.Addr{Addr: s.Local.Addr().Unmap(), Port: s.Local.Port()},
						Remote: netip.AddrPortFrom(s.Remote.Addr().Unmap(), s.Remote.Port())})
					delete(marked, a.key)
					closed[a.key] = true
					if err == nil {
						passes[cn.id] = now
						cn.t.c.destroyed.Add(1)
					} else if p.limiter.allow("destroy") {
						p.log.Warn("close dead subflow", "conn", cn.id, "local", s.Local, "remote", s.Remote, "err", err)
					}
				}
			}
		}
		for k := range marked {
			if !seen[k] {
				delete(marked, k)
			}
		}
		for k := range closed {
			if !seen[k] {
				delete(closed, k)
			}
		}
		for k := range busy {
			if !seen[k] {
				delete(busy, k)
			}
		}
		for id := range passes {
			if !liveIDs[id] {
				delete(passes, id)
			}
		}
	}
}

// tcpEstablished is TCP_ESTABLISHED, tcp_info's state of an established subflow.
const tcpEstablished = 1

type failKind uint8

const (
	failBackup  failKind = iota + 1 // set the subflow to backup
	failRestore                     // set it back
	failClose                       // close it (SUBFLOW_DESTROY)
	failAbort                       // reset a live subflow whose unsent queue would hold back the re-sent data
)

type failAction struct {
	kind failKind
	key  subflowKey
	sub  info.Subflow
}

// failoverDecide is the monitor's decision for one connection's subflows at now, given the
// subflows set to backup (and since when), those closed, and since when each has had data in
// flight (busy); it changes no map. A subflow is dead when it has data in flight and no
// acknowledgement for deadAckAge (or 1.5 base RTTs, or its RTO), counted from the later of its
// last acknowledgement and the start of its data in flight: a subflow idle for a while (a pooled
// connection, a request after a pause) has an old last acknowledgement, and its first data
// must not make it dead before the path had time to answer. A subflow that has heard nothing
// from its peer for peerSilentAfter, keepalives included, is closed at once. Nothing is moved
// off a path unless another subflow is alive.
//
// When dead subflows are to be closed and maxBacklog is not 0, the other live subflows whose
// unsent data would take longer than maxBacklog to send at their delivery rate are reset, all
// but the one that would send its own first (see above). Only one close is made per failover
// (the resets, or else one dead subflow), and no dead subflow is closed within reinjectHold of
// the last close made on the connection (lastPass) while the live subflows still hold more
// unsent data than the backlog allowed: each close makes the kernel re-send the same data. Live
// subflows are reset only on a connection's first failover in 3 reinjectHolds.
func failoverDecide(now time.Time, conn uint64, subs []info.Subflow, marked map[subflowKey]time.Time, closed map[subflowKey]bool, busy map[subflowKey]time.Time, maxBacklog time.Duration, lastPass time.Time) []failAction {
	if len(subs) < 2 {
		return nil
	}
	dead := make([]bool, len(subs))
	silent := make([]bool, len(subs))
	suspect := make([]bool, len(subs)) // half way to dead
	alive := 0
	for i, s := range subs {
		// A join still in its handshake is not a path in use (and SET_FLAGS cannot name it).
		age := s.TCP.LastAckRecv
		if since, ok := busy[subflowKey{conn, s.Local, s.Remote}]; ok {
			age = min(age, now.Sub(since))
		}
		rtt := s.TCP.MinRTT
		if rtt == 0 {
			rtt = s.TCP.RTT
		}
		limit := max(deadAckAge, rtt+rtt/2, s.TCP.RTT+4*s.TCP.RTTVar)
		dead[i] = s.TCP.State == tcpEstablished && s.TCP.Unacked > 0 && age > limit
		suspect[i] = !dead[i] && s.TCP.State == tcpEstablished && s.TCP.Unacked > 0 && age > limit/2
		silent[i] = s.TCP.State == tcpEstablished && s.TCP.LastAckRecv > max(peerSilentAfter, 4*s.TCP.RTT)
		if !dead[i] && !silent[i] {
			alive++ // a backup uplink's too: with the dead one set to backup, the kernel uses it
		}
	}
	var out, deadClose []failAction
	// After a close, the live subflows hold what it re-sent: closing another dead subflow
	// before they have sent it would queue all of it again (on the paper's links, 2 MB: 2 s
	// without progress). So the other dead subflows wait until the live ones' unsent data is
	// down to the backlog allowed, or reinjectHold.
	backlogLimit := maxBacklog
	if backlogLimit <= 0 {
		backlogLimit = DefaultFailoverMaxBacklog
	}
	var liveBacklog time.Duration
	for i, s := range subs {
		if _, isMarked := marked[subflowKey{conn, s.Local, s.Remote}]; s.TCP.State == tcpEstablished && !dead[i] && !silent[i] && !isMarked {
			liveBacklog = max(liveBacklog, drainTime(s))
		}
	}
	held := !lastPass.IsZero() && now.Sub(lastPass) < reinjectHold && liveBacklog > backlogLimit
	// A close re-sends over every subflow not set to backup: one that is about to be found
	// dead too (the other subflow over a cut path, whose last acknowledgement came a little
	// later) would take the re-sent data and hold it. So the close waits, up to suspectWait,
	// until no subflow is half way to dead without being set to backup.
	waitSuspect := false
	for i, s := range subs {
		if _, isMarked := marked[subflowKey{conn, s.Local, s.Remote}]; suspect[i] && !isMarked {
			waitSuspect = true
		}
	}
	for i, s := range subs {
		k := subflowKey{conn, s.Local, s.Remote}
		since, isMarked := marked[k]
		switch {
		case closed[k]:
		case silent[i] && alive > 0 && !(held && isMarked):
			out = append(out, failAction{failClose, k, s})
		case dead[i] && isMarked && now.Sub(since) >= destroyAfter && alive > 0:
			if !held && (!waitSuspect || now.Sub(since) >= suspectWait) {
				deadClose = append(deadClose, failAction{failClose, k, s})
			}
		case dead[i] && !isMarked && alive > 0:
			out = append(out, failAction{failBackup, k, s})
		case isMarked && s.TCP.State == tcpEstablished && !dead[i] && (s.TCP.Unacked == 0 || s.TCP.LastAckRecv < deadAckAge):
			out = append(out, failAction{failRestore, k, s})
		}
	}
	if len(deadClose) > 0 {
		// Every close makes the kernel re-send all that is not acknowledged at the connection
		// level, from its oldest byte, behind what the live subflows already hold: a second
		// close right after the first queues the same data again, and the receiver waits for
		// the copy to pass (0.8 s of nothing on the paper's links, with two wired subflows and
		// a reset). So one close per failover: the reset of the backlogged subflows if any,
		// else one dead subflow; the other dead ones stay backup, closed once the live ones
		// have sent what the first close re-sent (held, above; the silent rule waits as well),
		// and without resetting live subflows again.
		var aborts []failAction
		if maxBacklog > 0 && (lastPass.IsZero() || now.Sub(lastPass) > 3*reinjectHold) {
			aborts = backlogAborts(conn, subs, dead, silent, closed, maxBacklog)
		}
		if len(aborts) > 0 {
			out = append(out, aborts...)
		} else {
			out = append(out, deadClose[0])
		}
	}
	return out
}

// backlogAborts picks the live subflows to reset as a dead one is closed: those whose unsent
// queue (tcpi_notsent_bytes) takes longer than maxBacklog to send at their delivery rate, all
// but the one whose queue drains first, so that at least one live subflow is kept.
func backlogAborts(conn uint64, subs []info.Subflow, dead, silent []bool, closed map[subflowKey]bool, maxBacklog time.Duration) []failAction {
	drain := drainTime
	keep, live := -1, 0
	for i, s := range subs {
		if s.TCP.State != tcpEstablished || dead[i] || silent[i] || closed[subflowKey{conn, s.Local, s.Remote}] {
			continue
		}
		live++
		if keep < 0 || drain(s) < drain(subs[keep]) {
			keep = i
		}
	}
	if live < 2 {
		return nil
	}
	var out []failAction
	for i, s := range subs {
		k := subflowKey{conn, s.Local, s.Remote}
		if i == keep || s.TCP.State != tcpEstablished || dead[i] || silent[i] || closed[k] {
			continue
		}
		if drain(s) > maxBacklog {
			out = append(out, failAction{failAbort, k, s})
		}
	}
	return out
}

// drainTime is how long a subflow takes to send its unsent data at its delivery rate.
func drainTime(s info.Subflow) time.Duration {
	if s.TCP.NotsentBytes == 0 {
		return 0
	}
	rate := s.TCP.DeliveryRate
	if rate == 0 {
		rate = s.TCP.PacingRate
	}
	if rate == 0 {
		return time.Hour
	}
	return time.Duration(float64(s.TCP.NotsentBytes) / float64(rate) * float64(time.Second))
}

// abortSubflow resets a subflow through sock_diag. Subflows this proxy opened are bound to
// their uplink's device, which the kernel's lookup must be given: without it, the devices that
// hold the local address are tried.
func (p *Proxy) abortSubflow(d *info.Diag, s info.Subflow) error {
	if d == nil {
		return info.ErrNoDestroy
	}
	err := d.Abort(s.Local, s.Remote, 0)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return err
	}
	ifs, ierr := net.Interfaces()
	if ierr != nil {
		return err
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if pn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(pn.IP); ok && ip.Unmap() == s.Local.Addr().Unmap() {
					if e := d.Abort(s.Local, s.Remote, ifc.Index); e == nil || !errors.Is(e, unix.ENOENT) {
						return e
					}
				}
			}
		}
	}
	return err
}

func (p *Proxy) backupAddr(a netip.Addr) bool {
	for _, b := range p.o.BackupAddrs {
		if b == a.Unmap() {
			return true
		}
	}
	return false
}

func (p *Proxy) setBackup(ctx context.Context, c *pmnl.Client, token uint32, s info.Subflow, backup bool) bool {
	var flags pmnl.Flags
	if backup {
		flags = pmnl.FlagBackup
	}
	err := c.SetSubflowFlags(ctx, pmnl.Subflow{Token: token,
		Local:  pmnl.Addr{Addr: s.Local.Addr().Unmap(), Port: s.Local.Port(), Flags: flags},
		Remote: netip.AddrPortFrom(s.Remote.Addr().Unmap(), s.Remote.Port())})
	if err != nil {
		if p.limiter.allow("setflags") {
			p.log.Warn("set subflow backup", "token", fmt.Sprintf("%08x", token), "local", s.Local, "remote", s.Remote, "backup", backup, "err", err)
		}
		return false
	}
	return true
}
