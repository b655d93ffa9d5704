package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"braid/internal/sched"
	"braid/internal/tunnel/reorder"
	"braid/internal/wire/mpath"
	"braid/internal/wire/mpt"
)

// This file is the tunnel's mpt mode: one MPT connection (spyff/mpt, MPT-GRE), spoken byte for
// byte as MPT does (docs/tunnel-wire.md, mode mpt; tunnels.md sections 1-3), so that a braid
// site and an MPT site can form a tunnel. There is no session, no encryption and no
// authentication of data: data is accepted only from the configured remote addresses. Path
// status changes are exchanged with the peer on MPT's command port (mptcmd.go).
//
// Where MPT is broken, mpt mode does better without changing the wire:
//
//   - a path state change is an atomic flag flipped by the timers goroutine or the receiver,
//     never a handshake run from the data path under a global lock (MPT freezes a direction
//     for about 3 s on every change);
//   - the receiver checks the source port as well as the source IP, and the uplink the
//     datagram came in on;
//   - late packets are delivered instead of dropped, and a buffer overflow releases up to the
//     next gap instead of flushing (the reorder package);
//   - a datagram the local socket refuses does not use up a sequence number, so it leaves no
//     gap for the peer's reorder buffer to wait for;
//   - keepalives and the dead time have a 5 ms granularity instead of whole seconds.
//
// Since anyone who can send from a path's remote address (spoofed or not) speaks for the peer,
// mpt mode limits what such a sender can do (issue 18 item 13; docs/security.md, "Tunnel"):
// the start log warns that the mode has no authentication; an inner packet whose source is
// outside the peer's routes (and is not its tunnel address) is dropped (drop_spoofed); and only
// a datagram that passes every check keeps a path alive: junk, commands, keepalives that do not
// name the connection's tunnel addresses (drop_keepalive_mismatch) and spoofed inner sources
// do not, so that a sender who does not know the tunnel addresses cannot hold a dead path up.

// MPTPath is one path of an MPT connection: a local uplink and the peer's address on it.
type MPTPath struct {
	Uplink string
	Remote netip.AddrPort
	Weight int // MPT's weight_out; 0 means 1
	// Local is the path's own address, which names the path in the status exchange with the
	// peer; an invalid Addr means the uplink socket's address.
	Local netip.Addr
	// Interface is the path's local interface (MPT's interface_name): while it is down or has
	// no carrier, the path is down, at once. "" means not watched.
	Interface string
}

// MPTOptions configure an MPT connection.
type MPTOptions struct {
	Device  Device
	MTU     int // of the TUN device: the largest inner packet; 0 means 1400
	Uplinks []Uplink
	// IPVersion is the connection's ip_ver, 4 or 6: the GRE Protocol Type of every data packet
	// and keepalive (0x0800 or 0x86DD), whatever the inner packet's version.
	IPVersion int
	Routes    []netip.Prefix // inner destinations sent over the connection
	Paths     []MPTPath
	// ReorderWindow is MPT's reorder_window: 0 turns reordering off (4-byte GRE header, no
	// sequence number); more sets the S bit with the connection-wide sequence number on every
	// data packet and holds up to this many packets at the receiver.
	ReorderWindow int
	// MaxBuffDelay is MPT's max_buffdelay_msec: how long a packet may wait in the reorder
	// buffer for the gap before it. 0 means 100 ms, as in MPT.
	MaxBuffDelay time.Duration
	// Keepalive is the interval of the keepalives sent on every path; 0 sends none, and a
	// path is then always up unless its uplink's socket fails. DeadTime is how long a path may
	// stay silent (no keepalive, no packet at all) before it goes down; 0 means 3 × Keepalive,
	// as in MPT.
	Keepalive, DeadTime time.Duration
	// LocalTunnelIP and RemoteTunnelIP are carried in the keepalives (MPT's tunnel addresses;
	// an invalid Addr is sent as ::).
	LocalTunnelIP, RemoteTunnelIP netip.Addr
	// Command is the socket of MPT's command port (cmdport_local), on which the peer and braid
	// exchange path status changes (0xA2, mptcmd.go); nil: no exchange, paths are judged by
	// keepalives alone. RemoteCmdPort is the peer's (remote_cmd_port; 0 means 65050).
	// AuthType and AuthKey are the connection's auth_type (0, 1 or 2) and auth_key's bytes.
	Command       Conn
	RemoteCmdPort uint16
	AuthType      uint8
	AuthKey       []byte
	Logger        *slog.Logger
}

