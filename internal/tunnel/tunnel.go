// Package tunnel is braid's multipath L3 tunnel (MPT-GRE and beyond): IP packets read from a
// TUN device are sealed and spread over several UDP paths to a peer site in GRE-in-UDP, put back
// in order at the far side and written to its TUN device. Every path is probed, also when the
// tunnel is idle, so a dead path is noticed in milliseconds and a live one comes back by itself.
//
// The wire format is in docs/tunnel-wire.md. This package is the control side and the packet
// loops; the pure pieces live in session (keys, handshake, sealing), path (liveness and RTT),
// reorder (the receive buffer) and sched (path choice).
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"braid/internal/sched"
	"braid/internal/tunnel/path"
	"braid/internal/tunnel/reorder"
	"braid/internal/tunnel/session"
	"braid/internal/wire/gre"
	"braid/internal/wire/mpath"
)

// Device is the tunnel's TUN interface: one IP packet per call.
type Device interface {
	Read(b []byte) (int, error)
	Write(b []byte) (int, error)
	Close() error
}

// BatchDevice is a Device that moves several packets per system call: a TUN device with
// offloads. The tunnel uses it when the device has it.
type BatchDevice interface {
	// ReadBatch reads packets into bufs[i][offset:], up to len(bufs), with their lengths in
	// sizes, and returns how many: possibly 0 (a packet the device could not split, which it
	// counts).
	ReadBatch(bufs [][]byte, offset int, sizes []int) (int, error)
	// WriteBatch writes pkts in order, joining what it can; safe for concurrent use.
	WriteBatch(pkts [][]byte) error
}

// BatchConn is a Conn that sends and receives several datagrams per system call (UDP
// segmentation and coalescing offloads). The tunnel uses it when the socket has it.
type BatchConn interface {
	// SendSegments sends the datagrams packed in b, each seg bytes but the last (which may be
	// shorter), to dst; like Send it never blocks.
	SendSegments(b []byte, seg int, dst netip.AddrPort) error
	// ReadSegments reads into b what arrived from one source: n bytes of datagrams of seg
	// bytes each but the last. oob is scratch for the kernel's control message.
	ReadSegments(b, oob []byte) (n, seg int, src netip.AddrPort, err error)
}

// Conn is one uplink's UDP socket. Send never blocks: a full buffer is an error the tunnel
// counts as a drop on that path.
type Conn interface {
	ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error)
	Send(b []byte, dst netip.AddrPort) error
	Close() error
}

// Uplink is one of the site's own paths: a socket bound to one of its addresses.
type Uplink struct {
	Name string
	Conn Conn
	// MTU is the uplink interface's MTU: the largest packet its paths are probed with. 0
	// means the tunnel MTU plus the tunnel's overhead and outer headers.
	MTU int
	// Capacity is the uplink's rate in bit/s (IP bytes), 0 unknown. The paced scheduler sends
	// every path that leaves by the uplink, of every peer, through one token bucket at this
	// rate, besides each path's own: paths that share the uplink share its capacity.
	Capacity uint64
	// Local is the address and port the uplink's socket is bound to, for the status (and the
	// outer header size of paths not learned yet); the zero value: unknown.
	Local netip.AddrPort
	// Interface is the network interface the uplink leaves by ("" unknown). With Follow, the
	// uplink is the interface's: FollowUplinks (follow.go) binds its socket to the address the
	// interface has now, binds it anew when the address changes, and opens it when the
	// interface appears; Conn may then be nil (no address yet, no interface yet).
	Interface string
	Follow    bool
	// Port is the local UDP port of a Follow uplink.
	Port uint16
}

// PeerConfig is one remote site.
type PeerConfig struct {
	Name      string
	PublicKey session.PublicKey
	Routes    []netip.Prefix // inner destinations sent to this peer (and inner sources accepted from it)
	// Paths with a Remote each are the peer's initial addresses (they follow the peer when
	// its address changes); paths without one (all of them then) name the uplinks on which
	// the peer's paths are learned from its authenticated packets (roam.go).
	Paths []PathConfig
	// Keepalive is the longest a path stays without sending to the peer; 0: DefaultKeepalive.
	Keepalive time.Duration
	// MaxPaths bounds the learned paths; 0: DefaultMaxPaths.
	MaxPaths int
}

