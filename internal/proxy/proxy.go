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
	"reflect"
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
	// SocksClients are the client addresses the SOCKS5 listener serves; empty: the tenant's
	// own Networks. Anyone else is refused (src_not_allowed) before a byte is answered.
	SocksClients []netip.Prefix
	// AllowSourceless lets a peer's header without a source make this proxy connect to the
	// destination from its own address (a peer's SOCKS client outside the peer's networks).
	// Off: such headers are refused (no_source), so that a peer cannot borrow this site's
	// trusted address.
	AllowSourceless bool
	Peers           []Peer
}

// Peer is a peer proxy of a tenant.
type Peer struct {
	Name     string
	Key      ident.PublicKey // ignored in plaintext
	Addrs    []netip.AddrPort
	Networks []netip.Prefix
	// Sources are the addresses the peer connects from, in plaintext (where they are all that
	// identifies it); empty: the addresses of Addrs.
	Sources []netip.Prefix
}

// sources returns the prefixes a plaintext connection from the peer may come from.
func (pr Peer) sources() []netip.Prefix {
	if len(pr.Sources) > 0 {
		return pr.Sources
	}
	out := make([]netip.Prefix, 0, len(pr.Addrs))
	for _, a := range pr.Addrs {
		ip := a.Addr().Unmap()
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out
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
	// MaxUnauthenticated caps the connections accepted from would-be peers that have not yet
	// authenticated (TLS, or in plaintext the source check and the header); more are reset at
	// once and counted (unauth_limit). Connections from a peer's own addresses (its address
	// list, or its sources) have a cap of this size of their own, so that a flood from other
	// addresses cannot keep the real peers out. 0: DefaultMaxUnauthenticated.
	MaxUnauthenticated int
	// Authenticated, when set, is told of every peer connection once it has authenticated
	// (the Announcer sends ADD_ADDR only then).
	Authenticated func(local, remote netip.AddrPort)
}

// DefaultMaxUnauthenticated is Options.MaxUnauthenticated's default: a peer's pool (at most
// 64) and its bursts fit many times over, a flood does not hold more goroutines and sockets.
const DefaultMaxUnauthenticated = 256

// Proxy is a running federation proxy.
type Proxy struct {
	o       Options
	log     *slog.Logger
	tenants atomic.Pointer[[]*tenant] // replaced whole by Reload
	start   time.Time

	reloadMu sync.Mutex   // one Reload at a time, and Run's start against it
	running  bool         // Run has started the accept loops (guarded by reloadMu)
	unauth   atomic.Int64 // unauthenticated connections from addresses that are no peer's
	// unauthPeers counts unauthenticated connections from a peer's addresses (its own cap).
	unauthPeers atomic.Int64

	draining atomic.Bool
	nextID   atomic.Uint64

	mu      sync.Mutex // guards conns and pending
	conns   map[uint64]*conn
	pending map[*net.TCPConn]*pendingPeer // accepted from peers, not yet relaying (pooled ones wait here)

	wg        sync.WaitGroup // every goroutine the proxy starts
	stop      context.CancelFunc
	ctx       context.Context
	closeOnce sync.Once
	limiter   logLimiter
}

// tenant is a running tenant. Its configuration and peers are one immutable state that Reload
// replaces whole (the connections' goroutines read it without a lock); its listeners change
// only under reloadMu.
type tenant struct {
	Name      string
	st        atomic.Pointer[tenantState]
	tlsSrv    *tls.Config
	intercept listeners
	socks     listeners
	peerLn    listeners // IPv4 and, with IPv6 peers, IPv6 apart: subflows are then never IPv4-mapped sockets, which path-manager commands could not name
	c         *counters
}

// tenantState is a tenant's configuration and peers at one time.
type tenantState struct {
	Tenant
	peers []*peer
	byKey map[ident.PublicKey]*peer
}

func (t *tenant) state() *tenantState { return t.st.Load() }

// listeners are the listeners of one kind of a tenant, with what they were opened for.
type listeners struct {
	key string
	lns []net.Listener
}

func (l listeners) close() {
	for _, ln := range l.lns {
		ln.Close()
	}
}

type peer struct {
	Peer
	t    *tenant
	pool *pool
	tls  *tls.Config
}

// pendingPeer is a connection accepted from a would-be peer: its tenant, and its peer once
// it has authenticated.
type pendingPeer struct {
	t  *tenant
	pr atomic.Pointer[peer]
}

// has reports whether pr is one of the state's peers (a reload may have removed it).
func (s *tenantState) has(pr *peer) bool {
	for _, x := range s.peers {
		if x == pr {
			return true
		}
	}
	return false
}

// bySource returns the peer a plaintext connection from a comes from: the one peer whose
// sources hold it most specifically (the configuration refuses ambiguous sources).
func (s *tenantState) bySource(a netip.Addr) *peer {
	a = a.Unmap()
	var best *peer
	bits := -1
	for _, pr := range s.peers {
		for _, n := range pr.sources() {
			if n.Contains(a) && n.Bits() > bits {
				best, bits = pr, n.Bits()
			}
		}
	}
	return best
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
	if o.MaxUnauthenticated == 0 {
		o.MaxUnauthenticated = DefaultMaxUnauthenticated
	}
	p = &Proxy{o: o, log: o.Logger, conns: map[uint64]*conn{}, pending: map[*net.TCPConn]*pendingPeer{}, start: time.Now()}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.tenants.Store(&[]*tenant{})
	p.ctx, p.stop = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			p.closeListeners(true)
			p.stop()
		}
	}()
	var ts []*tenant
	for _, tc := range o.Tenants {
		t := &tenant{Name: tc.Name, c: newCounters()}
		t.st.Store(p.newState(t, tc, nil))
		if o.Cert != nil {
			t.tlsSrv = serverConfig(p, t)
		}
		ts = append(ts, t)
		p.tenants.Store(&ts)
		var err error
		if t.intercept, err = p.listenIntercept(tc, listeners{}); err == nil {
			if t.socks, err = p.listenSocks(tc, listeners{}); err == nil {
				t.peerLn, err = p.listenPeers(tc, listeners{})
			}
		}
		if err != nil {
			return nil, fmt.Errorf("proxy: tenant %s: %w", t.Name, err)
		}
	}
	if o.Cert == nil {
		p.log.Warn("PLAINTEXT between proxies: peers are not authenticated, only recognised by their source addresses; use only where the links are protected below (IPsec, a private network)")
	}
	return p, nil
}

