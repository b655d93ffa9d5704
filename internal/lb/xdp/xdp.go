// Package xdp is braid lb's data plane: the XDP program (lb.c, compiled by bpf2go into the
// committed lb_bpfel.o), and a thin loader that fills its maps and reads its counters back.
// It is the only package that touches eBPF; the control plane (internal/lb) hands it plain
// values and never imports ebpf itself.
//
// What the program does with a packet is described at the top of lb.c; the maps are:
//
//	config         one lb_config, a global variable (the .data.config section's one-element
//	               map, written through its mapping): mode, flags, hash seed, learning
//	               limits, encapsulation source, the flow cache's epoch (bumped when flows
//	               are removed, a stateless entry is added, a backend is set or removed, or
//	               the configuration changes)
//	services       (VIP, port, family) -> service id; the Maglev table row and the token scope
//	stateless      (VIP, port, family) -> backend, with no per-connection state
//	maglev         MaxServices x TableSize backend indexes
//	backends       MaxBackends entries: MAC, egress interface, encapsulation address
//	conns          LRU: 5-tuple -> backend, token, flags (flows past their SYN)
//	embryonic      LRU: the same for flows seen only by their SYN, and flows placed mid-flow
//	tokens         hash: (service, token) -> backend, version, created, last active (joined)
//	pending        LRU: the same for tokens learned and not yet joined
//	vips           the services' addresses: fragments and extension headers to them are dropped
//	flow_cache     per-CPU direct-mapped copies of connection table entries of flows that
//	               need nothing but forwarding, valid in one epoch and for at most a second
//	svc_filter     bitmap of the services' (address, port, family): other traffic is passed
//	               without a hash lookup
//	learn_limit    LRU: token buckets per client /24 or /64 (learning, promotion)
//	global_limit   per-CPU token bucket of promotions
//	counters       per-CPU counters: one element holding them all, indexed by Counter, and
//	               each backend's packets and bytes
//	backend_stats  per-CPU per-backend new connections, joins
package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Limits compiled into the program.
const (
	MaxBackends = 256
	MaxServices = 4
	TableSize   = 65521 // entries of one service's Maglev table (prime)
	NoBackend   = 0xffffffff
)

// Counter is an index of the program's counters.
type Counter int

// The counters, in the order of lb.c's enum.
const (
	CounterRX               Counter = iota // packets seen
	CounterPassNotVIP                      // TCP not addressed to a service: passed to the stack
	CounterPassOther                       // not TCP over IPv4/IPv6, fragments, extension headers: passed
	CounterForwarded                       // sent to a backend
	CounterNewConn                         // first-subflow SYNs placed by Maglev
	CounterNewMidflow                      // packets of flows the table did not hold, placed by Maglev
	CounterJoinSteered                     // MP_JOIN SYNs sent to their token's backend
	CounterDropJoinUnknown                 // MP_JOIN SYNs with a token nobody owns: dropped
	CounterDropJoinCollided                // MP_JOIN SYNs with a token two backends claim (policy drop)
	CounterTokenLearned                    // tokens learned
	CounterTokenRepeat                     // the same token again for the same backend (idempotent)
	CounterTokenCollision                  // a token already owned by another backend: not overwritten
	CounterTokenFull                       // the token table was full
	CounterLearnNoFlow                     // MP_CAPABLE keys on flows whose MP_CAPABLE SYN was not seen
	CounterLearnLimited                    // learnings refused by the rate limits
	CounterTokenFastclose                  // tokens removed by the client's MP_FASTCLOSE
	CounterTokenClosing                    // tokens marked closing by the client's DATA_FIN
	CounterMPCBad                          // MP_CAPABLE with a length, version or flags no RFC defines
	CounterOptMalformed                    // option lists whose lengths lie (handled as plain TCP)
	CounterDropMalformed                   // truncated TCP headers to a service: dropped
	CounterDropNoBackend                   // no backend to send to: dropped
	CounterDropEncap                       // no headroom for the encapsulation: dropped
	CounterStateless                       // forwarded by the stateless table
	CounterDropFragment                    // IPv4 fragments addressed to a VIP: dropped
	CounterDropExtHeader                   // IPv6 packets to a VIP with extension headers: dropped
	CounterTokenPromoted                   // tokens moved to the joined table by their first join
	CounterPromoteLimited                  // promotions refused by the rate limits (the join is steered)
	CounterPromoteFull                     // promotions refused by a full joined table (the join is steered)
	CounterTokenExpired                    // joins whose pending token was older than UnjoinedAfter: dropped
	CounterConnEstablished                 // flows moved from the embryonic to the connection table
	NumCounters
)