// PathConfig is one path to a peer: a local uplink and the peer's address on it (none: the
// peer's paths on this uplink are learned).
type PathConfig struct {
	Uplink   string
	Remote   netip.AddrPort
	Weight   float64 // 0: from measured capacity
	Capacity uint64  // bit/s hint for the scheduler; 0 unknown
}

// Options configure a tunnel.
type Options struct {
	PrivateKey session.PrivateKey
	Device     Device
	MTU        int // of the TUN device at start: the largest inner packet
	// SetMTU, when set, is called with a new tunnel MTU when path MTU discovery finds that the
	// smallest usable path carries less than the current one (or, later, more, up to MTU); it
	// sets the TUN device's MTU. Without it the MTU stays fixed and a smaller path is logged.
	SetMTU func(mtu int) error
	// PMTU tunes the path MTU search of every path (Max comes from each uplink).
	PMTU       path.PMTUConfig
	Uplinks    []Uplink
	Peers      []PeerConfig
	Path       path.Config
	Reorder    bool
	ReorderCfg reorder.Config
	// Recovery resends data packets a peer reports lost, once each, on the fastest path, and
	// reports the losses this side sees (recovery.go).
	Recovery bool
	// SparseFlows sends each packet of a sparse flow (one that sends little: pings, DNS,
	// voice, handshakes; package sparse) ahead in the send queue, flagged, on every Up path
	// that is not a backup, within a budget of sparseCopyRate per peer: with the default
	// scheduler (paced) and in sessions of protocol version 3 only. It also meters the flows
	// of a peer of version 2, which flags nothing, and delivers their sparse packets at once.
	// Packets a peer flags are delivered at once whatever SparseFlows says, as version 3
	// requires (docs/scheduling.md, "Sparse flows").
	SparseFlows bool
	// Versions are the protocol versions the tunnel speaks; zero: every version this release
	// speaks (session.Supported). A test sets fewer to play an older release; site files
	// cannot.
	Versions session.Versions
	// Cleartext turns encryption of data packets off: they are sent authenticated but in
	// clear (FlagClear), and such packets from peers are accepted. Control messages stay
	// sealed. Without it, clear data packets are refused (counted as drop_cleartext).
	Cleartext bool
	// Ciphers are the transport ciphers this side offers and accepts; 0 means those this
	// machine runs fast (session.Fast). The responder of a handshake picks the best both
	// accept.
	Ciphers   session.Ciphers
	Scheduler string // "paced" (default), "wrr", "minrtt"
	// CapacityCfg tunes the capacity estimator of paths with no configured capacity.
	CapacityCfg sched.CapacityConfig
	// Shards is the number of sockets per uplink that receive at once (shard.go): the
	// uplinks' sockets are groups of that many (ShardedConn), and the tunnel gives each peer
	// session indices that steer it to one of them. 0 or 1: one socket, one reader.
	Shards int
	Logger *slog.Logger
}

// Overhead is what the tunnel adds to an inner packet, before the outer IP and UDP headers.
const Overhead = headroom + session.Overhead

// headroom is the space kept in front of an inner packet for the headers written in place.
const headroom = greLen + mpath.HeaderLen + mpath.DataPrefixLen

const greLen = 8 // GRE with the K bit

