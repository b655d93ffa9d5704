package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"braid/internal/wire/socks5"
)

// readyByte is what a proxy sends first on every connection it accepts from a peer, once the
// peer is authenticated. A pooled connection enters the pool only after it has arrived, so a
// peer that refuses our key is found out before any client depends on it; a connection dialled
// on demand does not wait for it (no round trip) and finds it ahead of the response.
const readyByte = 0x00

// serveIntercepted relays one connection handed over by TPROXY or REDIRECT.
func (p *Proxy) serveIntercepted(t *tenant, c *net.TCPConn) {
	src := addrPortOf(c.RemoteAddr())
	dst := addrPortOf(c.LocalAddr()) // TPROXY: the socket has the destination's address
	if p.o.Intercept == InterceptRedirect {
		var err error
		if dst, err = originalDst(c); err != nil {
			p.refuse(t, ReasonOriginalDst, "src", src, "err", err)
			reset(c)
			return
		}
	}
	if !contains(t.state().Networks, src.Addr()) {
		// Interception rules only select the tenant's sources; anything else reached the port
		// directly.
		p.refuse(t, ReasonSrcDenied, "src", src, "dst", dst)
		reset(c)
		return
	}
	p.relayOut(t, c, src, dst, nil)
}

// relayOut carries the site connection c to the peer that serves dst. reply, when set, answers
// a SOCKS5 client once the request is on its way.
func (p *Proxy) relayOut(t *tenant, c *net.TCPConn, src, dst netip.AddrPort, reply func(code byte) error) {
	st := t.state()
	pr := st.route(dst.Addr())
	if pr == nil {
		p.refuse(t, ReasonNoRoute, "src", src, "dst", dst)
		if reply != nil {
			reply(socks5.RepNotAllowed)
		}
		reset(c)
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.o.ConnectTimeout)
	pc, err := pr.pool.get(ctx)
	cancel()
	if err != nil {
		p.refuse(t, ReasonPeerUnreachable, "peer", pr.Name, "dst", dst, "err", err)
		if reply != nil {
			reply(socks5.RepNetworkUnreachable)
		}
		reset(c)
		return
	}
	h := socks5.Header{Dst: dst}
	if contains(st.Networks, src.Addr()) {
		h.Src = src // restored at the far side; other sources (a local SOCKS client) are not
	}
	b, err := h.Append(make([]byte, 0, firstWriteMax))
	hlen := len(b)
	if err == nil && reply == nil {
		b, err = appendFirstData(c, b)
	}
	if err == nil {
		_, err = pc.c.Write(b)
	}
	if err != nil {
		p.refuse(t, ReasonPeerUnreachable, "peer", pr.Name, "dst", dst, "err", err)
		if reply != nil {
			reply(socks5.RepGeneralFailure)
		}
		reset(c)
		pc.abort()
		return
	}
	if reply != nil {
		if err := reply(socks5.RepSucceeded); err != nil {
			reset(c)
			pc.abort()
			return
		}
	}
	cn := &conn{t: t, role: "out", peer: pr.Name, pr: pr, src: src, dst: dst, site: c, mp: pc.raw, sendBacklog: p.o.SendBacklog}
	cn.up.Add(uint64(len(b) - hlen))
	p.register(cn)
	defer p.unregister(cn)
	var down net.Conn = pc.c
	if !pc.ready {
		down = &readyReader{Conn: pc.c, onRefused: func() { p.refuse(t, ReasonPeerRefused, "peer", pr.Name, "dst", dst) }}
	}
	relay(cn, c, down)
}

// firstDataWait bounds how long an intercepted connection's header waits for the client's
// first bytes, and firstWriteMax the header and those bytes together (one TLS record).
const (
	firstDataWait = 2 * time.Millisecond
	firstWriteMax = 16 << 10
)

// appendFirstData appends to the header b what the client sends within firstDataWait, so that
// both leave in one write. Written apart, the two are two TLS records and two sends, and
// MPTCP's scheduler sends the second on another subflow (the first one has data queued):
// over a slower path the request waits for it at the far side. A client that speaks first
// (HTTP, TLS) has sent its request right after its handshake; one that waits for the server
// costs firstDataWait once. An end of stream is left for the relay to read again.
func appendFirstData(c *net.TCPConn, b []byte) ([]byte, error) {
	if err := c.SetReadDeadline(time.Now().Add(firstDataWait)); err != nil {
		return b, err
	}
	n, err := c.Read(b[len(b):firstWriteMax])
	b = b[:len(b)+n]
	var ne net.Error
	if err == nil || errors.Is(err, io.EOF) || errors.As(err, &ne) && ne.Timeout() {
		err = c.SetReadDeadline(time.Time{})
	}
	return b, err
}

// readyReader consumes the peer's ready byte ahead of the response on a connection that was
// dialled on demand. A connection that ends before it is a refusal: reported as an error, so
// that the relay resets the client.
type readyReader struct {
	net.Conn
	once      sync.Once
	err       error
	onRefused func()
}

var errPeerRefused = errors.New("proxy: the peer closed the connection before accepting it")