var counterNames = [NumCounters]string{
	"rx", "pass_not_vip", "pass_other", "forwarded", "new_conn", "new_midflow", "join_steered",
	"drop_join_unknown_token", "drop_join_collided", "token_learned", "token_repeat",
	"token_collision", "token_full", "learn_no_flow", "learn_limited", "token_fastclose",
	"token_closing", "mpc_bad", "opt_malformed", "drop_malformed", "drop_no_backend",
	"drop_encap", "stateless_forwarded", "drop_fragment", "drop_ext_header", "token_promoted",
	"promote_limited", "promote_full", "token_expired", "conn_established",
}

func (c Counter) String() string {
	if c >= 0 && c < NumCounters {
		return counterNames[c]
	}
	return fmt.Sprintf("counter%d", int(c))
}

// Counters are the program's counters summed over the CPUs.
type Counters [NumCounters]uint64

// The program's counters element holds exactly the counters named here.
var (
	_ [len(lbCountersVal{}.C) - int(NumCounters)]struct{}
	_ [int(NumCounters) - len(lbCountersVal{}.C)]struct{}
)

// Mode is how packets reach a backend.
type Mode uint32

const (
	// ModeMAC rewrites the destination MAC: the backend is on the balancer's segment and
	// holds the VIP itself.
	ModeMAC Mode = 0
	// ModeIPIP encapsulates in IPv4 or IPv6 (protocol 4 or 41) toward the backend's address;
	// the backend decapsulates and holds the VIP.
	ModeIPIP Mode = 1
)

// Config is the program's configuration.
type Config struct {
	Aware       bool // learn tokens and steer joins (false: an MPTCP-unaware balancer)
	HashAddrs   bool // hash addresses only, not ports
	CollideDrop bool // a token two backends claim steers no join
	Mode        Mode
	HashSeed    uint32
	LearnRate   uint32 // learnings per second per client /24 or /64, and promotions apart; 0: unlimited
	LearnBurst  uint32
	GlobalRate  uint32 // promotions to the joined table per second, all CPUs together; 0: unlimited
	GlobalBurst uint32
	// UnjoinedAfter: a pending token (learned, never joined) older than this steers no join;
	// 0: no limit.
	UnjoinedAfter time.Duration
	Src4          netip.Addr       // outer source of IPv4 encapsulation
	Src6          netip.Addr       // outer source of IPv6 encapsulation
	SrcMAC        net.HardwareAddr // source MAC of forwarded frames
}

// Backend is where the program sends a backend's packets.
type Backend struct {
	MAC     net.HardwareAddr // destination MAC (the backend, or the next hop toward it)
	IfIndex int              // egress interface; 0 sends back out of the receiving one
	Addr    netip.Addr       // encapsulation destination (ModeIPIP)
}

// BackendStats are one backend's counters summed over the CPUs.
type BackendStats struct {
	Packets, Bytes, Conns, Joins uint64
}

// Token is one entry of the token table.
type Token struct {
	Service  uint32
	Token    uint32
	Backend  uint32
	V0       bool // learned from MPTCP v0 (SHA-1)
	Closing  bool // the client sent DATA_FIN
	Collided bool // another backend claimed it
	Joined   bool // a join used it: it is in the joined table (else pending)
	Created  uint64
	Active   uint64 // CLOCK_MONOTONIC (coarse) nanoseconds of the last activity
}

const (
	flagAware       = 1 << 0
	flagHashAddrs   = 1 << 1
	flagCollideDrop = 1 << 2
	flagStateless   = 1 << 3

	beFlagPresent = 1 << 0
	beFlagOuter6  = 1 << 1

	tokV0       = 1 << 0
	tokClosing  = 1 << 1
	tokCollided = 1 << 2
	tokJoined   = 1 << 3
)

// Errors.
var (
	ErrRange  = errors.New("xdp: index out of range")
	ErrFamily = errors.New("xdp: address family")
)

// Options size the tables; zero values keep the compiled sizes.
type Options struct {
	Conns     uint32 // connection table entries (default 1 Mi)
	Embryonic uint32 // embryonic flow table entries (default 1 Mi)
	Tokens    uint32 // joined token table entries (default 256 Ki)
	Pending   uint32 // pending token table entries (default 256 Ki)
}