// Tunnel is a running multipath tunnel.
type Tunnel struct {
	o    Options
	log  *slog.Logger
	priv session.PrivateKey
	pub  session.PublicKey
	// tab is the peers and the route table, read without a lock for every packet and
	// replaced whole by Reload (reload.go).
	tab atomic.Pointer[table]

	// reloadMu serialises Reload and guards uplinks (by name) and running.
	reloadMu sync.Mutex
	uplinks  map[string]*uplink
	running  bool // Run has started the uplinks' readers
	// queueing: the scheduler plans a send queue (a reload keeps it so)
	queueing bool
	// errc takes the first error of a loop (the device's or an uplink's reader).
	errc chan error

	mu       sync.Mutex // guards sessions and shards
	sessions map[uint32]*sessionRef
	// shards is the receive shard of each peer that reserved a session index (shard.go).
	shards    map[session.PublicKey]uint32
	nextShard uint32
	// sessionsRO is a copy of sessions for the receive loops (publishSessions).
	sessionsRO atomic.Pointer[map[uint32]*sessionRef]

	stats Counters
	bufs  sync.Pool // *packetBuf of pktSize bytes
	// pktSize is the largest datagram a path of ours can carry, and then some.
	pktSize int
	mtu     atomic.Int64 // the tunnel MTU now: the largest inner packet sent
	// mtuWarned: the log has said that a path carries less than the tunnel MTU can follow
	// (timers goroutine only).
	mtuWarned bool
	start     time.Time
	closing   atomic.Bool
	wg        sync.WaitGroup

	// handshake initiations (hsworker.go): the MAC key of ours, the worker's queue and budget,
	// the cookies and until when (monotonic nanoseconds) the worker counts as under load
	mac1      [32]byte
	hsq       chan hsJob
	hsBudget  hsBudget
	v1Warned  atomic.Bool
	cookies   *session.Cookies
	loadUntil atomic.Int64
	hsSources hsSourceLimit
}

type uplink struct {
	name string
	mtu  int
	// sk is the uplink's socket now: a Follow uplink gets a new one when its interface's
	// address changes (follow.go); the packet loops load it for every send.
	sk atomic.Pointer[upSock]
	// iface, follow and port: the uplink follows the interface's address (Uplink.Follow)
	iface  string
	follow bool
	port   uint16
	// state is the interface's state as the follower last saw it (follow.go), "" when the
	// uplink does not follow one; rebinds counts the sockets it opened after the first.
	state   atomic.Pointer[string]
	rebinds atomic.Uint64
	// pace is the uplink's shared token bucket (nil when its capacity is unknown); only the
	// device reader, through the peers' schedulers, touches its tokens. A reload that
	// changes the capacity swaps in a new one.
	pace atomic.Pointer[sched.Bucket]
	// removed: a reload took the uplink out; its reader stops without an error.
	removed atomic.Bool
	// shardReads counts the reads of each socket of the uplink's group (shard.go); nil
	// while it has one socket.
	shardReads atomic.Pointer[[]atomic.Uint64]
}

// upSock is an uplink's socket and the address it is bound to; conn is nil while a following
// uplink has none (its interface has no address, or is not there yet).
type upSock struct {
	conn    Conn
	local   netip.AddrPort
	ifindex int // the interface the follower bound it on; 0 unknown
}

// sock is the uplink's socket now (never nil; its conn may be).
func (u *uplink) sock() *upSock { return u.sk.Load() }

// conn is the uplink's socket's Conn now, nil when it has none.
func (u *uplink) conn() Conn { return u.sock().conn }

// local is the address the uplink's socket is bound to now; the zero value: unknown.
func (u *uplink) local() netip.AddrPort { return u.sock().local }

func newUplink(u Uplink) *uplink {
	up := &uplink{name: u.Name, mtu: u.MTU, iface: u.Interface, follow: u.Follow, port: u.Port}
	up.sk.Store(&upSock{conn: u.Conn, local: u.Local})
	if u.Capacity > 0 {
		up.pace.Store(sched.NewBucket(float64(u.Capacity)))
	}
	return up
}

type route struct {
	prefix netip.Prefix
	peer   *peer
}

// table is what the packet loops look up without a lock: the peers and their routes, longest
// prefix first. It is never changed once published; a reload publishes a new one.
type table struct {
	peers  []*peer
	routes []route
}

// newTable makes the table of peers.
func newTable(peers []*peer) *table {
	tab := &table{peers: peers}
	for _, p := range peers {
		for _, r := range *p.routes.Load() {
			tab.routes = append(tab.routes, route{prefix: r.Masked(), peer: p})
		}
	}
	// Longest prefix first, so the first match is the best.
	sort.SliceStable(tab.routes, func(i, j int) bool { return tab.routes[i].prefix.Bits() > tab.routes[j].prefix.Bits() })
	return tab
}

// peerList is the peers now.
func (t *Tunnel) peerList() []*peer { return t.tab.Load().peers }

type sessionRef struct {
	s    *session.Session
	peer *peer
}

