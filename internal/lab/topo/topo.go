// Package topo describes lab topologies as data: hosts (each a network namespace), point-to-point
// links between them with per-direction shaping (rate or a recorded capacity trace, one-way
// delay, jitter, random loss, a drop-tail queue bound), IPv4 and IPv6 addresses, and routes. A topology is built in Go or read
// from a TOML file (see Parse and the file format in toml.go); Validate reports every problem
// before anything is created.
package topo

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Topology is a whole emulated network.
type Topology struct {
	Name  string // short name, used in namespace names; [a-z0-9-], at most 16 characters
	Hosts []Host
	Links []Link
}

// Host is one network namespace.
type Host struct {
	Name    string // [a-z0-9-], at most 12 characters, unique in the topology
	Forward bool   // enable IPv4 and IPv6 forwarding (the host is a router)
	Routes  []Route
	// NAT, when set, makes the host a NAT router (and a router: forwarding is enabled
	// whatever Forward says).
	NAT *NAT
}

// NAT is a source NAT in a router host, as a home router or a carrier-grade NAT does it: every
// packet that leaves by one of the Outside interfaces gets that interface's address as its
// source (nftables masquerade), and a packet that arrives on an Outside interface is forwarded
// only when it belongs to a mapping (conntrack state established or related), so the hosts
// behind the NAT cannot be reached from outside first. The mappings are the host's conntrack
// entries: they expire after the kernel's timeouts, which UDPTimeout and UDPStreamTimeout set for
// this host's namespace alone.
type NAT struct {
	// Outside names the host's interfaces on the public side; the others are inside. Each needs
	// an IPv4 address (and an IPv6 one with IPv6).
	Outside []string
	// RandomPorts gives every mapping a random source port (masquerade fully-random), as many
	// carrier-grade NATs do. Without it the kernel keeps the inside port when it is free on the
	// outside address, as most home routers do.
	RandomPorts bool
	// IPv6 masquerades IPv6 too (NAT66). Without it IPv6 is routed untranslated (the inbound
	// filter applies to both families).
	IPv6 bool
	// UDPTimeout is how long a UDP mapping lives without traffic: the namespace's
	// net.netfilter.nf_conntrack_udp_timeout and, unless UDPStreamTimeout is set,
	// nf_conntrack_udp_timeout_stream, so that every mapping expires after it whether or not
	// replies were seen. Whole seconds, at most MaxNATTimeout; 0 keeps the kernel's (30 s for a
	// flow without replies, 120 s for one with replies for more than 2 s).
	UDPTimeout time.Duration
	// UDPStreamTimeout, when set, is the lifetime of a flow that has seen replies for more than
	// 2 s (nf_conntrack_udp_timeout_stream). Same unit and bounds as UDPTimeout.
	UDPStreamTimeout time.Duration
}

// MaxNATTimeout bounds the NAT timeouts (the kernel keeps them as an int of jiffies).
const MaxNATTimeout = 24 * time.Hour

// UDPTimeouts returns the values of nf_conntrack_udp_timeout and _stream that n sets, 0 for one
// left at the kernel's default.
func (n *NAT) UDPTimeouts() (unreplied, stream time.Duration) {
	stream = n.UDPStreamTimeout
	if stream == 0 {
		stream = n.UDPTimeout
	}
	return n.UDPTimeout, stream
}

// Route is a static route installed in a host. Dst is 0.0.0.0/0 or ::/0 for a default route.
// Via is the next hop; it must be on one of the host's links. When Via is the zero Addr, Dev must
// name one of the host's interfaces and the route is on-link.
type Route struct {
	Dst    netip.Prefix
	Via    netip.Addr
	Dev    string
	Metric int
}

// Link is a point-to-point link between hosts A and B. Each end is an interface in its host's
// namespace; AB shapes traffic from A to B and BA traffic from B to A.
type Link struct {
	Name string // unique; defaults to "A-B" (with a numeric suffix for parallel links)
	A, B Endpoint
	MTU  int // 0 means 1500
	AB   Shape
	BA   Shape
	// Offload selects how the emulator moves packets: OffloadAuto passes TSO super-packets through
	// when the link is fast and lossless, and takes MTU-sized packets otherwise.
	Offload Offload
	// Kernel makes the link a kernel veth pair instead of an emulated one: the kernel's full
	// speed with its offloads (the baseline a user-space tunnel is measured against). Rate is
	// then enforced by a TBF qdisc on each end; delay, jitter, loss and queue sizes are not
	// available, and Validate refuses them.
	Kernel bool
}

// Endpoint is one end of a link.
type Endpoint struct {
	Host   string
	Ifname string         // interface name in the host; defaults to "eth<N>" in creation order
	Addrs  []netip.Prefix // addresses with their prefix length, IPv4 and/or IPv6
}

// Shape is what one direction of a link does to packets.
type Shape struct {
	Rate uint64 // bits per second of IP packets; 0 means unlimited (or see Trace)
	// Trace, when set, replays recorded capacity instead of a fixed Rate (which must then be 0):
	// the link starts at Trace.Offset into the trace when it is created and repeats the trace.
	// Shapes hold the pointer: two shapes are == when they share the same parsed trace.
	Trace  *Trace
	Delay  time.Duration // one-way propagation delay, added after serialisation
	Jitter time.Duration // uniform extra delay in [0, Jitter]; packet order is kept
	Loss   float64       // random loss in percent, 0 to 100
	// QueuePackets and QueueBytes bound the drop-tail queue in front of the serialiser; 0 means
	// "default": one bandwidth-delay product of the round trip (at the trace's mean rate on a
	// trace link), at least 64 packets.
	QueuePackets int
	QueueBytes   int
}

// Offload is the emulator's packet mode.
type Offload int

const (
	OffloadAuto Offload = iota
	OffloadOn           // TSO/USO super-packets pass through whole
	OffloadOff          // MTU-sized packets
)

// String returns the TOML spelling of o.
func (o Offload) String() string {
	switch o {
	case OffloadOn:
		return "on"
	case OffloadOff:
		return "off"
	}
	return "auto"
}

// ParseOffload parses the emulator packet mode: "auto" (or empty), "on" or "off".
func ParseOffload(s string) (Offload, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return OffloadAuto, nil
	case "on":
		return OffloadOn, nil
	case "off":
		return OffloadOff, nil
	}
	return OffloadAuto, fmt.Errorf("invalid offload %q: want auto, on or off", s)
}