// Dataplane is a loaded program and its maps.
type Dataplane struct {
	objs lbObjects

	mu        sync.Mutex // guards the fields below
	links     []link.Link
	cfg       lbLbConfig       // as last written, without flagStateless
	stateless int              // entries of the stateless table
	vips      map[lbSvcKey]int // references to each VIP address (services, stateless entries)
	once      sync.Once
	epoch     atomic.Uint32 // the flow cache's epoch, as last written (in the config element)
}

// Load loads the program and creates its maps (it needs CAP_BPF and CAP_NET_ADMIN).
func Load(o Options) (*Dataplane, error) {
	spec, err := loadLb()
	if err != nil {
		return nil, fmt.Errorf("xdp: %w", err)
	}
	if o.Conns > 0 {
		spec.Maps[lbMapConns].MaxEntries = o.Conns
	}
	if o.Tokens > 0 {
		spec.Maps[lbMapTokens].MaxEntries = o.Tokens
	}
	if o.Embryonic > 0 {
		spec.Maps[lbMapEmbryonic].MaxEntries = o.Embryonic
	}
	if o.Pending > 0 {
		spec.Maps[lbMapPending].MaxEntries = o.Pending
	}
	d := &Dataplane{vips: map[lbSvcKey]int{}}
	if err := spec.LoadAndAssign(&d.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("xdp: verifier: %+v", ve)
		}
		return nil, fmt.Errorf("xdp: load: %w", err)
	}
	empty := make([]uint32, TableSize)
	for i := range empty {
		empty[i] = NoBackend
	}
	for s := uint32(0); s < MaxServices; s++ {
		if err := d.SetTable(s, empty); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

// AttachMode selects how the program is attached.
type AttachMode int

const (
	AttachAuto    AttachMode = iota // native if the driver supports it, else generic
	AttachNative                    // in the driver
	AttachGeneric                   // after the driver, on the skb (any interface)
)

// Attach attaches the program to an interface; Close detaches it.
func (d *Dataplane) Attach(ifindex int, mode AttachMode) error {
	return d.attach(d.objs.BraidLb, ifindex, mode)
}

// AttachSink attaches the sink program (count and drop) to an interface: on the far end of a
// veth pair it lets frames sent there by XDP_TX or a redirect arrive (benchmarks and labs).
func (d *Dataplane) AttachSink(ifindex int, mode AttachMode) error {
	return d.attach(d.objs.BraidSink, ifindex, mode)
}

// AttachDecap attaches the decapsulation program to an interface: it strips the outer header
// of IP-in-IP packets, for backends of the ipip mode without a tunnel device.
func (d *Dataplane) AttachDecap(ifindex int, mode AttachMode) error {
	return d.attach(d.objs.BraidDecap, ifindex, mode)
}

// Decap returns the decapsulation program.
func (d *Dataplane) Decap() *ebpf.Program { return d.objs.BraidDecap }

func (d *Dataplane) attach(prog *ebpf.Program, ifindex int, mode AttachMode) error {
	try := func(f link.XDPAttachFlags) error {
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: f})
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.links = append(d.links, l)
		d.mu.Unlock()
		return nil
	}
	var err error
	switch mode {
	case AttachNative:
		err = try(link.XDPDriverMode)
	case AttachGeneric:
		err = try(link.XDPGenericMode)
	default:
		if err = try(link.XDPDriverMode); err != nil {
			err = try(link.XDPGenericMode)
		}
	}
	if err != nil {
		return fmt.Errorf("xdp: attach to interface %d: %w", ifindex, err)
	}
	return nil
}

// Close detaches the program from every interface and frees the maps; idempotent.
func (d *Dataplane) Close() error {
	var err error
	d.once.Do(func() {
		d.mu.Lock()
		for _, l := range d.links {
			err = errors.Join(err, l.Close())
		}
		d.links = nil
		d.mu.Unlock()
		err = errors.Join(err, d.objs.Close())
	})
	return err
}

// Program returns the XDP program (for BPF_PROG_RUN in tests and benchmarks).
func (d *Dataplane) Program() *ebpf.Program { return d.objs.BraidLb }