func (r *readyReader) Read(b []byte) (int, error) {
	if err := r.check(); err != nil {
		return 0, err
	}
	return r.Conn.Read(b)
}

// check reads the ready byte the first time.
func (r *readyReader) check() error {
	r.once.Do(func() {
		var x [1]byte
		if _, err := io.ReadFull(r.Conn, x[:]); err != nil || x[0] != readyByte {
			r.err = errPeerRefused
			r.onRefused()
		}
	})
	return r.err
}

// CloseWrite passes the half-close on.
func (r *readyReader) CloseWrite() error { return r.Conn.(halfCloser).CloseWrite() }

// serveSocks answers one RFC 1928 client: no authentication, CONNECT only. A domain name is
// resolved here; the connection then goes to the peer that serves the address.
func (p *Proxy) serveSocks(t *tenant, c *net.TCPConn) {
	src := addrPortOf(c.RemoteAddr())
	if st := t.state(); !contains(st.socksClients(), src.Addr()) {
		// Not the tenant's: the listener is no open proxy into the tenant's other sites.
		p.refuse(t, ReasonSrcDenied, "src", src, "listener", "socks")
		reset(c)
		return
	}
	c.SetDeadline(time.Now().Add(p.o.HeaderTimeout))
	buf := make([]byte, socks5.MaxRequestLen)
	fail := func(reason string, err error) {
		p.refuse(t, reason, "src", src, "err", err)
		reset(c)
	}
	if _, err := io.ReadFull(c, buf[:2]); err != nil {
		fail(readReason(err), err)
		return
	}
	n, err := socks5.GreetingLen(buf[:2])
	if err != nil {
		fail(ReasonMalformed, err)
		return
	}
	if _, err := io.ReadFull(c, buf[2:n]); err != nil {
		fail(readReason(err), err)
		return
	}
	var g socks5.Greeting
	if _, err := g.Decode(buf[:n]); err != nil {
		fail(ReasonMalformed, err)
		return
	}
	if !g.Offers(socks5.MethodNoAuth) {
		c.Write(socks5.AppendSelection(nil, socks5.MethodNoAcceptable))
		fail(ReasonMalformed, errors.New("the client offers no method without authentication"))
		return
	}
	if _, err := c.Write(socks5.AppendSelection(nil, socks5.MethodNoAuth)); err != nil {
		fail(readReason(err), err)
		return
	}
	// VER CMD RSV ATYP, and the domain length byte if any.
	if _, err := io.ReadFull(c, buf[:5]); err != nil {
		fail(readReason(err), err)
		return
	}
	answer := func(code byte) error {
		b, _ := socks5.Reply{Code: code}.Append(nil)
		_, err := c.Write(b)
		return err
	}
	n, err = socks5.RequestLen(buf[:5])
	if errors.Is(err, socks5.ErrAddrType) {
		answer(socks5.RepAddrTypeUnsupported)
		fail(ReasonAddrType, err)
		return
	}
	if err != nil {
		fail(ReasonMalformed, err)
		return
	}
	if _, err := io.ReadFull(c, buf[5:n]); err != nil {
		fail(readReason(err), err)
		return
	}
	var r socks5.Request
	if _, err := r.Decode(buf[:n]); err != nil || r.Cmd != socks5.CmdConnect {
		if err == nil || errors.Is(err, socks5.ErrCommand) {
			answer(socks5.RepCommandUnsupported)
			fail(ReasonCommand, fmt.Errorf("command %d: only CONNECT is served", r.Cmd))
			return
		}
		answer(socks5.RepGeneralFailure)
		fail(ReasonMalformed, err)
		return
	}
	dst := r.Dst.AddrPort()
	if r.Dst.Name != "" {
		ctx, cancel := context.WithTimeout(p.ctx, p.o.ConnectTimeout)
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", r.Dst.Name)
		cancel()
		if err != nil || len(ips) == 0 {
			answer(socks5.RepHostUnreachable)
			fail(ReasonDstUnreachable, fmt.Errorf("resolve %s: %v", r.Dst.Name, err))
			return
		}
		dst = netip.AddrPortFrom(ips[0].Unmap(), r.Dst.Port)
	}
	c.SetDeadline(time.Time{})
	p.relayOut(t, c, src, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()), answer)
}

// readReason names a failed read of a request: a timeout or a truncated request.
func readReason(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ReasonTimeout
	}
	return ReasonMalformed
}

// peerConn is one connection to a peer proxy.
type peerConn struct {
	c     net.Conn     // TLS over raw, or raw in plaintext
	raw   *net.TCPConn // the MPTCP socket
	born  time.Time
	ready bool // the peer's ready byte has been read
}

func (pc *peerConn) abort() { reset(pc.raw) }

var errPoolClosed = errors.New("proxy: the peer is no longer configured")