// serverConfig is t's TLS server configuration: a client must hold the key of one of t's
// peers at the time of the handshake.
func serverConfig(p *Proxy, t *tenant) *tls.Config {
	return ident.ServerConfig(*p.o.Cert, func(k ident.PublicKey) bool { return t.state().byKey[k] != nil })
}

// newState makes the state of tenant t for tc, reusing the peers of old whose configuration is
// the same (with their pools and connections).
func (p *Proxy) newState(t *tenant, tc Tenant, old *tenantState) *tenantState {
	st := &tenantState{Tenant: tc, byKey: map[ident.PublicKey]*peer{}}
	for _, pc := range tc.Peers {
		var pr *peer
		if old != nil {
			for _, x := range old.peers {
				if x.Name == pc.Name && reflect.DeepEqual(x.Peer, pc) {
					pr = x
				}
			}
		}
		if pr == nil {
			pr = &peer{Peer: pc, t: t}
			if p.o.Cert != nil {
				pr.tls = ident.ClientConfig(*p.o.Cert, pc.Key)
			}
			pr.pool = newPool(p, pr)
		}
		if p.o.Cert != nil {
			st.byKey[pc.Key] = pr
		}
		st.peers = append(st.peers, pr)
	}
	return st
}

// listenIntercept opens the intercept listeners of tc, or keeps old when they are the same.
func (p *Proxy) listenIntercept(tc Tenant, old listeners) (listeners, error) {
	if tc.Port == 0 || p.o.Intercept == InterceptNone {
		return listeners{}, nil
	}
	l := listeners{key: fmt.Sprint(tc.Port, hasV6(tc))}
	if l.key == old.key {
		return old, nil
	}
	for _, network := range []string{"tcp4", "tcp6"} {
		if network == "tcp6" && !hasV6(tc) {
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
		ln, err := lc.Listen(context.Background(), network, net.JoinHostPort(addr, fmt.Sprint(tc.Port)))
		if err != nil {
			l.close()
			return listeners{}, fmt.Errorf("intercept listener: %w", err)
		}
		l.lns = append(l.lns, ln)
	}
	return l, nil
}

// listenSocks opens the SOCKS5 listener of tc, or keeps old when it is the same.
func (p *Proxy) listenSocks(tc Tenant, old listeners) (listeners, error) {
	if !tc.Socks.IsValid() {
		return listeners{}, nil
	}
	l := listeners{key: tc.Socks.String()}
	if l.key == old.key {
		return old, nil
	}
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp", tc.Socks.String())
	if err != nil {
		return listeners{}, fmt.Errorf("socks listener: %w", err)
	}
	l.lns = []net.Listener{ln}
	return l, nil
}

// listenPeers opens the MPTCP listeners for the peers of tc, or keeps old when they are the
// same.
func (p *Proxy) listenPeers(tc Tenant, old listeners) (listeners, error) {
	l := listeners{key: fmt.Sprint(tc.PeerPort, hasV6Peer(tc))}
	if l.key == old.key {
		return old, nil
	}
	for _, network := range []string{"tcp4", "tcp6"} {
		if network == "tcp6" && !hasV6Peer(tc) {
			continue
		}
		addr := "0.0.0.0"
		if network == "tcp6" {
			addr = "::"
		}
		lc := net.ListenConfig{Control: mptcpControl, KeepAliveConfig: mptcpKeepAlive}
		lc.SetMultipathTCP(true)
		ln, err := lc.Listen(context.Background(), network, net.JoinHostPort(addr, fmt.Sprint(tc.PeerPort)))
		if err != nil {
			l.close()
			return listeners{}, fmt.Errorf("peer listener: %w", err)
		}
		l.lns = append(l.lns, ln)
	}
	return l, nil
}

// hasV6Peer reports whether a peer of t has an IPv6 address (and so connects over IPv6).
func hasV6Peer(t Tenant) bool {
	for _, pr := range t.Peers {
		for _, a := range pr.Addrs {
			if a.Addr().Is6() && !a.Addr().Is4In6() {
				return true
			}
		}
	}
	return false
}

func hasV6(t Tenant) bool {
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
	p.reloadMu.Lock()
	p.running = true
	for _, t := range p.tenantList() {
		p.startListeners(t, t.intercept, t.socks, t.peerLn)
		for _, pr := range t.state().peers {
			p.startPool(pr)
		}
	}
	p.reloadMu.Unlock()
	if p.o.Failover {
		c, err := pmnl.Dial(pmnl.Options{})
		if err != nil {
			p.log.Warn("send-side failover off", "err", err)
		} else {
			p.wg.Add(1)
			go func() { defer p.wg.Done(); defer c.Close(); p.failover(p.ctx, c) }()
		}
	}
	if size, err := mptcpRcvBuf(); err != nil {
		p.log.Warn("MPTCP receive buffers left to the kernel's autotuning, which can stall a connection over paths of unequal delay (docs/proxy.md)", "err", err)
	} else {
		p.log.Debug("MPTCP receive buffer", "bytes", size)
	}
	p.log.Info("proxy running", "tenants", len(p.tenantList()), "encrypted", p.o.Cert != nil, "failover", p.o.Failover)
	<-ctx.Done()
	p.drain()
	return nil
}

// tenantList returns the running tenants.
func (p *Proxy) tenantList() []*tenant { return *p.tenants.Load() }

// startListeners starts the accept loops of t's listeners.
func (p *Proxy) startListeners(t *tenant, intercept, socks, peerLn listeners) {
	for _, ln := range intercept.lns {
		p.goAccept(ln, func(c *net.TCPConn) { p.serveIntercepted(t, c) })
	}
	for _, ln := range socks.lns {
		p.goAccept(ln, func(c *net.TCPConn) { p.serveSocks(t, c) })
	}
	for _, ln := range peerLn.lns {
		p.goAccept(ln, func(c *net.TCPConn) { p.servePeer(t, c) })
	}
}

func (p *Proxy) startPool(pr *peer) {
	p.wg.Add(1)
	go func() { defer p.wg.Done(); pr.pool.run(p.ctx) }()
}

// Active returns the number of relayed connections under way.
func (p *Proxy) Active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *Proxy) drain() {
	p.reloadMu.Lock() // a reload under way finishes first; later ones are refused
	p.draining.Store(true)
	p.closeListeners(false)
	p.reloadMu.Unlock()
	// Idle pooled connections from peers would carry new connections: close them, so that the
	// peers' pools drop them before a client depends on them.
	p.mu.Lock()
	for c := range p.pending {
		reset(c)
	}
	p.mu.Unlock()
	for _, t := range p.tenantList() {
		for _, pr := range t.state().peers {
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
	for _, t := range p.tenantList() {
		t.intercept.close()
		t.socks.close()
		if all {
			t.peerLn.close()
		}
	}
}

// Close stops everything at once: listeners, pools and every connection. Idempotent.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.reloadMu.Lock()
		p.draining.Store(true)
		p.closeListeners(true)
		p.reloadMu.Unlock()
		p.stop()
		p.mu.Lock()
		for _, c := range p.conns {
			c.abort()
		}
		for c := range p.pending {
			reset(c)
		}
		p.mu.Unlock()
		for _, t := range p.tenantList() {
			for _, pr := range t.state().peers {
				pr.pool.close()
			}
		}
		p.wg.Wait()
		for _, t := range p.tenantList() { // dials that finished while closing
			for _, pr := range t.state().peers {
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
func (t *tenantState) route(dst netip.Addr) *peer {
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

// socksClients are the client addresses the SOCKS5 listener serves.
func (s *tenantState) socksClients() []netip.Prefix {
	if len(s.SocksClients) > 0 {
		return s.SocksClients
	}
	return s.Networks
}