// Baseline returns the baseline program: plain XDP_TX forwarding with the MACs swapped.
func (d *Dataplane) Baseline() *ebpf.Program { return d.objs.BraidBaseline }

// SinkCount returns how many frames the sink program has dropped.
func (d *Dataplane) SinkCount() (uint64, error) { return sum(d.objs.SinkCount) }

// DecapCount returns how many packets the decapsulation program has stripped.
func (d *Dataplane) DecapCount() (uint64, error) { return sum(d.objs.DecapCount) }

func sum(m *ebpf.Map) (uint64, error) {
	var per []uint64
	if err := m.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("xdp: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

// Time runs prog repeat times on pkt through BPF_PROG_RUN and returns the kernel's mean time
// per run and the last action.
func Time(prog *ebpf.Program, pkt []byte, repeat int) (time.Duration, uint32, error) {
	ret, per, err := prog.Benchmark(pkt, repeat, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("xdp: run: %w", err)
	}
	return per, ret, nil
}

// xdpMD is struct xdp_md, the context of a live-frames run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// bpfTestXDPLiveFrames is BPF_F_TEST_XDP_LIVE_FRAMES: the frames the program forwards leave
// through the interface for real.
const bpfTestXDPLiveFrames = 1 << 1

// RunLive runs prog on repeat copies of pkt as if they had arrived on interface ifindex, in
// live-frames mode: what the program sends with XDP_TX or a redirect is really transmitted.
// It returns the wall time of the whole run. The calling thread must be in the interface's
// network namespace.
func RunLive(prog *ebpf.Program, pkt []byte, ifindex, repeat int) (time.Duration, error) {
	opts := ebpf.RunOptions{Data: pkt, Repeat: uint32(repeat), Flags: bpfTestXDPLiveFrames,
		Context: xdpMD{DataEnd: uint32(len(pkt)), IngressIfindex: uint32(ifindex)}}
	start := time.Now()
	if _, err := prog.Run(&opts); err != nil {
		return 0, fmt.Errorf("xdp: live run: %w", err)
	}
	return time.Since(start), nil
}

// SetConfig replaces the program's configuration.
func (d *Dataplane) SetConfig(c Config) error {
	var v lbLbConfig
	if c.Aware {
		v.Flags |= flagAware
	}
	if c.HashAddrs {
		v.Flags |= flagHashAddrs
	}
	if c.CollideDrop {
		v.Flags |= flagCollideDrop
	}
	if c.LearnRate > 1e6 || c.GlobalRate > 1e6 {
		return fmt.Errorf("%w: learning rates above 1e6/s", ErrRange)
	}
	v.Mode = uint32(c.Mode)
	v.HashSeed = c.HashSeed
	v.LearnRate, v.LearnBurst = c.LearnRate, c.LearnBurst
	// The global bucket is per CPU: each CPU gets its share of the total.
	v.GlobalRate, v.GlobalBurst = perCPU(c.GlobalRate), perCPU(c.GlobalBurst)
	if c.UnjoinedAfter > 0 {
		v.UnjoinedNs = uint64(c.UnjoinedAfter)
	}
	if c.Src4.IsValid() {
		if !c.Src4.Is4() {
			return fmt.Errorf("%w: Src4 %s", ErrFamily, c.Src4)
		}
		a := c.Src4.As4()
		v.Src4 = binary.NativeEndian.Uint32(a[:])
	}
	if c.Src6.IsValid() {
		v.Src6 = c.Src6.As16()
	}
	copy(v.SrcMac[:], c.SrcMAC)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfg = v
	return d.writeConfigLocked()
}

// cpus is the number of CPUs the program may run on.
var cpus = sync.OnceValue(func() int {
	n, err := ebpf.PossibleCPU()
	if err != nil || n < 1 {
		return 1
	}
	return n
})

// perCPU is one CPU's share of a total rate or burst: at least 1 unless the total is 0.
func perCPU(total uint32) uint32 {
	if total == 0 {
		return 0
	}
	n := uint32(cpus())
	return max(1, (total+n-1)/n)
}

// writeConfigLocked writes the configuration, with the flag that makes the program look at
// the stateless table only when it has entries, and the flow cache's next epoch: every write
// invalidates every CPU's flow cache (the epoch lives in the configuration, so that a packet
// reads one value for both). The configuration is the program's global variable, written in
// place through the data section's mapping, as a map update wrote the element before (neither
// is atomic against a packet reading it).
func (d *Dataplane) writeConfigLocked() error {
	v := d.cfg
	if d.stateless > 0 {
		v.Flags |= flagStateless
	}
	v.Epoch = d.epoch.Add(1)
	if err := d.objs.Config.Set(&v); err != nil {
		return fmt.Errorf("xdp: config: %w", err)
	}
	return nil
}

func svcKey(vip netip.AddrPort) lbSvcKey {
	var k lbSvcKey
	a := vip.Addr().Unmap()
	if a.Is4() {
		b := a.As4()
		copy(k.Addr[:], b[:])
		k.Family = 4
	} else {
		k.Addr = a.As16()
		k.Family = 6
	}
	var p [2]byte
	binary.BigEndian.PutUint16(p[:], vip.Port())
	k.Port = binary.NativeEndian.Uint16(p[:])
	return k
}

// SetService makes vip a service with the given id (< MaxServices).
func (d *Dataplane) SetService(id uint32, vip netip.AddrPort) error {
	if id >= MaxServices {
		return fmt.Errorf("%w: service %d", ErrRange, id)
	}
	k := svcKey(vip)
	d.mu.Lock()
	defer d.mu.Unlock()
	var old lbSvc
	fresh := d.objs.Services.Lookup(&k, &old) != nil
	if err := d.objs.Services.Put(&k, &lbSvc{Id: id}); err != nil {
		return err
	}
	if err := d.writeFilterLocked(); err != nil {
		return err
	}
	if fresh {
		return d.refVIPLocked(vip, 1)
	}
	return nil
}

// DeleteService stops balancing vip, and removes its flows: the program finds a packet of a
// known flow by its 5-tuple alone (without reading the service table), so a deleted service's
// flows must go with it.
func (d *Dataplane) DeleteService(vip netip.AddrPort) error {
	k := svcKey(vip)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.objs.Services.Delete(&k); err != nil {
		return err
	}
	if err := d.writeFilterLocked(); err != nil {
		return err
	}
	if err := d.refVIPLocked(vip, -1); err != nil {
		return err
	}
	return d.dropFlowsLocked(func(f *lbFlow, _ *lbConn) bool {
		return f.Family == k.Family && f.Dst == k.Addr && f.Dport == k.Port
	})
}

// svcBit is lb.c's svc_bit: the bit of a service's (address, port, family) in the svc_filter
// bitmap, from the key's bytes as the program reads them (little-endian words).
func svcBit(k lbSvcKey) uint32 {
	le := binary.LittleEndian
	x := le.Uint32(k.Addr[0:]) ^ le.Uint32(k.Addr[4:]) ^ le.Uint32(k.Addr[8:]) ^ le.Uint32(k.Addr[12:])
	x ^= uint32(k.Port) ^ uint32(k.Family)<<16
	return (x * 0x9e3779b1) >> 20
}

// filterWords is the number of 64-bit words of svc_filter (4096 bits).
const filterWords = 64

// writeFilterLocked rewrites the svc_filter bitmap from the service table, so that a packet
// whose bit is clear is passed without a lookup, and every service's bit is set.
func (d *Dataplane) writeFilterLocked() error {
	var words [filterWords]uint64
	var k lbSvcKey
	var v lbSvc
	it := d.objs.Services.Iterate()
	for it.Next(&k, &v) {
		b := svcBit(k)
		words[b/64] |= 1 << (b % 64)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("xdp: services: %w", err)
	}
	for i, w := range words {
		if err := d.objs.SvcFilter.Put(uint32(i), w); err != nil {
			return fmt.Errorf("xdp: service filter: %w", err)
		}
	}
	return nil
}

// refVIPLocked counts a use of vip's address more (delta 1) or less (-1), and keeps the
// vips map, the addresses whose fragments and extension headers are dropped, in step.
func (d *Dataplane) refVIPLocked(vip netip.AddrPort, delta int) error {
	k := svcKey(netip.AddrPortFrom(vip.Addr(), 0))
	d.vips[k] += delta
	switch n := d.vips[k]; {
	case n > 0 && delta > 0 && n == 1:
		return d.objs.Vips.Put(&k, uint32(1))
	case n <= 0:
		delete(d.vips, k)
		if err := d.objs.Vips.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// SetTable replaces service id's Maglev table (TableSize backend indexes, NoBackend for none).
func (d *Dataplane) SetTable(id uint32, table []uint32) error {
	if id >= MaxServices || len(table) != TableSize {
		return fmt.Errorf("%w: service %d, table of %d", ErrRange, id, len(table))
	}
	keys := make([]uint32, TableSize)
	for i := range keys {
		keys[i] = id*TableSize + uint32(i)
	}
	if _, err := d.objs.Maglev.BatchUpdate(keys, table, nil); err != nil {
		// Kernels without batch operations on arrays: one by one.
		for i, k := range keys {
			if err := d.objs.Maglev.Put(k, table[i]); err != nil {
				return fmt.Errorf("xdp: maglev table: %w", err)
			}
		}
	}
	return nil
}

// SetStateless sends every packet to vip to backend, with no state.
func (d *Dataplane) SetStateless(vip netip.AddrPort, backend uint32) error {
	if backend >= MaxBackends {
		return fmt.Errorf("%w: backend %d", ErrRange, backend)
	}
	k := svcKey(vip)
	d.mu.Lock()
	defer d.mu.Unlock()
	var old uint32
	fresh := d.objs.Stateless.Lookup(&k, &old) != nil
	if err := d.objs.Stateless.Put(&k, backend); err != nil {
		return err
	}
	if fresh {
		if err := d.refVIPLocked(vip, 1); err != nil {
			return err
		}
		d.stateless++
		if d.stateless == 1 {
			return d.writeConfigLocked()
		}
		// The program looks in its flow cache before the stateless table: a flow to vip
		// cached before now must take the stateless entry from its next packet.
		return d.writeConfigLocked()
	}
	return nil
}

// DeleteStateless removes a stateless entry.
func (d *Dataplane) DeleteStateless(vip netip.AddrPort) error {
	k := svcKey(vip)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.objs.Stateless.Delete(&k); err != nil {
		return err
	}
	if err := d.refVIPLocked(vip, -1); err != nil {
		return err
	}
	d.stateless--
	if d.stateless == 0 {
		return d.writeConfigLocked()
	}
	return nil
}

// SetBackend installs backend i.
func (d *Dataplane) SetBackend(i uint32, b Backend) error {
	if i >= MaxBackends {
		return fmt.Errorf("%w: backend %d", ErrRange, i)
	}
	v := lbBackend{Flags: beFlagPresent, Ifindex: uint32(b.IfIndex)}
	copy(v.Mac[:], b.MAC)
	if b.Addr.IsValid() {
		a := b.Addr.Unmap()
		if a.Is4() {
			x := a.As4()
			v.Addr4 = binary.NativeEndian.Uint32(x[:])
		} else {
			v.Addr6 = a.As16()
			v.Flags |= beFlagOuter6
		}
	}
	if err := d.objs.Backends.Put(i, &v); err != nil {
		return err
	}
	// the flow cache's slots carry their backend's MAC and interface
	return d.bumpEpoch()
}

// RemoveBackend marks backend i absent: flows pinned to it are placed again.
func (d *Dataplane) RemoveBackend(i uint32) error {
	if i >= MaxBackends {
		return fmt.Errorf("%w: backend %d", ErrRange, i)
	}
	if err := d.objs.Backends.Put(i, &lbBackend{}); err != nil {
		return err
	}
	// cached flows to it take the full path from their next packet, which places them again
	return d.bumpEpoch()
}

// Counters reads the program's counters (one per-CPU element holding them all).
func (d *Dataplane) Counters() (Counters, error) {
	var c Counters
	per, err := d.counters()
	if err != nil {
		return c, err
	}
	for _, v := range per {
		for i := range c {
			c[i] += v.C[i]
		}
		// the program counts a forwarded packet once, for its backend
		for i := range v.Be {
			c[CounterForwarded] += v.Be[i].Packets
		}
	}
	return c, nil
}

// counters reads every CPU's counters element.
func (d *Dataplane) counters() ([]lbCountersVal, error) {
	var per []lbCountersVal
	if err := d.objs.Counters.Lookup(uint32(0), &per); err != nil {
		return nil, fmt.Errorf("xdp: counters: %w", err)
	}
	return per, nil
}

// BackendStats reads backend i's counters.
func (d *Dataplane) BackendStats(i uint32) (BackendStats, error) {
	var s BackendStats
	if i >= MaxBackends {
		return s, fmt.Errorf("%w: backend %d", ErrRange, i)
	}
	var per []lbBeStats
	if err := d.objs.BackendStats.Lookup(i, &per); err != nil {
		return s, fmt.Errorf("xdp: backend stats: %w", err)
	}
	for _, v := range per {
		s.Conns += v.Conns
		s.Joins += v.Joins
	}
	// its packets and bytes are counted in the counters element, beside the others
	cs, err := d.counters()
	if err != nil {
		return s, err
	}
	for _, v := range cs {
		s.Packets += v.Be[i].Packets
		s.Bytes += v.Be[i].Bytes
	}
	return s, nil
}

// Tokens returns the joined token table (tokens a join has used).
func (d *Dataplane) Tokens() ([]Token, error) { return readTokens(d.objs.Tokens, nil) }

// PendingTokens returns the pending token table (tokens learned and never joined, expired
// ones included until the LRU reuses their slots).
func (d *Dataplane) PendingTokens() ([]Token, error) { return readTokens(d.objs.Pending, nil) }

// readTokens reads a token table in batches (one system call per 4096 entries: the tables
// hold up to hundreds of thousands under a flood, and the sweeper reads the joined one every
// second), or entry by entry where the kernel has no batch operations.
func readTokens(m *ebpf.Map, out []Token) ([]Token, error) {
	add := func(k lbTokenKey, v lbTokenVal) {
		out = append(out, Token{Service: k.Svc, Token: k.Token, Backend: v.Backend, V0: v.Flags&tokV0 != 0,
			Closing: v.Flags&tokClosing != 0, Collided: v.Flags&tokCollided != 0, Joined: v.Flags&tokJoined != 0,
			Created: v.Created, Active: v.Active})
	}
	keys := make([]lbTokenKey, 4096)
	vals := make([]lbTokenVal, 4096)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			add(keys[i], vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) && len(out) == 0 {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("xdp: tokens: %w", err)
		}
	}
	var k lbTokenKey
	var v lbTokenVal
	it := m.Iterate()
	for it.Next(&k, &v) {
		add(k, v)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("xdp: tokens: %w", err)
	}
	return out, nil
}

// DeleteToken removes one token from both tables; a token already gone is not an error.
func (d *Dataplane) DeleteToken(service, token uint32) error {
	k := lbTokenKey{Svc: service, Token: token}
	for _, m := range []*ebpf.Map{d.objs.Tokens, d.objs.Pending} {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("xdp: delete token: %w", err)
		}
	}
	return nil
}

// Flow is one entry of the connection tables.
type Flow struct {
	Src, Dst  netip.AddrPort
	Backend   uint32
	Embryonic bool // in the embryonic table (SYN seen, nothing after it yet; or placed mid-flow)
	Join      bool // placed by its MP_JOIN token
}

// Flows returns both connection tables.
func (d *Dataplane) Flows() ([]Flow, error) {
	var out []Flow
	err := d.eachFlow(func(k *lbFlow, v *lbConn, embryonic bool) {
		out = append(out, Flow{Src: flowAddr(k.Src, k.Family, k.Sport), Dst: flowAddr(k.Dst, k.Family, k.Dport),
			Backend: v.Backend, Embryonic: embryonic, Join: v.Flags&connJoin != 0})
	})
	return out, err
}

const connJoin = 1 << 4

func flowAddr(a [16]byte, family uint8, port uint16) netip.AddrPort {
	var p [2]byte
	binary.NativeEndian.PutUint16(p[:], port)
	pt := binary.BigEndian.Uint16(p[:])
	if family == 4 {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(a[:4])), pt)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(a), pt)
}