// MPTCounters are the connection's packet counters; drops are counted by reason.
type MPTCounters struct {
	RxPackets, RxBytes atomic.Uint64 // datagrams received on all uplinks, before any check
	TxPackets, TxBytes atomic.Uint64 // datagrams sent, data and keepalives
	Delivered          atomic.Uint64 // inner packets written to the device
	KeepalivesSent     atomic.Uint64
	KeepalivesReceived atomic.Uint64

	DropNotFromPath atomic.Uint64 // source address and uplink match no path
	DropBadGRE      atomic.Uint64 // truncated GRE header, or a malformed keepalive
	DropCommand     atomic.Uint64 // an MPT command other than the keepalive (ignored)
	DropBadInner    atomic.Uint64 // inner packet neither a whole IPv4 nor a whole IPv6 packet
	DropNoRoute     atomic.Uint64 // inner destination in none of the Routes
	DropNoPath      atomic.Uint64 // no path up
	DropSend        atomic.Uint64 // socket send buffer full, or the send failed
	DropDevice      atomic.Uint64 // the device refused a write
	// DropSpoofed: an inner source outside the peer's routes; DropKeepaliveMismatch: a
	// keepalive naming other tunnel addresses than the connection's. Neither keeps a path up.
	DropSpoofed, DropKeepaliveMismatch atomic.Uint64

	// The command port.
	CmdReceived           atomic.Uint64 // datagrams received, before any check
	CmdSent               atomic.Uint64 // 0xA2 sent, all rounds
	CmdApplied            atomic.Uint64 // path statuses applied from the peer
	CmdRefusedSource      atomic.Uint64 // from an address that is no path's remote
	CmdRefusedUnsupported atomic.Uint64 // a command other than 0xA2
	CmdRefusedMalformed   atomic.Uint64 // a 0xA2 that does not decode, or a round not 1 to 4
	CmdRefusedAuth        atomic.Uint64 // wrong auth_type, SHA-256, or token
	CmdRefusedNoPath      atomic.Uint64 // names no configured path
	CmdExchangeFailed     atomic.Uint64 // status changes the peer did not confirm
}

func (c *MPTCounters) snapshot() map[string]uint64 {
	return map[string]uint64{
		"rx_packets": c.RxPackets.Load(), "rx_bytes": c.RxBytes.Load(),
		"tx_packets": c.TxPackets.Load(), "tx_bytes": c.TxBytes.Load(), "delivered": c.Delivered.Load(),
		"keepalives_sent": c.KeepalivesSent.Load(), "keepalives_received": c.KeepalivesReceived.Load(),
		"drop_not_from_path": c.DropNotFromPath.Load(), "drop_bad_gre": c.DropBadGRE.Load(),
		"drop_command": c.DropCommand.Load(), "drop_bad_inner": c.DropBadInner.Load(),
		"drop_no_route": c.DropNoRoute.Load(), "drop_no_path": c.DropNoPath.Load(),
		"drop_send": c.DropSend.Load(), "drop_device": c.DropDevice.Load(),
		"drop_spoofed": c.DropSpoofed.Load(), "drop_keepalive_mismatch": c.DropKeepaliveMismatch.Load(),
		"cmd_received": c.CmdReceived.Load(), "cmd_sent": c.CmdSent.Load(), "cmd_applied": c.CmdApplied.Load(),
		"cmd_refused_source": c.CmdRefusedSource.Load(), "cmd_refused_unsupported": c.CmdRefusedUnsupported.Load(),
		"cmd_refused_malformed": c.CmdRefusedMalformed.Load(), "cmd_refused_auth": c.CmdRefusedAuth.Load(),
		"cmd_refused_no_path": c.CmdRefusedNoPath.Load(), "cmd_exchange_failed": c.CmdExchangeFailed.Load(),
	}
}