// New checks the options and prepares a tunnel; Run starts it.
func New(o Options) (*Tunnel, error) {
	if o.PrivateKey.IsZero() {
		return nil, errors.New("tunnel: no private key (run 'braid keygen')")
	}
	if o.Device == nil {
		return nil, errors.New("tunnel: no device")
	}
	if o.MTU == 0 {
		o.MTU = 1400
	}
	if o.MTU < 576 || o.MTU > 65535-Overhead-48 {
		return nil, fmt.Errorf("tunnel: MTU %d outside 576..%d", o.MTU, 65535-Overhead-48)
	}
	if o.Shards < 0 || o.Shards > 1024 {
		return nil, fmt.Errorf("tunnel: %d shards outside 0..1024", o.Shards)
	}
	for _, u := range o.Uplinks {
		if err := checkUplink(u); err != nil {
			return nil, err
		}
	}
	o.Path = o.Path.WithDefaults()
	if err := o.Path.Validate(); err != nil {
		return nil, fmt.Errorf("tunnel: %w", err)
	}
	o.ReorderCfg = o.ReorderCfg.Defaults()
	if err := o.ReorderCfg.Validate(); err != nil {
		return nil, fmt.Errorf("tunnel: %w", err)
	}
	if o.Ciphers == 0 {
		o.Ciphers = session.Fast()
	}
	if o.Ciphers&^session.AllCiphers != 0 {
		return nil, fmt.Errorf("tunnel: unknown ciphers %#x", uint8(o.Ciphers))
	}
	o.CapacityCfg = o.CapacityCfg.Defaults()
	if err := o.CapacityCfg.Validate(); err != nil {
		return nil, fmt.Errorf("tunnel: %w", err)
	}
	t := &Tunnel{
		o: o, log: o.Logger, priv: o.PrivateKey, pub: o.PrivateKey.Public(),
		mac1: session.MAC1Key(o.PrivateKey.Public()), hsq: make(chan hsJob, hsQueue), hsBudget: hsBudget{tokens: hsBurst},
		cookies: session.NewCookies(o.PrivateKey.Public()),
		uplinks: map[string]*uplink{}, sessions: map[uint32]*sessionRef{}, shards: map[session.PublicKey]uint32{}, start: time.Now(),
		errc: make(chan error, 1),
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	t.mtu.Store(int64(o.MTU))
	// Buffers hold the largest datagram any uplink can receive (a peer's packets are at most
	// its path MTU), and our own largest packet with its headers.
	t.pktSize = o.MTU + Overhead + 48
	for _, u := range o.Uplinks {
		t.pktSize = max(t.pktSize, u.MTU)
	}
	t.pktSize += 64
	t.bufs.New = func() any { return &packetBuf{b: make([]byte, t.pktSize)} }
	for _, u := range o.Uplinks {
		if _, dup := t.uplinks[u.Name]; dup {
			return nil, fmt.Errorf("tunnel: uplink %q twice", u.Name)
		}
		t.uplinks[u.Name] = newUplink(u)
	}
	if _, err := newScheduler(o.Scheduler); err != nil {
		return nil, err
	}
	t.queueing = plans(o.Scheduler)
	now := t.now()
	var peers []*peer
	for _, pc := range o.Peers {
		p, err := newPeer(t, t.uplinks, pc, o.Scheduler, now)
		if err != nil {
			return nil, err
		}
		peers = append(peers, p)
	}
	t.tab.Store(newTable(peers))
	return t, nil
}

// now is the tunnel's monotonic clock in nanoseconds.
func (t *Tunnel) now() int64 { return int64(time.Since(t.start)) + 1 }

// micros is the timestamp carried in packets: the monotonic clock in microseconds, wrapping.
func (t *Tunnel) micros(now int64) uint32 { return uint32(now / 1000) }

// Run moves packets until ctx ends or the device fails, then closes the device and sockets.
func (t *Tunnel) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t.wg.Go(func() { t.fail(t.readDevice()) })
	t.reloadMu.Lock()
	t.running = true
	for _, u := range t.uplinks {
		t.startReader(u)
	}
	nUplinks := len(t.uplinks)
	t.reloadMu.Unlock()
	t.wg.Go(func() { t.timers(ctx) })
	t.wg.Go(func() { t.handshakes(ctx) })
	encryption := "on"
	if t.o.Cleartext {
		encryption = "off: data in clear, authenticated only"
	}
	t.log.Info("tunnel up", "peers", len(t.peerList()), "uplinks", nUplinks, "mtu", t.o.MTU, "public_key", t.pub.String(), "encryption", encryption)
	if t.o.Cleartext {
		t.log.Warn("encryption is off: data packets travel in clear (authenticated, not confidential); handshakes and control messages stay sealed")
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-t.errc:
	}
	t.reloadMu.Lock()
	t.closing.Store(true)
	cancel()
	t.o.Device.Close()
	for _, u := range t.uplinks {
		if c := u.conn(); c != nil {
			c.Close()
		}
	}
	t.reloadMu.Unlock()
	t.wg.Wait()
	t.log.Info("tunnel down")
	return err // the loops return nil when they stop because of closing
}