// eachFlow calls fn on every entry of the connection and embryonic tables, read in batches
// (a flood fills them with hundreds of thousands of entries, and status reads them), or entry
// by entry where the kernel has no batch operations.
func (d *Dataplane) eachFlow(fn func(k *lbFlow, v *lbConn, embryonic bool)) error {
	keys := make([]lbFlow, 4096)
	vals := make([]lbConn, 4096)
	for _, m := range []*ebpf.Map{d.objs.Conns, d.objs.Embryonic} {
		emb := m == d.objs.Embryonic
		var cursor ebpf.MapBatchCursor
		batched := true
		for seen := 0; ; {
			n, err := m.BatchLookup(&cursor, keys, vals, nil)
			for i := 0; i < n; i++ {
				fn(&keys[i], &vals[i], emb)
			}
			seen += n
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			if errors.Is(err, ebpf.ErrNotSupported) && seen == 0 {
				batched = false
				break
			}
			if err != nil {
				return fmt.Errorf("xdp: flows: %w", err)
			}
		}
		if batched {
			continue
		}
		var k lbFlow
		var v lbConn
		it := m.Iterate()
		for it.Next(&k, &v) {
			fn(&k, &v, emb)
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("xdp: flows: %w", err)
		}
	}
	return nil
}

// ConnsPerBackend counts the flows of both connection tables per backend.
func (d *Dataplane) ConnsPerBackend() (map[uint32]int, error) {
	out := map[uint32]int{}
	err := d.eachFlow(func(_ *lbFlow, v *lbConn, _ bool) { out[v.Backend]++ })
	return out, err
}

