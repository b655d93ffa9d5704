package xtr

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"braid/internal/wire/lisp"
)

func (x *XTR) controlLoop(i int, u *Uplink) error {
	buf := make([]byte, 65536)
	for {
		n, from, err := u.Control.ReadFromUDPAddrPort(buf)
		if err != nil {
			return err
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		x.control(time.Now(), i, from, buf[:n])
	}
}

// control handles one control message received on uplink i.
func (x *XTR) control(now time.Time, i int, from netip.AddrPort, b []byte) {
	switch lisp.Type(b) {
	case lisp.TypeMapReply:
		var m lisp.MapReply
		if _, err := m.Decode(b); err != nil {
			x.count(DropControl)
			return
		}
		if m.Flags&lisp.ReplyProbe != 0 {
			x.probeReply(now, i, from, &m)
			return
		}
		x.mapReply(now, from, &m)
	case lisp.TypeMapRequest:
		var m lisp.MapRequest
		if _, err := m.Decode(b); err != nil {
			x.count(DropControl)
			return
		}
		// An RLOC-probe, or another request sent straight to us: answer the sender.
		x.answer(now, i, &m, from, m.Flags&lisp.ReqProbe != 0, len(b))
	case lisp.TypeECM:
		// A Map-Request a map-server forwarded: answer the ITR at its first ITR-RLOC. Only a
		// map server the site registers with has its mapping to forward requests for, so an
		// ECM from anywhere else is someone using the ETR to reflect replies.
		if !x.fromMapServer(from.Addr()) {
			x.count(DropECMSource)
			return
		}
		var e lisp.ECM
		n, err := e.Decode(b)
		if err != nil {
			x.count(DropControl)
			return
		}
		var m lisp.MapRequest
		if _, err := m.Decode(b[n : n+int(e.Inner.PayloadLen)]); err != nil {
			x.count(DropControl)
			return
		}
		// The first ITR-RLOC of the family of the uplink the request came in on; else the first
		// one of a family another uplink has (a dual-stack xTR answers from that link).
		var to netip.AddrPort
		ui := -1
		for pass := range 2 {
			for _, a := range m.ITRRLOCs {
				if a.AFI != lisp.AFIIPv4 && a.AFI != lisp.AFIIPv6 {
					continue
				}
				if pass == 0 && a.IP.Is4() == x.locals[i].Addr.Is4() {
					to, ui = netip.AddrPortFrom(a.IP, e.Inner.Src.Port()), i
				} else if pass == 1 {
					if j := slices.IndexFunc(x.locals, func(l Loc) bool { return l.Addr.Is4() == a.IP.Is4() }); j >= 0 {
						to, ui = netip.AddrPortFrom(a.IP, e.Inner.Src.Port()), j
					}
				}
				if ui >= 0 {
					break
				}
			}
			if ui >= 0 {
				break
			}
		}
		if ui < 0 {
			if len(m.ITRRLOCs) > 0 {
				x.count(DropITRRLOCFamily)
			} else {
				x.count(DropControl)
			}
			return
		}
		x.answer(now, ui, &m, to, false, n+int(e.Inner.PayloadLen))
	case lisp.TypeMapNotify:
		x.mapNotify(now, from, b)
	default:
		x.count(DropUnexpected)
	}
}

// ownRecord returns this site's mapping for its EID prefix p, with the probed locator marked
// when probed is valid.
func (x *XTR) ownRecord(p netip.Prefix, probed netip.Addr) lisp.Record {
	p = p.Masked()
	r := lisp.Record{TTL: x.o.RegisterTTL, MaskLen: uint8(p.Bits()), Authoritative: true, EID: lisp.AddrFrom(p.Addr())}
	x.mu.RLock() // SetLocators changes priorities and weights
	defer x.mu.RUnlock()
	for j, l := range x.locals {
		fl := uint16(lisp.LocLocal | lisp.LocReachable)
		if l.Addr == probed {
			fl |= lisp.LocProbed
		}
		r.Locators = append(r.Locators, lisp.Locator{Priority: x.o.Locators[j].Priority, Weight: x.o.Locators[j].Weight,
			MPriority: 255, Flags: fl, Addr: lisp.AddrFrom(l.Addr)})
	}
	return r
}

// answer sends the ETR's Map-Reply to m (reqLen bytes as received) to the address the
// request names: the UDP source of an RLOC-probe, the ITR-RLOC of a forwarded request. Neither
// is authenticated, so the reply is at most MaxAmplification times the request and one address
// gets at most RatePerDestination replies per second.
func (x *XTR) answer(now time.Time, i int, m *lisp.MapRequest, to netip.AddrPort, probe bool, reqLen int) {
	b := x.answerMessageWithin(i, m, probe, int(x.o.MaxAmplification*float64(reqLen)))
	if b == nil {
		x.count(DropForeignEID)
		return
	}
	if !x.replies.Allow(to.Addr(), now) {
		x.count(DropReplyRateLimited)
		return
	}
	x.o.Uplinks[i].Control.WriteToUDPAddrPort(b, to)
	x.count(CountRequestsIn)
}

// answerMessage is the Map-Reply of this ETR (A=1) to m received on uplink i, an RLOC-probe
// reply when probe is set; nil when m asks for no EID of this site.
func (x *XTR) answerMessage(i int, m *lisp.MapRequest, probe bool) []byte {
	return x.answerMessageWithin(i, m, probe, 0)
}

// answerMessageWithin is answerMessage with at most maxLen bytes (0: no bound): each of the
// site's prefixes is answered once, and records that do not fit are left out.
func (x *XTR) answerMessageWithin(i int, m *lisp.MapRequest, probe bool, maxLen int) []byte {
	rep := lisp.MapReply{Nonce: m.Nonce}
	if probe {
		rep.Flags = lisp.ReplyProbe
	}
	var done [8]netip.Prefix
	answered := done[:0]
	for _, r := range m.Records {
		probed := netip.Addr{}
		if probe {
			probed = x.locals[i].Addr
		}
		if !r.EID.IP.IsValid() || (r.EID.AFI == lisp.AFILCAF && r.EID.InstanceID != 0) {
			continue
		}
		p, _, ok := x.db.Load().eids.Lookup(r.EID.IP)
		if !ok || slices.Contains(answered, p) {
			continue
		}
		rec := x.ownRecord(p, probed)
		if maxLen > 0 && rep.Len()+rec.Len() > maxLen {
			break
		}
		answered = append(answered, p)
		rep.Records = append(rep.Records, rec)
	}
	if len(rep.Records) == 0 {
		return nil
	}
	b := make([]byte, rep.Len())
	rep.Encode(b)
	return b
}

func (x *XTR) probeReply(now time.Time, i int, from netip.AddrPort, m *lisp.MapReply) {
	x.mu.Lock()
	p, ok := x.probes[m.Nonce]
	var pr *pair
	if ok && p.key.local == i && p.key.remote == from.Addr() {
		delete(x.probes, m.Nonce)
		pr = x.pairs[p.key]
	}
	x.mu.Unlock()
	if pr == nil {
		x.count(DropUnexpected)
		return
	}
	x.count(CountProbeReplies)
	pr.heard.Store(now.UnixNano())
	pr.rtt.Store(int64(now.Sub(p.sent)))
	if !pr.up.Swap(true) {
		x.log.Info("RLOC pair up", "local", x.locals[pr.local].Addr, "remote", pr.remote)
	}
}

// Shortest prefixes a Map-Reply may install (decide, document: docs/lisp.md "Map-Replies").
// A positive record must be at least this specific; a negative one wider than this is
// installed narrowed to this length around the queried EID, so that one reply never maps or
// black-holes more than a /8 (IPv4) or a /16 (IPv6).
const (
	minReplyBits4 = 8
	minReplyBits6 = 16
)

// fromMapServer reports whether a is the address of a map-server the site registers with.
func (x *XTR) fromMapServer(a netip.Addr) bool {
	for _, ms := range x.db.Load().MapServers {
		if ms.Addr.Addr().Unmap() == a {
			return true
		}
	}
	return false
}

// fromResolver reports whether a is one of the configured map-resolvers' addresses.
func (x *XTR) fromResolver(a netip.Addr) bool {
	for _, r := range x.db.Load().Resolvers {
		if r.Addr().Unmap() == a {
			return true
		}
	}
	return false
}

// replyRecordOK decides whether record r of a Map-Reply from from may answer query: its prefix
// contains the query and is not shorter than the minimum (negative records are narrowed
// instead), a positive one does not cover an EID prefix of this site, and a reply that does not come from a
// map-resolver comes from one of the record's own locators (an ETR answering for itself). It
// returns the prefix to install.
func (x *XTR) replyRecordOK(r *lisp.Record, query, from netip.Addr, resolver bool) (netip.Prefix, bool) {
	p, ok := r.Prefix()
	if !ok || !p.Contains(query) {
		return p, false
	}
	minBits := minReplyBits4
	if !p.Addr().Is4() {
		minBits = minReplyBits6
	}
	if p.Bits() < minBits {
		if len(r.Locators) != 0 {
			return p, false
		}
		p = netip.PrefixFrom(query, minBits).Masked()
	}
	for _, own := range x.db.Load().EIDs {
		// Packets to the site's own EIDs never use the map-cache, so a negative record over
		// them is harmless; a positive one is a lie.
		if p.Overlaps(own) && len(r.Locators) != 0 {
			return p, false
		}
	}
	if !resolver && !slices.ContainsFunc(r.Locators, func(l lisp.Locator) bool { return l.Addr.IP.Unmap() == from }) {
		return p, false
	}
	return p, true
}

func (x *XTR) mapReply(now time.Time, from netip.AddrPort, m *lisp.MapReply) {
	src := from.Addr().Unmap()
	resolver := x.fromResolver(src)
	x.mu.Lock()
	e := x.byNonce[m.Nonce] // a map, not a walk of the cache: replies cost the same however big it is
	if e != nil && !(e.pending || e.tries < 0) {
		e = nil
	}
	if e == nil {
		x.mu.Unlock()
		x.count(DropUnexpected)
		return
	}
	var queued, verified [][]byte
	installed := 0
	for i := range m.Records {
		r := &m.Records[i]
		p, ok := x.replyRecordOK(r, e.query, src, resolver)
		if !ok {
			x.count(DropReplyRecord)
			continue
		}
		if len(r.Locators) == 0 {
			x.count(CountNegative)
		}
		rr := *r
		rr.EID, rr.MaskLen = lisp.AddrFrom(p.Addr()), uint8(p.Bits())
		q, v := x.installLocked(now, &rr)
		queued = append(queued, q...)
		verified = append(verified, v...)
		installed++
	}
	if installed == 0 {
		// Nothing usable: the request stays pending and its retries go on; the nonce stays
		// valid for the right answer.
		x.mu.Unlock()
		return
	}
	x.count(CountReplies)
	x.resolverOKLocked(now, e)
	if e.pending {
		if _, cur, ok := x.cache.Lookup(e.query); ok && cur == e {
			x.cacheDeleteLocked(e.prefix)
			queued = append(queued, e.queue...)
			if _, ne, ok := x.cache.Lookup(e.query); ok {
				verified = append(verified, x.verifyHeld(ne, e.held)...)
			} else {
				x.counts[DropOuterSource].Add(uint64(len(e.held)))
			}
		}
	}
	x.mu.Unlock()
	for _, pkt := range queued {
		buf := make([]byte, headroom+len(pkt))
		copy(buf[headroom:], pkt)
		x.encap(buf, len(pkt))
	}
	for _, pkt := range verified {
		x.deliver(pkt, nil)
	}
}

func (x *XTR) mapNotify(now time.Time, from netip.AddrPort, b []byte) {
	var m lisp.MapRegister
	n, err := m.Decode(b)
	if err != nil {
		x.count(DropControl)
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for k, ms := range x.db.Load().MapServers {
		if ms.Addr.Addr() != from.Addr() || x.regs[k].nonce != m.Nonce {
			continue
		}
		if lisp.Verify(b[:n], ms.Key) != nil {
			x.count(DropNotifyAuth)
			return
		}
		x.regs[k].lastNotify = now
		x.count(CountNotifies)
		return
	}
	x.count(DropUnexpected)
}

// sendRequest sends an ECM Map-Request for eid to resolver Resolvers[ri]; attempt picks the
// uplink, so that retries go another way.
func (x *XTR) sendRequest(eid, srcEID netip.Addr, nonce uint64, attempt, ri int) {
	ui, res, b := x.requestMessage(eid, srcEID, nonce, attempt, ri)
	if b == nil {
		x.count(CountResolveFailed) // no EID of the query's family to put in the inner header
		return
	}
	if _, err := x.o.Uplinks[ui].Control.WriteToUDPAddrPort(b, res); err == nil {
		x.count(CountRequests)
	}
}

// requestMessage builds the ECM Map-Request of sendRequest and says where it goes: from
// uplink ui to resolver res = the database's Resolvers[ri].
func (x *XTR) requestMessage(eid, srcEID netip.Addr, nonce uint64, attempt, ri int) (ui int, res netip.AddrPort, b []byte) {
	db := x.db.Load()
	res = db.Resolvers[ri]
	n := len(x.o.Uplinks)
	for k := range n {
		ui = (attempt + k) % n
		if x.locals[ui].Addr.Is4() == res.Addr().Is4() {
			break
		}
	}
	req := lisp.MapRequest{Nonce: nonce, Records: []lisp.RequestRecord{{MaskLen: uint8(eid.BitLen()), EID: lisp.AddrFrom(eid)}}}
	if srcEID.IsValid() && srcEID.Is4() == eid.Is4() {
		req.SourceEID = lisp.AddrFrom(srcEID)
	}
	req.ITRRLOCs = append(req.ITRRLOCs, lisp.AddrFrom(x.locals[ui].Addr))
	for j, l := range x.locals {
		if j != ui {
			req.ITRRLOCs = append(req.ITRRLOCs, lisp.AddrFrom(l.Addr))
		}
	}
	innerSrc := srcEID
	if !innerSrc.IsValid() || innerSrc.Is4() != eid.Is4() {
		innerSrc = db.EIDs[0].Addr()
		for _, p := range db.EIDs {
			if p.Addr().Is4() == eid.Is4() {
				innerSrc = p.Addr()
			}
		}
	}
	if innerSrc.Is4() != eid.Is4() {
		return ui, res, nil
	}
	e := lisp.ECM{Inner: lisp.IPUDP{Src: netip.AddrPortFrom(innerSrc, lisp.ControlPort), Dst: netip.AddrPortFrom(eid, lisp.ControlPort),
		TTL: 64, PayloadLen: uint16(req.Len())}}
	b = make([]byte, e.Len()+req.Len())
	req.Encode(b[e.Len():])
	e.Encode(b)
	return ui, res, b
}

// register sends a Map-Register to map-server k of db from uplink ui.
func (x *XTR) register(db *database, k, ui int, nonce uint64) {
	ms := db.MapServers[k]
	b, err := x.registerMessageOf(db, k, nonce)
	if err != nil {
		x.log.Error("cannot sign Map-Register", "map_server", ms.Addr, "err", err)
		return
	}
	if _, err := x.o.Uplinks[ui].Control.WriteToUDPAddrPort(b, ms.Addr); err == nil {
		x.count(CountRegisters)
	}
}

// registerMessage builds the signed Map-Register for map-server k.
func (x *XTR) registerMessage(k int, nonce uint64) ([]byte, error) {
	return x.registerMessageOf(x.db.Load(), k, nonce)
}

// registerMessageOf builds the signed Map-Register of db's EIDs for its map-server k.
func (x *XTR) registerMessageOf(db *database, k int, nonce uint64) ([]byte, error) {
	ms := db.MapServers[k]
	m := lisp.MapRegister{Flags: lisp.RegWantNotify, Nonce: nonce, KeyID: ms.KeyID, AlgID: ms.AlgID}
	if ms.ProxyReply {
		m.Flags |= lisp.RegProxyReply
	}
	l := ms.AuthLen
	if l == 0 {
		l = lisp.AuthLen(ms.AlgID)
	}
	m.AuthData = make([]byte, l)
	for _, p := range db.EIDs {
		m.Records = append(m.Records, x.ownRecord(p, netip.Addr{}))
	}
	b := make([]byte, m.Len())
	m.Encode(b)
	if err := lisp.Sign(b, ms.Key); err != nil {
		return nil, err
	}
	return b, nil
}

// probeMessage builds an RLOC-probe: a Map-Request with P for eid, from local.
func probeMessage(nonce uint64, local netip.Addr, eid netip.Prefix) []byte {
	m := lisp.MapRequest{Flags: lisp.ReqProbe, Nonce: nonce, ITRRLOCs: []lisp.Addr{lisp.AddrFrom(local)},
		Records: []lisp.RequestRecord{{MaskLen: uint8(eid.Bits()), EID: lisp.AddrFrom(eid.Addr())}}}
	b := make([]byte, m.Len())
	m.Encode(b)
	return b
}

type outgoing struct {
	uplink int
	to     netip.AddrPort
	data   []byte
}

type requestJob struct {
	eid, src netip.Addr
	nonce    uint64
	attempt  int
	resolver int
}

// tick is the xTR's clock work: map-cache expiry and refresh, resolution retries, probes,
// pair liveness and registrations.
func (x *XTR) tick(now time.Time) {
	x.replies.Prune(now)
	var sends []outgoing
	var requests []requestJob
	type regJob struct {
		db    *database
		k, ui int
		nonce uint64
	}
	var regs []regJob
	x.mu.Lock()
	var gone []netip.Prefix
	inUse := map[*pair]netip.Prefix{}
	x.cache.All(func(p netip.Prefix, e *entry) bool {
		switch {
		case e.pending:
			if now.Sub(e.sent) < x.attemptTimeout(e.tries) {
				break
			}
			x.resolverMissLocked(now, e)
			if e.tries >= x.o.RequestRetries {
				gone = append(gone, p)
				x.count(CountResolveFailed)
				x.counts[DropNoMapping].Add(uint64(len(e.queue)))
				x.counts[DropOuterSource].Add(uint64(len(e.held)))
				break
			}
			e.tries++
			e.sent = now
			x.setNonceLocked(e, randomNonce())
			requests = append(requests, requestJob{e.query, e.srcEID, e.nonce, e.tries, x.askResolverLocked(now, e)})
		case !now.Before(e.expires):
			gone = append(gone, p)
			x.count(CountCacheExpired)
		default:
			// Refresh an entry in use shortly before it expires: in its last tenth, at most
			// the last minute.
			ttl := time.Duration(e.ttl) * time.Minute
			// A refresh left unanswered goes to the next resolver like a resolution does
			// (tries -1, -2, ...: refreshing, and how many times).
			switch {
			case e.tries >= 0 && e.expires.Sub(now) < min(ttl/10, time.Minute) && e.used.Load():
				e.tries = -1 // refreshing: the nonce below matches the reply
				e.query = p.Addr()
				e.sent = now
				x.setNonceLocked(e, randomNonce())
				e.tried = 0
				requests = append(requests, requestJob{p.Addr(), netip.Addr{}, e.nonce, 0, x.askResolverLocked(now, e)})
			case e.tries < 0 && -e.tries <= x.o.RequestRetries && now.Sub(e.sent) >= x.attemptTimeout(-e.tries-1):
				x.resolverMissLocked(now, e)
				e.tries--
				e.sent = now
				x.setNonceLocked(e, randomNonce())
				requests = append(requests, requestJob{p.Addr(), netip.Addr{}, e.nonce, -e.tries - 1, x.askResolverLocked(now, e)})
			}
			for _, pr := range e.pairs {
				inUse[pr] = p
			}
		}
		return true
	})
	for _, p := range gone {
		x.cacheDeleteLocked(p)
	}
	for k, pr := range x.pairs {
		p, used := inUse[pr]
		if !used {
			delete(x.pairs, k)
			continue
		}
		if x.locals[pr.local].Addr.Is4() != pr.remote.Is4() {
			continue
		}
		if now.Sub(time.Unix(0, pr.heard.Load())) > x.o.DownAfter && pr.up.Swap(false) {
			x.log.Warn("RLOC pair down: no probe reply", "local", x.locals[pr.local].Addr, "remote", pr.remote, "after", x.o.DownAfter)
		}
		if now.Sub(pr.lastProbe) >= x.o.ProbeInterval {
			pr.lastProbe = now
			nonce := randomNonce()
			x.probes[nonce] = probe{key: k, sent: now}
			sends = append(sends, outgoing{pr.local, netip.AddrPortFrom(pr.remote, lisp.ControlPort), probeMessage(nonce, x.locals[pr.local].Addr, p)})
		}
	}
	for n, p := range x.probes {
		if now.Sub(p.sent) > x.o.DownAfter {
			delete(x.probes, n)
		}
	}
	db := x.db.Load() // replaced under mu only
	for k := range db.MapServers {
		r := &x.regs[k]
		// Unconfirmed registrations are sent again after 1, 2 and 4 request timeouts (from the
		// next RLOC each time), then only every RegisterInterval: never more than once a
		// second, backing off (RFC 9301's rule for retransmitted Map-Requests).
		unanswered := r.lastNotify.Before(r.sent)
		periodic := r.sent.IsZero() || now.Sub(r.sent) >= x.o.RegisterInterval
		retry := unanswered && r.retries < maxRegisterRetries && now.Sub(r.sent) >= max(x.o.RequestTimeout, time.Second)<<r.retries
		if periodic || retry {
			if periodic {
				r.retries = 0
			} else {
				r.retries++
			}
			x.regTurn++
			r.uplink = x.regTurn % len(x.o.Uplinks)
			r.nonce, r.sent = x.registerNonceLocked(now), now
			regs = append(regs, regJob{db, k, r.uplink, r.nonce})
		}
	}
	x.mu.Unlock()
	for _, s := range sends {
		if _, err := x.o.Uplinks[s.uplink].Control.WriteToUDPAddrPort(s.data, s.to); err == nil {
			x.count(CountProbesSent)
		}
	}
	for _, r := range requests {
		x.sendRequest(r.eid, r.src, r.nonce, r.attempt, r.resolver)
	}
	for _, r := range regs {
		x.register(r.db, r.k, r.ui, r.nonce)
	}
}

// maxRegisterRetries is how many times an unconfirmed Map-Register is sent again before the
// next periodic one.
const maxRegisterRetries = 3

// registerNonceLocked returns the nonce of a Map-Register sent at now: the time of sending in
// Unix nanoseconds, strictly increasing, so that a map server with timestamp nonces (braid
// mapserver's default) refuses a captured registration replayed later. Called with mu held.
func (x *XTR) registerNonceLocked(now time.Time) uint64 {
	n := uint64(now.UnixNano())
	if n <= x.regNonce {
		n = x.regNonce + 1
	}
	x.regNonce = n
	return n
}

func (x *XTR) timerLoop(ctx context.Context) {
	step := min(x.o.ProbeInterval/4, 100*time.Millisecond)
	t := time.NewTicker(max(step, 10*time.Millisecond))
	defer t.Stop()
	x.tick(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			x.tick(now)
		}
	}
}