// MPTStatus is a snapshot of an MPT connection.
type MPTStatus struct {
	Uptime      time.Duration
	IPVersion   int
	Reorder     bool
	ReorderHold time.Duration // MaxBuffDelay when reordering is on
	ReorderHeld int           // packets waiting in the reorder buffer
	Counters    map[string]uint64
	Paths       []MPTPathStatus
}

// MPTPathStatus describes one path.
type MPTPathStatus struct {
	ID     int // 1-based, in the order of MPTOptions.Paths
	Uplink string
	Remote string
	Weight int
	State  string // "up" or "down"
	// Status says why: ok, path_down (silent for the dead time), if_down, path_down_manual,
	// peer_down (the peer announced it down).
	Status             string
	UplinkFailed       bool // the uplink's socket failed: down for good
	SinceReceive       time.Duration
	TxPackets, TxBytes uint64 // data and keepalives
	TxDrops            uint64
	RxPackets, RxBytes uint64 // accepted datagrams, data and keepalives
	KeepalivesSent     uint64
	KeepalivesReceived uint64
}

const (
	mptTick         = 5 * time.Millisecond
	mptDefaultDelay = 100 * time.Millisecond
	// mptHeadroom is the space in front of an inner packet for the longest GRE header.
	mptHeadroom = mpt.SeqHeaderLen
	// mptHeldSize is the capacity of the buffers that hold packets in the reorder buffer;
	// larger packets grow theirs.
	mptHeldSize = 2048
)

// MPTTunnel is a running MPT connection.
type MPTTunnel struct {
	o        MPTOptions
	log      *slog.Logger
	uplinks  []*mptUplink
	paths    []*mptPath
	routes   []netip.Prefix
	reorder  bool
	dead     int64  // ns; 0: paths never time out
	every    int64  // keepalive interval, ns; 0: none
	kaPacket []byte // the keepalive datagram, the same on every path

	// Send side, owned by the device reader.
	sch   sched.WRR
	snap  []sched.Path
	txSeq uint32 // last sequence number sent

	rx  mptRx
	cmd *mptCmd // nil without a command port

	stats   MPTCounters
	start   time.Time
	started atomic.Bool
	closing atomic.Bool
	wg      sync.WaitGroup
}

type mptUplink struct {
	name   string
	conn   Conn
	paths  []*mptPath // the paths on this uplink
	failed atomic.Bool
}

type mptPath struct {
	id     int
	up     *mptUplink
	remote netip.AddrPort
	weight int

	local netip.Addr
	iface string
	alive atomic.Bool
	// Set by the interface watch, by hand, and by the peer's status exchange.
	ifDown, manual, peerDown atomic.Bool
	announce                 atomic.Bool  // the peer is to be told the local status
	retryAt                  atomic.Int64 // t.now() to announce again, 0: none
	cmdFailing               atomic.Bool  // the last announcement was not confirmed
	cmdMu                    sync.Mutex
	challenge                [mpt.TokenLen]byte // the last round-2 token sent, for round 3
	request                  [mpt.TokenLen]byte // the token of the round 1 it answered
	challengeAt              int64
	lastRx                   atomic.Int64 // t.now() of the last datagram accepted from the path
	nextKA                   int64        // owned by the timers goroutine

	txPackets, txBytes, txDrops atomic.Uint64
	rxPackets, rxBytes          atomic.Uint64
	kaSent, kaRecv              atomic.Uint64
}

// usable reports whether data may be sent on the path.
func (p *mptPath) usable() bool {
	return p.alive.Load() && !p.up.failed.Load() && !p.ifDown.Load() && !p.manual.Load() && !p.peerDown.Load()
}

// status names p's status (MPTPathStatus.Status).
func (p *mptPath) status() string {
	switch {
	case p.manual.Load():
		return mptStatusManual
	case p.ifDown.Load():
		return mptStatusIfDown
	case p.peerDown.Load():
		return mptStatusPeerDown
	case !p.alive.Load():
		return mptStatusDead
	}
	return mptStatusOK
}