// pool keeps connections to one peer open and authenticated, so that a new client connection
// costs no round trip to the peer.
type pool struct {
	p      *Proxy
	pr     *peer
	ready  chan *peerConn
	kick   chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newPool(p *Proxy, pr *peer) *pool {
	return &pool{p: p, pr: pr, ready: make(chan *peerConn, max(p.o.Pool, 1)), kick: make(chan struct{}, 1), closed: make(chan struct{})}
}

// get returns a pooled connection, or dials one when none is ready.
func (pl *pool) get(ctx context.Context) (*peerConn, error) {
	select {
	case <-pl.closed: // the proxy stops, or a reload removed the peer
		return nil, errPoolClosed
	default:
	}
	for {
		select {
		case pc := <-pl.ready:
			pl.wake()
			if time.Since(pc.born) < pl.p.o.PoolIdle && alive(pc.raw) {
				return pc, nil
			}
			pc.abort()
			continue
		default:
		}
		pl.wake()
		return pl.dial(ctx, false)
	}
}

func (pl *pool) wake() {
	select {
	case pl.kick <- struct{}{}:
	default:
	}
}

// run keeps the pool full until ctx ends or the pool closes: the missing connections are
// dialled in parallel, so that a burst of clients is followed by one refill time, not one per
// connection; connections that age out or die are replaced. Failures back off up to 5 s.
func (pl *pool) run(ctx context.Context) {
	n := pl.p.o.Pool
	if n == 0 {
		return
	}
	results := make(chan error, n) // each dial sends once; at most n are under way
	inflight := 0
	backoff := 100 * time.Millisecond
	var retryAt time.Time
	tick := time.NewTicker(max(pl.p.o.PoolIdle/4, 100*time.Millisecond))
	defer tick.Stop()
	for {
		for inflight+len(pl.ready) < n && !time.Now().Before(retryAt) {
			inflight++
			pl.p.wg.Add(1)
			go func() {
				defer pl.p.wg.Done()
				dctx, cancel := context.WithTimeout(ctx, pl.p.o.ConnectTimeout)
				pc, err := pl.dial(dctx, true)
				cancel()
				if err == nil {
					select {
					case <-pl.closed:
						pc.abort()
					case pl.ready <- pc:
					default:
						pc.abort()
					}
				}
				results <- err
			}()
		}
		var retry <-chan time.Time
		if wait := time.Until(retryAt); wait > 0 {
			retry = time.After(wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-pl.closed:
			return
		case err := <-results:
			inflight--
			if err == nil {
				backoff, retryAt = 100*time.Millisecond, time.Time{}
				continue
			}
			if ctx.Err() != nil {
				return
			}
			pl.pr.t.c.poolFailures.Add(1)
			if pl.p.limiter.allow("pool/" + pl.pr.t.Name + "/" + pl.pr.Name) {
				pl.p.log.Warn("peer connection", "tenant", pl.pr.t.Name, "peer", pl.pr.Name, "err", err)
			}
			retryAt = time.Now().Add(backoff)
			backoff = min(2*backoff, 5*time.Second)
		case <-retry:
		case <-pl.kick:
		case <-tick.C:
			pl.refresh()
		}
	}
}

// refresh drops the pooled connections that aged out or died.
func (pl *pool) refresh() {
	for range len(pl.ready) {
		select {
		case pc := <-pl.ready:
			if time.Since(pc.born) < pl.p.o.PoolIdle*3/4 && alive(pc.raw) {
				pl.ready <- pc
			} else {
				pc.abort()
			}
		default:
			return
		}
	}
}

// close empties the pool and stops it from refilling. Idempotent.
func (pl *pool) close() {
	pl.once.Do(func() { close(pl.closed) })
	for {
		select {
		case pc := <-pl.ready:
			pc.abort()
		default:
			return
		}
	}
}

// dial opens an MPTCP connection to the peer (its addresses in order), authenticates it, and,
// with waitReady, waits for the peer's ready byte.
func (pl *pool) dial(ctx context.Context, waitReady bool) (*peerConn, error) {
	pr := pl.pr
	var lastErr error
	for _, a := range pr.Addrs {
		d := net.Dialer{Control: mptcpControl, KeepAliveConfig: mptcpKeepAlive}
		d.SetMultipathTCP(true)
		c, err := d.DialContext(ctx, "tcp", a.String())
		if err != nil {
			lastErr = err
			continue
		}
		raw := c.(*net.TCPConn)
		pc := &peerConn{c: raw, raw: raw, born: time.Now()}
		if dl, ok := ctx.Deadline(); ok {
			raw.SetDeadline(dl)
		}
		if pr.tls != nil {
			tc := tls.Client(raw, pr.tls)
			if err := tc.HandshakeContext(ctx); err != nil {
				reset(raw)
				lastErr = fmt.Errorf("TLS with %s: %w", a, err)
				continue
			}
			pc.c = tc
		}
		if waitReady {
			var x [1]byte
			if _, err := io.ReadFull(pc.c, x[:]); err != nil || x[0] != readyByte {
				reset(raw)
				if err == nil {
					err = errors.New("unexpected first byte")
				}
				lastErr = fmt.Errorf("%s did not accept us (is our key configured there?): %w", a, err)
				continue
			}
			pc.ready = true
		}
		raw.SetDeadline(time.Time{})
		return pc, nil
	}
	if lastErr == nil {
		lastErr = errors.New("no address")
	}
	return nil, lastErr
}
