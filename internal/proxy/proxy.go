// Package proxy is the federation proxy (`braid proxy`): it takes the TCP connections a site's
// interception hands it (TPROXY or REDIRECT) or that ordinary SOCKS5 clients open, carries each
// over one MPTCP connection to the peer proxy of the destination's site, and there opens plain
// TCP to the destination from the original client's address. Every proxy plays both roles.
//
// A connection from a client at site A to a server at site B:
//
//	client --TCP--> [A: intercept listener] --MPTCP (TLS 1.3, pinned keys)--> [B: peer listener]
//	  A: original destination (socket address or SO_ORIGINAL_DST) -> the tenant's peer whose
//	     networks hold it -> a pooled, already authenticated connection to that peer ->
//	     header (socks5 dialect: destination, source) written at once, the client's data after
//	     it, no answer awaited
//	  B: header read whole within header_timeout -> destination in the tenant's networks,
//	     claimed source in the peer's -> IP_TRANSPARENT socket bound to the client's address
//	     and port -> connect -> relay
//
// Data is copied with splice where neither side is encrypted; end of stream is passed on as a
// half-close and a reset as a reset. Refusals are counted by reason and logged at most once a
// second per reason.
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"braid/internal/mptcp/pmnl"
	"braid/internal/proxy/ident"
)

// Intercept is how intercepted connections arrive.
type Intercept uint8

const (
	InterceptNone     Intercept = iota // SOCKS5 only
	InterceptTProxy                    // the accepted socket's own address is the destination
	InterceptRedirect                  // NAT: SO_ORIGINAL_DST gives the destination
)

// Tenant is one isolated set of networks, ports and peers.
type Tenant struct {
	Name     string
	Networks []netip.Prefix // this site's networks of the tenant
	Port     uint16         // intercept listener (0: none)
	PeerPort uint16         // MPTCP listener for the tenant's peers
	Socks    netip.AddrPort // SOCKS5 listener (invalid: none)
	Peers    []Peer
}

// Peer is a peer proxy of a tenant.
type Peer struct {
	Name     string
	Key      ident.PublicKey // ignored in plaintext
	Addrs    []netip.AddrPort
	Networks []netip.Prefix
}

// Options configure a Proxy.
type Options struct {
	Tenants        []Tenant
	Cert           *tls.Certificate // this proxy's identity; nil: plaintext between proxies
	Intercept      Intercept
	Pool           int           // pre-established connections per peer
	PoolIdle       time.Duration // a pooled connection older than this is replaced
	ConnectTimeout time.Duration
	HeaderTimeout  time.Duration
	DrainTimeout   time.Duration
	Logger         *slog.Logger
	// Failover runs the send-side failover monitor (failover.go); it needs the kernel's
	// userspace path manager in the namespace. BackupAddrs are local addresses whose subflows
	// stay backup.
	Failover    bool
	BackupAddrs []netip.Addr
	// FailoverMaxBacklog: when the monitor closes a dead subflow, it resets the other live
	// subflows whose unsent data would take longer than this to send, so that what the dead
	// one held is re-sent first (failover.go); 0 turns that off.
	FailoverMaxBacklog time.Duration
	// SendBacklog bounds the data queued on the MPTCP subflows and not yet sent to what they
	// send in this time at their delivery rates (relay.go); 0: no bound but the kernel's.
	SendBacklog time.Duration
}

// Proxy is a running federation proxy.
type Proxy struct {
	o       Options
	log     *slog.Logger
	tenants []*tenant
	start   time.Time

	draining atomic.Bool
	nextID   atomic.Uint64

	mu      sync.Mutex // guards conns and pending
	conns   map[uint64]*conn
	pending map[*net.TCPConn]struct{} // accepted from peers, not yet relaying (pooled ones wait here)

	wg        sync.WaitGroup // every goroutine the proxy starts
	stop      context.CancelFunc
	ctx       context.Context
	closeOnce sync.Once
	limiter   logLimiter
}

type tenant struct {
	Tenant
	peers     []*peer
	byKey     map[ident.PublicKey]*peer
	tlsSrv    *tls.Config
	intercept []net.Listener
	socks     net.Listener
	peerLn    []net.Listener // IPv4 and, with IPv6 peers, IPv6 apart: subflows are then never IPv4-mapped sockets, which path-manager commands could not name
	c         *counters
}