// DropFlowsOf removes the flows pinned to backend i (a backend that was removed).
func (d *Dataplane) DropFlowsOf(i uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropFlowsLocked(func(_ *lbFlow, v *lbConn) bool { return v.Backend == i })
}

// dropFlowsLocked removes the flows of both connection tables for which drop is true.
func (d *Dataplane) dropFlowsLocked(drop func(k *lbFlow, v *lbConn) bool) error {
	var del, delEmb []lbFlow
	err := d.eachFlow(func(k *lbFlow, v *lbConn, emb bool) {
		if drop(k, v) {
			if emb {
				delEmb = append(delEmb, *k)
			} else {
				del = append(del, *k)
			}
		}
	})
	if err != nil {
		return err
	}
	for j := range del {
		d.objs.Conns.Delete(&del[j])
	}
	for j := range delEmb {
		d.objs.Embryonic.Delete(&delEmb[j])
	}
	return d.writeConfigLocked()
}

// bumpEpoch invalidates every CPU's flow cache: the program's cached copies of connection
// table entries and backends are valid only in the epoch they were made in.
func (d *Dataplane) bumpEpoch() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.writeConfigLocked()
}

// Result is what the program did with one packet under BPF_PROG_RUN.
type Result struct {
	Action uint32 // XDP_DROP 1, XDP_PASS 2, XDP_TX 3, XDP_REDIRECT 4
	Out    []byte
}