// mptRx is the receive side's reorder buffer. Packets it releases are queued and written by one
// goroutine at a time, the drainer, so that they reach the device in the order released while
// no lock is held across a device write.
type mptRx struct {
	mu       sync.Mutex
	rb       *reorder.Buffer[*mptHeld]
	queue    []*mptHeld
	spare    []*mptHeld
	draining bool
}

// mptHeld is a copy of an inner packet kept in the reorder buffer.
type mptHeld struct{ b []byte }

var mptHeldPool = sync.Pool{New: func() any { return &mptHeld{b: make([]byte, 0, mptHeldSize)} }}

// NewMPT checks the options and prepares a connection; Run starts it.
func NewMPT(o MPTOptions) (*MPTTunnel, error) {
	if o.Device == nil {
		return nil, errors.New("mpt: no device")
	}
	if o.MTU == 0 {
		o.MTU = 1400
	}
	if maxMTU := 65535 - 48 - mpt.SeqHeaderLen; o.MTU < 576 || o.MTU > maxMTU {
		return nil, fmt.Errorf("mpt: MTU %d outside 576..%d", o.MTU, maxMTU)
	}
	if o.IPVersion != 4 && o.IPVersion != 6 {
		return nil, fmt.Errorf("mpt: ip_ver %d, want 4 or 6", o.IPVersion)
	}
	if o.ReorderWindow < 0 {
		return nil, fmt.Errorf("mpt: reorder window %d is negative", o.ReorderWindow)
	}
	if o.MaxBuffDelay < 0 {
		return nil, fmt.Errorf("mpt: max buffer delay %v is negative", o.MaxBuffDelay)
	}
	if o.MaxBuffDelay == 0 {
		o.MaxBuffDelay = mptDefaultDelay
	}
	if o.Keepalive < 0 || o.DeadTime < 0 {
		return nil, fmt.Errorf("mpt: keepalive %v, dead time %v: negative", o.Keepalive, o.DeadTime)
	}
	if o.Keepalive > 0 && o.DeadTime == 0 {
		o.DeadTime = 3 * o.Keepalive
	}
	if o.Keepalive > 0 && o.DeadTime <= o.Keepalive {
		return nil, fmt.Errorf("mpt: dead time %v not longer than the keepalive interval %v: paths would flap", o.DeadTime, o.Keepalive)
	}
	if len(o.Paths) == 0 {
		return nil, errors.New("mpt: no paths")
	}
	t := &MPTTunnel{o: o, log: o.Logger, start: time.Now(), reorder: o.ReorderWindow > 0}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	byName := map[string]*mptUplink{}
	for _, u := range o.Uplinks {
		if u.Conn == nil {
			return nil, fmt.Errorf("mpt: uplink %q has no socket", u.Name)
		}
		if _, dup := byName[u.Name]; dup {
			return nil, fmt.Errorf("mpt: uplink %q twice", u.Name)
		}
		up := &mptUplink{name: u.Name, conn: u.Conn}
		byName[u.Name] = up
		t.uplinks = append(t.uplinks, up)
	}
	now := t.now()
	for i, pc := range o.Paths {
		up := byName[pc.Uplink]
		if up == nil {
			return nil, fmt.Errorf("mpt: path %d: no uplink %q", i+1, pc.Uplink)
		}
		if !pc.Remote.IsValid() || pc.Remote.Port() == 0 {
			return nil, fmt.Errorf("mpt: path %d: remote %v needs an address and a port", i+1, pc.Remote)
		}
		if pc.Weight < 0 {
			return nil, fmt.Errorf("mpt: path %d: weight %d is negative", i+1, pc.Weight)
		}
		w := pc.Weight
		if w == 0 {
			w = 1
		}
		remote := netip.AddrPortFrom(pc.Remote.Addr().Unmap().WithZone(""), pc.Remote.Port())
		for _, q := range up.paths {
			if q.remote == remote {
				return nil, fmt.Errorf("mpt: paths %d and %d are the same (%s on %s)", q.id+1, i+1, remote, up.name)
			}
		}
		local := pc.Local.Unmap().WithZone("")
		if !local.IsValid() {
			if lc, ok := up.conn.(interface{ LocalAddr() net.Addr }); ok {
				if ua, ok := lc.LocalAddr().(*net.UDPAddr); ok {
					local = ua.AddrPort().Addr().Unmap().WithZone("")
				}
			}
		}
		p := &mptPath{id: i, up: up, remote: remote, weight: w, local: local, iface: pc.Interface}
		p.alive.Store(true) // as MPT's status=OK: up until proven dead
		p.lastRx.Store(now)
		up.paths = append(up.paths, p)
		t.paths = append(t.paths, p)
		t.snap = append(t.snap, sched.Path{ID: i, Weight: float64(w)})
	}
	for _, r := range o.Routes {
		if !r.IsValid() {
			return nil, fmt.Errorf("mpt: invalid route %v", r)
		}
		t.routes = append(t.routes, r.Masked())
	}
	if len(t.routes) == 0 {
		t.log.Warn("mpt: no routes: every packet read from the device is dropped")
	}
	if o.Keepalive > 0 {
		t.every, t.dead = int64(o.Keepalive), int64(o.DeadTime)
	}
	if t.reorder {
		cfg := reorder.Config{
			MaxPackets: o.ReorderWindow,
			MaxBytes:   o.ReorderWindow * max(o.MTU, 1500),
			MinHold:    o.MaxBuffDelay, MaxHold: o.MaxBuffDelay, Hold: o.MaxBuffDelay,
		}
		rb, err := reorder.New[*mptHeld](cfg)
		if err != nil {
			return nil, fmt.Errorf("mpt: %w", err)
		}
		t.rx.rb = rb
	}
	if o.Command != nil {
		if _, ok := mpt.AuthLen(o.AuthType); !ok {
			return nil, fmt.Errorf("mpt: auth_type %d, want 0, 1 or 2", o.AuthType)
		}
		if o.AuthType == mpt.AuthSHA256 && len(o.AuthKey) == 0 {
			return nil, errors.New("mpt: auth_type 2 needs a key")
		}
		for _, p := range t.paths {
			if !p.local.IsValid() || p.local.IsUnspecified() {
				return nil, fmt.Errorf("mpt: path %d: no local address to name it to the peer", p.id+1)
			}
		}
		port := o.RemoteCmdPort
		if port == 0 {
			port = 65050
		}
		t.cmd = &mptCmd{conn: o.Command, port: port, authType: o.AuthType, key: o.AuthKey,
			replies: make(chan mptReply, 16), wake: make(chan struct{}, 1)}
	}
	ka := mpt.Keepalive{IPVer: uint8(o.IPVersion), Local: o.LocalTunnelIP, Remote: o.RemoteTunnelIP}
	b := make([]byte, mpt.HeaderLen, mpt.HeaderLen+mpt.KeepaliveLen)
	mpt.EncodeData(b, o.IPVersion, 0, false)
	t.kaPacket = ka.Append(b)
	return t, nil
}