type peer struct {
	Peer
	t    *tenant
	pool *pool
	tls  *tls.Config
}

// New opens every listener, so that a port in use or a missing privilege is an error at start,
// before anything is served.
func New(o Options) (p *Proxy, err error) {
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.HeaderTimeout == 0 {
		o.HeaderTimeout = 5 * time.Second
	}
	if o.PoolIdle == 0 {
		o.PoolIdle = time.Minute
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 30 * time.Second
	}
	p = &Proxy{o: o, log: o.Logger, conns: map[uint64]*conn{}, pending: map[*net.TCPConn]struct{}{}, start: time.Now()}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.ctx, p.stop = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			p.closeListeners(true)
			p.stop()
		}
	}()
	for _, tc := range o.Tenants {
		t := &tenant{Tenant: tc, byKey: map[ident.PublicKey]*peer{}, c: newCounters()}
		p.tenants = append(p.tenants, t)
		for _, pc := range tc.Peers {
			pr := &peer{Peer: pc, t: t}
			if o.Cert != nil {
				pr.tls = ident.ClientConfig(*o.Cert, pc.Key)
				t.byKey[pc.Key] = pr
			}
			pr.pool = newPool(p, pr)
			t.peers = append(t.peers, pr)
		}
		if o.Cert != nil {
			t.tlsSrv = ident.ServerConfig(*o.Cert, func(k ident.PublicKey) bool { return t.byKey[k] != nil })
		}
		if err := p.listen(t); err != nil {
			return nil, fmt.Errorf("proxy: tenant %s: %w", t.Name, err)
		}
	}
	return p, nil
}

func (p *Proxy) listen(t *tenant) error {
	if t.Port != 0 && p.o.Intercept != InterceptNone {
		for _, network := range []string{"tcp4", "tcp6"} {
			if network == "tcp6" && !hasV6(t) {
				continue
			}
			lc := net.ListenConfig{}
			lc.SetMultipathTCP(false) // the site side is plain TCP
			if p.o.Intercept == InterceptTProxy {
				lc.Control = transparent(network)
			}
			addr := "0.0.0.0"
			if network == "tcp6" {
				addr = "::"
			}
			ln, err := lc.Listen(context.Background(), network, net.JoinHostPort(addr, fmt.Sprint(t.Port)))
			if err != nil {
				return fmt.Errorf("intercept listener: %w", err)
			}
			t.intercept = append(t.intercept, ln)
		}
	}
	if t.Socks.IsValid() {
		lc := net.ListenConfig{}
		lc.SetMultipathTCP(false)
		ln, err := lc.Listen(context.Background(), "tcp", t.Socks.String())
		if err != nil {
			return fmt.Errorf("socks listener: %w", err)
		}
		t.socks = ln
	}
	for _, network := range []string{"tcp4", "tcp6"} {
		if network == "tcp6" && !hasV6Peer(t) {
			continue
		}
		addr := "0.0.0.0"
		if network == "tcp6" {
			addr = "::"
		}
		lc := net.ListenConfig{Control: mptcpControl, KeepAliveConfig: mptcpKeepAlive}
		lc.SetMultipathTCP(true)
		ln, err := lc.Listen(context.Background(), network, net.JoinHostPort(addr, fmt.Sprint(t.PeerPort)))
		if err != nil {
			return fmt.Errorf("peer listener: %w", err)
		}
		t.peerLn = append(t.peerLn, ln)
	}
	return nil
}

// hasV6Peer reports whether a peer of t has an IPv6 address (and so connects over IPv6).
func hasV6Peer(t *tenant) bool {
	for _, pr := range t.Peers {
		for _, a := range pr.Addrs {
			if a.Addr().Is6() && !a.Addr().Is4In6() {
				return true
			}
		}
	}
	return false
}

func hasV6(t *tenant) bool {
	for _, n := range t.Networks {
		if n.Addr().Is6() {
			return true
		}
	}
	return false
}

