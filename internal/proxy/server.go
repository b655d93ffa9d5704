package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"

	"braid/internal/proxy/ident"
	"braid/internal/wire/socks5"
)

// servePeer serves one MPTCP connection from a peer proxy: authenticate, send the ready byte,
// wait for the header (a pooled connection waits until a client needs it), check it against
// the tenant's and the peer's networks, connect to the destination from the claimed source,
// relay.
func (p *Proxy) servePeer(t *tenant, raw *net.TCPConn) {
	from := addrPortOf(raw.RemoteAddr())
	if p.draining.Load() {
		p.refuse(t, ReasonDraining, "from", from)
		reset(raw)
		return
	}
	// Until it has authenticated, a connection counts against MaxUnauthenticated: those from
	// an address of one of the tenant's peers against a cap of their own, so that a flood from
	// elsewhere does not keep the real peers out (an attacker would have to connect from a
	// peer's address, which takes being on its path).
	authed := false
	unauth := &p.unauth
	if t.state().bySource(from.Addr()) != nil {
		unauth = &p.unauthPeers
	}
	if unauth.Add(1) > int64(p.o.MaxUnauthenticated) {
		unauth.Add(-1)
		p.refuse(t, ReasonUnauthLimit, "from", from, "max_unauthenticated", p.o.MaxUnauthenticated)
		reset(raw)
		return
	}
	defer func() {
		if !authed {
			unauth.Add(-1)
		}
	}()
	pp := &pendingPeer{t: t}
	p.mu.Lock()
	p.pending[raw] = pp
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.pending, raw)
		p.mu.Unlock()
	}()
	if p.draining.Load() { // Close may have run between the check above and the registration
		reset(raw)
		return
	}
	var c net.Conn = raw
	var pr *peer
	raw.SetDeadline(time.Now().Add(p.o.HeaderTimeout))
	if t.tlsSrv != nil {
		tc := tls.Server(raw, t.tlsSrv)
		ctx, cancel := context.WithTimeout(p.ctx, p.o.HeaderTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			p.refuse(t, ReasonAuth, "from", from, "err", err)
			reset(raw)
			return
		}
		k, _ := ident.PeerKey(tc.ConnectionState())
		pr = t.state().byKey[k]
		c = tc
	} else {
		// Plaintext: the source address is all that tells a peer; never any peer of the
		// tenant.
		pr = t.state().bySource(from.Addr())
	}
	if pr == nil {
		p.refuse(t, ReasonAuth, "from", from, "err", "not the address of a peer of the tenant")
		reset(raw)
		return
	}
	pp.pr.Store(pr)
	authed = true
	unauth.Add(-1)
	if p.o.Authenticated != nil {
		p.o.Authenticated(addrPortOf(raw.LocalAddr()), from)
	}
	if _, err := c.Write([]byte{readyByte}); err != nil {
		reset(raw)
		return
	}
	// A pooled connection is quiet until a client needs it; the client side replaces its
	// pooled connections before PoolIdle, so twice that is a dead one.
	raw.SetDeadline(time.Now().Add(2 * p.o.PoolIdle))
	var buf [socks5.MaxHeaderLen]byte
	if _, err := io.ReadFull(c, buf[:1]); err != nil {
		// A pooled connection closed unused by its client: nothing to count.
		raw.Close()
		return
	}
	if p.draining.Load() {
		p.refuse(t, ReasonDraining, "from", from)
		reset(raw)
		return
	}
	raw.SetDeadline(time.Now().Add(p.o.HeaderTimeout))
	var h socks5.Header
	if _, err := io.ReadFull(c, buf[1:socks5.MinHeaderLen]); err != nil {
		p.refuse(t, readReason(err), "from", from, "err", err)
		reset(raw)
		return
	}
	n, err := socks5.HeaderLen(buf[:socks5.MinHeaderLen])
	if err == nil {
		if _, err = io.ReadFull(c, buf[socks5.MinHeaderLen:n]); err != nil {
			p.refuse(t, readReason(err), "from", from, "err", err)
			reset(raw)
			return
		}
		_, err = h.Decode(buf[:n])
	}
	if err != nil {
		reason := ReasonMalformed
		if errors.Is(err, socks5.ErrAddrType) {
			reason = ReasonAddrType
		}
		p.refuse(t, reason, "from", from, "err", err)
		reset(raw)
		return
	}
	raw.SetDeadline(time.Time{})
	// The rules of now: a reload may have removed or changed the peer while this connection
	// waited in the pool.
	st := t.state()
	if !st.has(pr) {
		p.refuse(t, ReasonAuth, "from", from, "peer", pr.Name, "err", "the peer is no longer configured")
		reset(raw)
		return
	}
	if !contains(st.Networks, h.Dst.Addr()) {
		p.refuse(t, ReasonDstDenied, "peer", pr.Name, "dst", h.Dst)
		reset(raw)
		return
	}
	if h.Src.IsValid() && !contains(pr.Networks, h.Src.Addr()) {
		p.refuse(t, ReasonSrcDenied, "peer", pr.Name, "src", h.Src, "dst", h.Dst)
		reset(raw)
		return
	}
	if !h.Src.IsValid() && !st.AllowSourceless {
		// Connecting from this proxy's own address would lend the peer this site's trust.
		p.refuse(t, ReasonNoSource, "peer", pr.Name, "dst", h.Dst)
		reset(raw)
		return
	}
	out, err := p.dialOut(h)
	if err != nil {
		p.refuse(t, ReasonDstUnreachable, "peer", pr.Name, "src", h.Src, "dst", h.Dst, "err", err)
		reset(raw)
		return
	}
	cn := &conn{t: t, role: "in", peer: pr.Name, pr: pr, src: h.Src, dst: h.Dst, site: out, mp: raw, sendBacklog: p.o.SendBacklog}
	p.register(cn)
	defer p.unregister(cn)
	relay(cn, out, c)
}

// dialOut connects to the header's destination, from its source when it has one.
func (p *Proxy) dialOut(h socks5.Header) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: p.o.ConnectTimeout}
	d.SetMultipathTCP(false)
	network := "tcp4"
	if h.Dst.Addr().Is6() {
		network = "tcp6"
	}
	if h.Src.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(h.Src)
		d.Control = transparent(network)
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.o.ConnectTimeout)
	defer cancel()
	c, err := d.DialContext(ctx, network, h.Dst.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}