// startReader starts the reader of u's socket now, if it has one; t.reloadMu is held.
func (t *Tunnel) startReader(u *uplink) {
	sk := u.sock()
	if sk.conn == nil {
		return
	}
	if g, ok := sk.conn.(ShardedConn); ok && g.Shards() > 1 {
		t.startShardReaders(u, sk, g)
		return
	}
	t.wg.Go(func() { t.fail(t.readUplink(u, sk, sk.conn)) })
}

// checkUplink checks what New and Reload take of an uplink.
func checkUplink(u Uplink) error {
	switch {
	case u.MTU < 0 || u.MTU > 65535:
		return fmt.Errorf("tunnel: uplink %s: MTU %d outside 0..65535", u.Name, u.MTU)
	case u.Follow && u.Interface == "":
		return fmt.Errorf("tunnel: uplink %s follows its interface's address, but names no interface", u.Name)
	case u.Conn == nil && !u.Follow:
		return fmt.Errorf("tunnel: uplink %s has no socket", u.Name)
	}
	return nil
}

// fail hands a loop's error to Run (the first one stops the tunnel); nil is no error.
func (t *Tunnel) fail(err error) {
	if err == nil {
		return
	}
	select {
	case t.errc <- err:
	default:
	}
}

// lookup returns the peer whose routes hold dst.
func (t *Tunnel) lookup(dst netip.Addr) *peer {
	for _, r := range t.tab.Load().routes {
		if r.prefix.Contains(dst) {
			return r.peer
		}
	}
	return nil
}

// reserveIndex allocates an unused, non-zero receiver index for a session of p; the session
// itself is set once the handshake has made it (setSession).
func (t *Tunnel) reserveIndex(p *peer) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	shard, n := t.shardOf(p)
	for {
		idx := randUint32()
		if n > 1 {
			idx = idx - idx%n + shard
		}
		if _, used := t.sessions[idx]; idx != 0 && !used {
			t.sessions[idx] = &sessionRef{peer: p}
			t.publishSessions()
			return idx
		}
	}
}

func (t *Tunnel) setSession(idx uint32, s *session.Session, p *peer) {
	t.mu.Lock()
	t.sessions[idx] = &sessionRef{s: s, peer: p}
	t.publishSessions()
	t.mu.Unlock()
}

func (t *Tunnel) dropIndex(idx uint32) {
	t.mu.Lock()
	delete(t.sessions, idx)
	t.publishSessions()
	t.mu.Unlock()
}

// publishSessions makes a copy of the sessions the receive loops read without a lock: they
// change a few times per peer every two minutes, and are read for every packet. t.mu is held.
func (t *Tunnel) publishSessions() {
	m := make(map[uint32]*sessionRef, len(t.sessions))
	for k, v := range t.sessions {
		m[k] = v
	}
	t.sessionsRO.Store(&m)
}

func (t *Tunnel) sessionFor(idx uint32) *sessionRef {
	if m := t.sessionsRO.Load(); m != nil {
		return (*m)[idx]
	}
	return nil
}

// greBraid is the GRE header of every braid-mode packet but the key.
var greBraid = gre.Header{KeyPresent: true, Protocol: gre.ProtoBraid}

// speaks is the set of protocol versions the tunnel offers and chooses among.
func (o *Options) speaks() session.Versions {
	if o.Versions == 0 {
		return session.Supported
	}
	return o.Versions
}