// Run serves until ctx ends, then drains: the intercept and SOCKS listeners close (new
// connections are refused), connections from peers are refused with a reset and counted, and
// the connections under way get DrainTimeout to finish before they are cut.
func (p *Proxy) Run(ctx context.Context) error {
	for _, t := range p.tenants {
		for _, ln := range t.intercept {
			p.goAccept(ln, func(c *net.TCPConn) { p.serveIntercepted(t, c) })
		}
		if t.socks != nil {
			p.goAccept(t.socks, func(c *net.TCPConn) { p.serveSocks(t, c) })
		}
		for _, ln := range t.peerLn {
			p.goAccept(ln, func(c *net.TCPConn) { p.servePeer(t, c) })
		}
		for _, pr := range t.peers {
			p.wg.Add(1)
			go func() { defer p.wg.Done(); pr.pool.run(p.ctx) }()
		}
	}
	if p.o.Failover {
		c, err := pmnl.Dial(pmnl.Options{})
		if err != nil {
			p.log.Warn("send-side failover off", "err", err)
		} else {
			p.wg.Add(1)
			go func() { defer p.wg.Done(); defer c.Close(); p.failover(p.ctx, c) }()
		}
	}
	p.log.Info("proxy running", "tenants", len(p.tenants), "encrypted", p.o.Cert != nil, "failover", p.o.Failover)
	<-ctx.Done()
	p.drain()
	return nil
}

// Active returns the number of relayed connections under way.
func (p *Proxy) Active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *Proxy) drain() {
	p.draining.Store(true)
	p.closeListeners(false)
	// Idle pooled connections from peers would carry new connections: close them, so that the
	// peers' pools drop them before a client depends on them.
	p.mu.Lock()
	for c := range p.pending {
		reset(c)
	}
	p.mu.Unlock()
	for _, t := range p.tenants {
		for _, pr := range t.peers {
			pr.pool.close()
		}
	}
	n := p.Active()
	p.log.Info("draining", "connections", n, "timeout", p.o.DrainTimeout)
	deadline := time.Now().Add(p.o.DrainTimeout)
	for p.Active() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := p.Active(); n > 0 {
		p.log.Warn("drain timeout: cutting connections", "connections", n)
	}
	p.Close()
}

// closeListeners closes the listeners that take new connections; the peer listener too when
// all is set (it stays open while draining, because an MPTCP connection cannot add subflows
// once its listener is gone).
func (p *Proxy) closeListeners(all bool) {
	for _, t := range p.tenants {
		for _, ln := range t.intercept {
			ln.Close()
		}
		if t.socks != nil {
			t.socks.Close()
		}
		if all {
			for _, ln := range t.peerLn {
				ln.Close()
			}
		}
	}
}

// Close stops everything at once: listeners, pools and every connection. Idempotent.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.draining.Store(true)
		p.closeListeners(true)
		p.stop()
		p.mu.Lock()
		for _, c := range p.conns {
			c.abort()
		}
		for c := range p.pending {
			reset(c)
		}
		p.mu.Unlock()
		for _, t := range p.tenants {
			for _, pr := range t.peers {
				pr.pool.close()
			}
		}
		p.wg.Wait()
		for _, t := range p.tenants { // dials that finished while closing
			for _, pr := range t.peers {
				pr.pool.close()
			}
		}
	})
	return nil
}

func (p *Proxy) goAccept(ln net.Listener, serve func(*net.TCPConn)) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				p.log.Warn("accept", "addr", ln.Addr(), "err", err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
}

// route returns the peer whose networks hold dst most specifically.
func (t *tenant) route(dst netip.Addr) *peer {
	var best *peer
	bits := -1
	for _, pr := range t.peers {
		for _, n := range pr.Networks {
			if n.Contains(dst) && n.Bits() > bits {
				best, bits = pr, n.Bits()
			}
		}
	}
	return best
}

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, n := range ps {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// refuse counts and (rate-limited) logs a refused connection.
func (p *Proxy) refuse(t *tenant, reason string, args ...any) {
	t.c.refused[reason].Add(1)
	if p.limiter.allow(t.Name + "/" + reason) {
		p.log.Warn("connection refused", append([]any{"tenant", t.Name, "reason", reason}, args...)...)
	}
}

// logLimiter lets one message per key through per second.
type logLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (l *logLimiter) allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	if now.Sub(l.last[key]) < time.Second {
		return false
	}
	l.last[key] = now
	return true
}