// XDP actions.
const (
	ActionAborted  = 0
	ActionDrop     = 1
	ActionPass     = 2
	ActionTX       = 3
	ActionRedirect = 4
)

// Run runs the program once on pkt (an Ethernet frame) through BPF_PROG_RUN.
func (d *Dataplane) Run(pkt []byte) (Result, error) {
	out := make([]byte, len(pkt)+256)
	opts := ebpf.RunOptions{Data: pkt, DataOut: out}
	ret, err := d.objs.BraidLb.Run(&opts)
	if err != nil {
		return Result{}, fmt.Errorf("xdp: run: %w", err)
	}
	return Result{Action: ret, Out: opts.DataOut}, nil
}

// FlowHash is the program's flow hash: src and dst are the packet's addresses, sport and
// dport its ports; addrsOnly leaves the ports out.
func FlowHash(src, dst netip.Addr, sport, dport uint16, seed uint32, addrsOnly bool) uint32 {
	var s, t [16]byte
	fam := uint32(6)
	if src.Unmap().Is4() {
		a, b := src.Unmap().As4(), dst.Unmap().As4()
		copy(s[:], a[:])
		copy(t[:], b[:])
		fam = 4
	} else {
		s, t = src.As16(), dst.As16()
	}
	h := seed
	for i := 0; i < 16; i += 4 {
		h = mix(h, binary.LittleEndian.Uint32(s[i:]))
	}
	for i := 0; i < 16; i += 4 {
		h = mix(h, binary.LittleEndian.Uint32(t[i:]))
	}
	if !addrsOnly {
		var p [4]byte
		binary.BigEndian.PutUint16(p[0:], sport)
		binary.BigEndian.PutUint16(p[2:], dport)
		h = mix(h, binary.LittleEndian.Uint32(p[:]))
	}
	h = mix(h, fam)
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

func rotl(x uint32, r uint) uint32 { return x<<r | x>>(32-r) }

func mix(h, k uint32) uint32 {
	k *= 0xcc9e2d51
	k = rotl(k, 15)
	k *= 0x1b873593
	h ^= k
	h = rotl(h, 13)
	return h*5 + 0xe6546b64
}