// now is the connection's monotonic clock in nanoseconds.
func (t *MPTTunnel) now() int64 { return int64(time.Since(t.start)) + 1 }

// Run moves packets until ctx ends, the device fails or every uplink's socket has failed, then
// closes the device and the sockets and waits for its goroutines. A single uplink whose socket
// fails takes its paths down for good; the others carry on.
func (t *MPTTunnel) Run(ctx context.Context) error {
	if !t.started.CompareAndSwap(false, true) {
		return errors.New("mpt: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	now := t.now()
	for _, p := range t.paths {
		p.lastRx.Store(now) // the dead time runs from the start
	}
	errc := make(chan error, 1+len(t.uplinks))
	t.wg.Go(func() { errc <- t.readDevice() })
	var failed atomic.Int32
	for _, u := range t.uplinks {
		t.wg.Go(func() {
			err := t.readUplink(u)
			if err == nil {
				return
			}
			u.failed.Store(true)
			t.log.Error("mpt uplink failed; its paths are down", "uplink", u.name, "err", err)
			if int(failed.Add(1)) == len(t.uplinks) {
				errc <- fmt.Errorf("mpt: every uplink failed, last %s: %w", u.name, err)
			}
		})
	}
	t.wg.Go(func() { t.timers(ctx) })
	if t.cmd != nil {
		t.wg.Go(t.readCmd)
		t.wg.Go(func() { t.announcer(ctx.Done()) })
	}
	t.log.Info("mpt connection up", "paths", len(t.paths), "uplinks", len(t.uplinks), "mtu", t.o.MTU,
		"ip_ver", t.o.IPVersion, "reorder_window", t.o.ReorderWindow, "keepalive", t.o.Keepalive)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	t.closing.Store(true)
	cancel()
	t.o.Device.Close()
	for _, u := range t.uplinks {
		u.conn.Close()
	}
	if t.cmd != nil {
		t.cmd.conn.Close()
	}
	t.wg.Wait()
	if t.reorder {
		// Whatever is still held goes to the bin: the device is closed.
		t.rx.mu.Lock()
		t.rx.queue = t.rx.rb.Flush(t.rx.queue[:0])
		clear(t.rx.queue)
		t.rx.queue = t.rx.queue[:0]
		t.rx.mu.Unlock()
	}
	t.log.Info("mpt connection down")
	return err
}

// readDevice reads inner packets from the device and sends each on a path.
func (t *MPTTunnel) readDevice() error {
	b := make([]byte, mptHeadroom+t.o.MTU)
	for {
		n, err := t.o.Device.Read(b[mptHeadroom:])
		if err != nil {
			if t.closing.Load() {
				return nil
			}
			return fmt.Errorf("mpt: device: %w", err)
		}
		t.sendData(b, n)
	}
}

// sendData sends the inner packet at b[mptHeadroom:mptHeadroom+n], writing the GRE header in
// the headroom in front of it.
func (t *MPTTunnel) sendData(b []byte, n int) {
	dst, ok := innerDst(b[mptHeadroom : mptHeadroom+n])
	if !ok {
		t.stats.DropBadInner.Add(1)
		return
	}
	if !t.routed(dst) {
		t.stats.DropNoRoute.Add(1)
		return
	}
	for i, p := range t.paths {
		t.snap[i].Up = p.usable()
	}
	i, ok := t.sch.Pick(t.now(), t.snap, n)
	if !ok {
		t.stats.DropNoPath.Add(1)
		return
	}
	p := t.paths[i]
	off := mpt.SeqHeaderLen - mpt.HeaderLen
	if t.reorder {
		off = 0
	}
	mpt.EncodeData(b[off:mptHeadroom], t.o.IPVersion, t.txSeq+1, t.reorder)
	if t.send(p, b[off:mptHeadroom+n]) {
		t.txSeq++ // a datagram the socket refused leaves no gap in the sequence
	}
}

func (t *MPTTunnel) routed(dst netip.Addr) bool {
	for _, r := range t.routes {
		if r.Contains(dst) {
			return true
		}
	}
	return false
}

// send writes one datagram on a path and counts it.
func (t *MPTTunnel) send(p *mptPath, pkt []byte) bool {
	if err := p.up.conn.Send(pkt, p.remote); err != nil {
		p.txDrops.Add(1)
		t.stats.DropSend.Add(1)
		return false
	}
	p.txPackets.Add(1)
	p.txBytes.Add(uint64(len(pkt)))
	t.stats.TxPackets.Add(1)
	t.stats.TxBytes.Add(uint64(len(pkt)))
	return true
}

// readUplink receives the datagrams of one uplink. It returns nil when the connection closes,
// and the socket's error otherwise.
func (t *MPTTunnel) readUplink(u *mptUplink) error {
	b := make([]byte, 65536)
	for {
		n, src, err := u.conn.ReadFromUDPAddrPort(b)
		if err != nil {
			if t.closing.Load() {
				return nil
			}
			return err
		}
		t.receive(u, src, b[:n])
	}
}

// pathFrom returns the path of u whose remote address is src.
func (u *mptUplink) pathFrom(src netip.AddrPort) *mptPath {
	a := src.Addr().Unmap().WithZone("")
	for _, p := range u.paths {
		if p.remote.Addr() == a && p.remote.Port() == src.Port() {
			return p
		}
	}
	return nil
}

// receive handles one datagram.
func (t *MPTTunnel) receive(u *mptUplink, src netip.AddrPort, b []byte) {
	t.stats.RxPackets.Add(1)
	t.stats.RxBytes.Add(uint64(len(b)))
	p := u.pathFrom(src)
	if p == nil {
		t.stats.DropNotFromPath.Add(1)
		return
	}
	payload, seq, hasSeq, err := mpt.DecodeData(b)
	if errors.Is(err, mpt.ErrTruncated) {
		t.stats.DropBadGRE.Add(1)
		return
	}
	now := t.now()
	if err != nil { // ErrCommand
		if payload[0] != mpt.CmdKeepalive {
			t.stats.DropCommand.Add(1)
			return
		}
		var ka mpt.Keepalive
		if _, err := ka.Decode(payload); err != nil {
			t.stats.DropBadGRE.Add(1)
			return
		}
		if !t.keepaliveOurs(ka) {
			if t.stats.DropKeepaliveMismatch.Add(1) == 1 {
				t.log.Warn("mpt keepalive refused: it names other tunnel addresses than this side's local_tunnel_ip/remote_tunnel_ip (a misconfigured peer, or a forger); such keepalives keep no path up",
					"path", p.id+1, "from", src, "its_local", ka.Local, "its_remote", ka.Remote, "want_local", t.o.RemoteTunnelIP, "want_remote", t.o.LocalTunnelIP)
			}
			return
		}
		t.heard(p, now, len(b))
		p.kaRecv.Add(1)
		t.stats.KeepalivesReceived.Add(1)
		return
	}
	if _, err := mpath.InnerVersion(payload); err != nil {
		t.stats.DropBadInner.Add(1)
		return
	}
	if src, ok := innerSrc(payload); !ok || !t.mayComeFrom(src) {
		t.stats.DropSpoofed.Add(1)
		return
	}
	t.heard(p, now, len(b))
	if !t.reorder || !hasSeq {
		t.write(payload)
		return
	}
	h := mptHeldPool.Get().(*mptHeld)
	h.b = append(h.b[:0], payload...)
	t.rx.mu.Lock()
	t.rx.queue = t.rx.rb.Push(now, seq, len(payload), h, t.rx.queue)
	t.drainLocked()
}

// keepaliveOurs reports whether a keepalive names this connection's tunnel addresses as the
// peer sends them (its local is our remote, its remote our local); an address not configured
// on this side is not checked.
func (t *MPTTunnel) keepaliveOurs(ka mpt.Keepalive) bool {
	if a := t.o.RemoteTunnelIP; a.IsValid() && ka.Local.Unmap() != a.Unmap() {
		return false
	}
	if a := t.o.LocalTunnelIP; a.IsValid() && ka.Remote.Unmap() != a.Unmap() {
		return false
	}
	return true
}

// mayComeFrom reports whether an inner packet from src may come from the peer: src is inside
// its routes, or is its tunnel address.
func (t *MPTTunnel) mayComeFrom(src netip.Addr) bool {
	return t.routed(src) || (t.o.RemoteTunnelIP.IsValid() && src == t.o.RemoteTunnelIP.Unmap())
}

// heard records a datagram accepted from p, and brings p back up if it was down.
func (t *MPTTunnel) heard(p *mptPath, now int64, n int) {
	p.lastRx.Store(now)
	p.rxPackets.Add(1)
	p.rxBytes.Add(uint64(n))
	if !p.alive.Load() && p.alive.CompareAndSwap(false, true) {
		t.log.Info("mpt path state", "path", p.id+1, "uplink", p.up.name, "remote", p.remote, "from", "down", "to", "up")
	}
}

// drainLocked writes the queued packets to the device, unless another goroutine is doing so
// already (it will write them, in order). It is called with t.rx.mu held and releases it; the
// lock is never held across a device write.
func (t *MPTTunnel) drainLocked() {
	if t.rx.draining {
		t.rx.mu.Unlock()
		return
	}
	t.rx.draining = true
	for len(t.rx.queue) > 0 {
		batch := t.rx.queue
		t.rx.queue = t.rx.spare[:0]
		t.rx.mu.Unlock()
		for i, h := range batch {
			t.write(h.b)
			mptHeldPool.Put(h)
			batch[i] = nil
		}
		t.rx.mu.Lock()
		t.rx.spare = batch[:0]
	}
	t.rx.draining = false
	t.rx.mu.Unlock()
}

func (t *MPTTunnel) write(pkt []byte) {
	if _, err := t.o.Device.Write(pkt); err != nil {
		t.stats.DropDevice.Add(1)
		return
	}
	t.stats.Delivered.Add(1)
}

// timers sends the keepalives, takes silent paths down and releases what waited MaxBuffDelay
// in the reorder buffer.
func (t *MPTTunnel) timers(ctx context.Context) {
	tick := time.NewTicker(mptTick)
	defer tick.Stop()
	for {
		now := t.now()
		for _, p := range t.paths {
			t.checkIface(p, now)
			if r := p.retryAt.Load(); r != 0 && now >= r && p.retryAt.CompareAndSwap(r, 0) {
				t.announce(p)
			}
			if t.every > 0 {
				t.keepalive(p, now)
			}
		}
		if t.reorder {
			t.rx.mu.Lock()
			t.rx.queue = t.rx.rb.Expire(now, t.rx.queue)
			t.drainLocked()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// keepalive sends p's keepalive when it is due, and takes p down when it has been silent for
// the dead time.
func (t *MPTTunnel) keepalive(p *mptPath, now int64) {
	if p.up.failed.Load() {
		return
	}
	// MPT sends no keepalives on a path taken down by hand or whose interface is down.
	if !p.ifDown.Load() && !p.manual.Load() && now >= p.nextKA {
		// MPT sends keepalives on paths that are down too: that is how they come back.
		if t.send(p, t.kaPacket) {
			p.kaSent.Add(1)
			t.stats.KeepalivesSent.Add(1)
		}
		p.nextKA += t.every
		if p.nextKA <= now {
			p.nextKA = now + t.every
		}
	}
	if now-p.lastRx.Load() > t.dead && p.alive.CompareAndSwap(true, false) {
		if now-p.lastRx.Load() <= t.dead {
			// A datagram came in between the check and the swap: the path lives.
			p.alive.Store(true)
			return
		}
		t.log.Info("mpt path state", "path", p.id+1, "uplink", p.up.name, "remote", p.remote, "from", "up", "to", "down",
			"silent", time.Duration(now-p.lastRx.Load()))
	}
}

// Status returns a snapshot.
func (t *MPTTunnel) Status() MPTStatus {
	now := t.now()
	st := MPTStatus{Uptime: time.Since(t.start), IPVersion: t.o.IPVersion, Reorder: t.reorder, Counters: t.stats.snapshot()}
	if t.reorder {
		st.ReorderHold = t.o.MaxBuffDelay
		t.rx.mu.Lock()
		st.ReorderHeld = t.rx.rb.Stats().Packets
		t.rx.mu.Unlock()
	}
	for _, p := range t.paths {
		state := "down"
		if p.usable() {
			state = "up"
		}
		st.Paths = append(st.Paths, MPTPathStatus{
			ID: p.id + 1, Uplink: p.up.name, Remote: p.remote.String(), Weight: p.weight,
			State: state, Status: p.status(), UplinkFailed: p.up.failed.Load(), SinceReceive: time.Duration(now - p.lastRx.Load()),
			TxPackets: p.txPackets.Load(), TxBytes: p.txBytes.Load(), TxDrops: p.txDrops.Load(),
			RxPackets: p.rxPackets.Load(), RxBytes: p.rxBytes.Load(),
			KeepalivesSent: p.kaSent.Load(), KeepalivesReceived: p.kaRecv.Load(),
		})
	}
	return st
}
