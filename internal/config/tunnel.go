// Package config holds the typed configuration of each braid role: one struct per role, with
// its defaults and a Validate that reports every problem at once. Config has no side effects:
// what it needs from the machine (does an interface exist, what is in a key file) it asks an
// injected Env, so that tests run on fakes and the app decides what the real system is.
//
// # The site file
//
// A site is described once, in one TOML file; each role reads its own section ([tunnel] for
// `braid tunnel`) and ignores the sections of the other roles: [proxy], [lb], [mapserver],
// [xtr] and [pm] are accepted as opaque tables. Any other top-level key is an error, like any
// unknown key inside [tunnel], so a typo such as [tunel] or "probe_intreval" cannot silently
// leave a default in place. Every error names the file, the line of the offending key, the
// object (e.g. "peer site-b path 2") and the key.
//
// Durations are Go durations ("50ms", "1.5s") or bare numbers of milliseconds; rates are
// "100mbit", "1gbit" or bare numbers of bit/s; sizes are "4MiB", "64kb" or bare numbers of
// bytes (package braid/internal/units).
//
// # The [tunnel] section
//
//	[tunnel]
//	mode = "braid"            # braid (default): authenticated, encrypted, probed paths
//	                          # mpt: MPT-GRE framing, interoperates with MPT (no keys, no crypto)
//	private_key_file = "/etc/braid/site-a.key" # braid mode: this endpoint's X25519 private key,
//	                          # as written by 'braid keygen --out'; a relative name is relative
//	                          # to the directory of the site file, not to the working directory
//	# private_key = "<base64>" # or the key itself; exactly one of the two. There is no default
//	                          # key: run 'braid keygen'.
//	interface = "braid0"      # TUN device name, at most 15 characters (default braid0)
//	address = ["10.255.0.1/30", "fd00:ff::1/64"] # addresses of the TUN device, a string or a
//	                          # list; optional (the device may be configured by other means)
//	mtu = 0                   # TUN MTU; 0 (default) = derived by the tunnel from the paths;
//	                          # else 576..65535, at least 1280 with an IPv6 address
//	port = 4754               # default local UDP port of the uplinks (default 4754, the
//	                          # GRE-in-UDP port of RFC 8086)
//	scheduler = "paced"       # paced (braid default) | wrr (mpt default) | minrtt | blest |
//	                          # ecf | rbpm; the last four need braid mode's RTT probes; blest,
//	                          # ecf and rbpm take the peer's reorder buffer (its
//	                          # reorder_max_bytes) as the receive buffer they must not block
//	probe_interval = "50ms"   # braid mode: probe every path this often, also when idle
//	                          # (default 50ms, 1ms..1m)
//	down_after = "250ms"      # braid mode: a path without a reply for this long is down; at
//	                          # least 2 × probe_interval (default 250ms, or 5 × probe_interval
//	                          # when only probe_interval is given)
//	reorder = true            # braid mode: put packets back in order at the receiver (default)
//	reorder_max_packets = 4096 # braid mode: reorder buffer bound per peer, 1..1048576
//	reorder_max_bytes = "4MiB" # braid mode: reorder buffer bound per peer in bytes
//	reorder_max_hold = "100ms" # braid mode: longest time a packet waits for a gap, 1ms..10s;
//	                          # the tunnel holds less when the paths' RTTs allow
//	metrics = "127.0.0.1:9473" # status and Prometheus endpoint, address:port; "" disables
//	control = "@braid/tunnel" # runtime control socket and status ('braid status'): an
//	                          # absolute path, or @NAME, an abstract socket of the network
//	                          # namespace (the default: one per namespace); "" disables
//
//	[[tunnel.uplink]]         # the site's own ends of the paths, at least one
//	name = "fibre"            # letters, digits, ".", "_", "-", at most 32; unique
//	interface = "wan0"        # network interface of the uplink; must exist on this machine,
//	                          # unless the uplink has no address (it may appear later)
//	address = "192.0.2.1"     # local IPv4 or IPv6 address to bind; braid mode may leave
//	                          # it out: the uplink then follows the interface's address
//	                          # (a DHCP lease, a modem's), binds anew when it changes, and
//	                          # waits for an interface that is not there yet (docs/tunnel.md,
//	                          # "Uplinks that come and go"); required in mpt mode
//	port = 0                  # local UDP port; 0 (default) = tunnel.port
//	weight = 1                # scheduler weight (MPT's weight_out), 0..65535; 0 (default) =
//	                          # from the measured capacity (from capacity, else 1, in mpt mode)
//	capacity = "100mbit"      # optional: the uplink's capacity; the paced scheduler sends
//	                          # every path on the uplink at most this, and all of them
//	                          # together too (one token bucket per uplink)
//
//	[[tunnel.peer]]           # the other sites, at least one
//	name = "site-b"           # as for uplinks; unique
//	public_key = "<base64>"   # braid mode, required: the peer's key ('braid keygen --public'
//	                          # on the peer); unique, and not our own
//	routes = ["10.2.0.0/16", "fd02::/48"] # prefixes sent to this peer through the tunnel and
//	                          # accepted from it as inner sources; no two peers may overlap
//	keepalive = "10s"         # braid mode: the longest a path stays without sending to the
//	                          # peer, so that NATs on the way keep its mapping (probes, every
//	                          # probe_interval, usually send more often); 10ms..2m, default 10s
//	max_paths = 16            # braid mode, peers whose paths are learned (no remote): at most
//	                          # this many paths, 1..254 (default 16); a packet on one more
//	                          # takes the place of a learned path on its uplink silent for a
//	                          # minute, or else is dropped (drop_path_limit, logged once)
//	  [[tunnel.peer.path]]    # one per (local uplink, remote address) pair, at least one;
//	                          # at most 255 (braid) or 20 (mpt, MPT's limit) per peer
//	  uplink = "fibre"        # name of a tunnel.uplink
//	  remote = "198.51.100.1:4754" # the peer's address:port for this path ("[2001:db8::1]:4754"
//	                          # for IPv6), of the uplink's address family; port required. In
//	                          # braid mode it is where the path starts: the path follows the
//	                          # peer's authenticated packets to a new address (NAT rebinding).
//	                          # Braid mode may leave it out on every path of a peer (a hub's
//	                          # view of sites behind NAT): the peer's paths are then learned
//	                          # from its authenticated packets on the uplinks named (each
//	                          # once; weight applies to the paths learned there), and its
//	                          # handshakes are answered from any address (docs/tunnel.md,
//	                          # "Behind NAT")
//	  weight = 0              # optional, 0..65535; 0 (default) = the uplink's weight
//
// In mode "mpt" the keys marked "braid mode" above are errors, and each peer may have these
// instead (MPT's connection settings, tunnels.md section 2):
//
//	[[tunnel.peer]]
//	name = "mpt-server"
//	routes = ["10.9.0.0/16"]
//	reorder_window = 0        # packets; 0 (default) = off, as in MPT; else up to 10000. It
//	                          # decides whether data carries a GRE sequence number, so both
//	                          # ends must agree on on/off
//	max_buffdelay = "100ms"   # longest reorder wait (MPT's max_buffdelay_msec; 0 = 100ms)
//	keepalive = "1s"          # keepalive interval (MPT's keepalive_time); "0" = none
//	                          # (default 1s)
//	dead_time = "3s"          # a path without keepalive for this long is down; at least
//	                          # 2 × keepalive, 0 without keepalives (default 3 × keepalive)
//	local_tunnel_ip = "10.255.0.1"  # carried in keepalives; default: the first address of
//	                          # tunnel.address of remote_tunnel_ip's family
//	remote_tunnel_ip = "10.255.0.2" # required: the peer's tunnel address
//	cmd_port = 0              # MPT's cmdport_local: the UDP port on which braid exchanges path
//	                          # status changes (0xA2) with the peer; 0 (default) = no command
//	                          # port, paths judged by keepalives alone. Only the paths' remote
//	                          # addresses are answered
//	remote_cmd_port = 65050   # the peer's command port (MPT's remote_cmd_port, default 65050)
//	auth_type = 0             # MPT's auth_type for the command port: 0 none, 1 random token,
//	                          # 2 SHA-256 with auth_key
//	auth_key = ""             # MPT's auth_key, hex; required with auth_type 2
//	  [[tunnel.peer.path]]
//	  uplink = "fibre"
//	  remote = "198.51.100.1:23456"
//
// Peer settings of the other mode ("public_key" or "max_paths" in mpt mode, "dead_time" in
// braid mode, ...) are errors that say which mode they belong to; "keepalive" is a key of
// both, with each mode's meaning. See testdata/site-a.toml and site-b.toml for a
// matching pair of sites.
package config

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"braid/internal/config/tomlfile"
	"braid/internal/tunnel/session"
	"braid/internal/units"
)

// Mode is the tunnel's wire format.
type Mode string

// Modes of the tunnel (docs/tunnel-wire.md).
const (
	ModeBraid Mode = "braid" // authenticated and encrypted, probed paths, reordering
	ModeMPT   Mode = "mpt"   // MPT-GRE framing and keepalives, for interoperation with MPT
)

// Scheduler names the policy that spreads packets over a peer's paths.
type Scheduler string

// Schedulers of the tunnel.
const (
	SchedulerPaced  Scheduler = "paced"  // rate-aware with pacing, from measured capacity
	SchedulerWRR    Scheduler = "wrr"    // smooth weighted round robin, as MPT
	SchedulerMinRTT Scheduler = "minrtt" // lowest RTT first; needs braid mode's probes
	SchedulerBLEST  Scheduler = "blest"  // MinRTT that waits for the fast path when a slow one would block the receiver
	SchedulerECF    Scheduler = "ecf"    // MinRTT that waits for the fast path when it would finish first
	SchedulerRBPM   Scheduler = "rbpm"   // demotes paths that would fill the receiver's buffer out of order
)

// Limits of the tunnel's configuration.
const (
	DefaultTunnelPort = 4754 // GRE-in-UDP, RFC 8086
	maxIfname         = 15   // IFNAMSIZ - 1
	maxName           = 32
	minMTU            = 576   // the IPv4 minimum datagram every host must accept
	minMTUIPv6        = 1280  // RFC 8200
	maxMTU            = 65535 // the largest IPv4 or non-jumbo IPv6 packet
	maxWeight         = 65535
	maxPathsBraid     = 255 // path IDs 0..254 (docs/tunnel-wire.md)
	maxPathsMPT       = 20  // MPT's limit per connection
	maxLearnedPaths   = 254 // path IDs 0..253 of learned paths
	// DefaultMaxPaths bounds a peer's learned paths (tunnel.DefaultMaxPaths).
	DefaultMaxPaths = 16
	// DefaultKeepalive is braid mode's keepalive (tunnel.DefaultKeepalive): well under the
	// 30 s after which many NATs forget a UDP mapping.
	DefaultKeepalive = 10 * time.Second
	minKeepalive     = 10 * time.Millisecond
	maxKeepalive     = 2 * time.Minute // RFC 4787: a NAT keeps an idle UDP mapping at least this long
	// DefaultMPTCmdPort is MPT's default cmdport_local and remote_cmd_port.
	DefaultMPTCmdPort = 65050
	maxReorderPackets = 1 << 20
	maxReorderWindow  = 10000 // MPT's reorder buffer holds 10 001
	maxSunPath        = 107   // sizeof(sockaddr_un.sun_path) - 1
)

// Tunnel is the configuration of `braid tunnel`. Build it with TunnelDefaults and check it with
// Validate, or read it with LoadTunnel, which does both.
type Tunnel struct {
	Mode      Mode
	Interface string         // TUN device name
	Addresses []netip.Prefix // of the TUN device
	MTU       int            // of the TUN device; 0: derived from the paths
	Port      uint16         // default local UDP port of the uplinks
	Scheduler Scheduler
	Metrics   netip.AddrPort // status and Prometheus endpoint; the zero value disables it
	Control   string         // runtime control socket; "" disables it
	// Threads is how many threads run the tunnel's Go code at once (GOMAXPROCS); 0 (the
	// default): one while the tunnel's work fits on one core, every CPU once it does not
	// (internal/gothreads).
	Threads int

	// Braid holds what only braid mode has; it is nil in mpt mode.
	Braid *BraidSettings

	Uplinks []Uplink
	Peers   []Peer
}

// BraidSettings are the tunnel-wide settings of braid mode.
type BraidSettings struct {
	// PrivateKey is this endpoint's static key. If it is zero and PrivateKeyFile is set,
	// the key is in that file (ReadPrivateKey); LoadTunnel reads it and sets both.
	PrivateKey     session.PrivateKey
	PrivateKeyFile string

	ProbeInterval time.Duration // between probes on each path, also when idle
	DownAfter     time.Duration // without a probe reply, a path is down
	Reorder       Reorder
	// LossRecovery resends, once each and on the fastest path, the data packets the peer
	// reports lost, and reports the losses this side sees, so that a random loss on one path
	// does not reach the flows inside the tunnel (the default; docs/scheduling.md).
	LossRecovery bool
	// SparseFlows sends the packets of sparse flows (pings, DNS, voice, handshakes) on
	// every path and delivers the first copy at once (the default; docs/scheduling.md,
	// "Sparse flows").
	SparseFlows bool
	// Encryption of data packets (the default). Off, data is still authenticated (Poly1305
	// under the session key, replay window and all) but travels in clear: for links that are
	// already protected below, where the cipher's CPU is better spent elsewhere. Control
	// messages and handshakes are always sealed.
	Encryption bool
	// Cipher is the transport cipher: "" (auto: AES-256-GCM where both sites' CPUs have AES
	// instructions, ChaCha20-Poly1305 otherwise), or one of session's cipher names, which
	// this site then insists on.
	Cipher string
	// Shards is the number of sockets per uplink, each read on a core of its own, over which
	// the peers are spread (docs/tunnel.md, "A hub on every core"); 0: as many as the
	// machine has CPUs (the default). 1 reads each uplink with one goroutine.
	Shards int
}

// maxShards bounds shards: sockets per uplink.
const maxShards = 1024

// maxThreads bounds threads (GOMAXPROCS).
const maxThreads = 1024

// Reorder bounds each peer's reorder buffer at the receiver.
type Reorder struct {
	Enabled    bool
	MaxPackets int
	MaxBytes   int
	MaxHold    time.Duration
}

// Uplink is a local end of paths: a UDP socket bound to an address of a network interface.
type Uplink struct {
	Name      string
	Interface string
	Address   netip.Addr
	Port      uint16 // 0: Tunnel.Port
	Weight    int    // 0: from the measured capacity
	Capacity  uint64 // bit/s; 0: unknown
}

// Follows reports whether the uplink follows its interface's address (braid mode, no
// address given): it binds to the address the interface has, again whenever that changes,
// and waits for an interface that is not there yet.
func (u *Uplink) Follows() bool { return !u.Address.IsValid() }

// Socket returns the address the uplink binds, port being the tunnel's default port (with an
// invalid address when the uplink follows its interface's).
func (u *Uplink) Socket(port uint16) netip.AddrPort {
	if u.Port != 0 {
		port = u.Port
	}
	return netip.AddrPortFrom(u.Address, port)
}

// Peer is another site, reached over one or more paths.
type Peer struct {
	Name      string
	PublicKey session.PublicKey // braid mode only
	Routes    []netip.Prefix    // inner prefixes sent to and accepted from the peer
	Paths     []PeerPath
	MPT       *MPTSettings // mpt mode only; nil in braid mode
	// Braid mode: Keepalive is the longest a path stays without sending to the peer (0:
	// DefaultKeepalive); MaxPaths bounds the paths learned for a peer whose paths have no
	// Remote (0: DefaultMaxPaths).
	Keepalive time.Duration
	MaxPaths  int
}

// Learned reports whether the peer's paths are learned from its packets: braid mode, and no
// path has a remote address.
func (p *Peer) Learned() bool {
	if p.MPT != nil || len(p.Paths) == 0 {
		return false
	}
	for _, pp := range p.Paths {
		if pp.Remote.IsValid() {
			return false
		}
	}
	return true
}

// PeerPath is one path to a peer: from a local uplink to one of the peer's addresses.
type PeerPath struct {
	Uplink string         // Uplink.Name
	Remote netip.AddrPort // the peer's end; braid mode: none on every path of a learned peer
	Weight int            // 0: the uplink's weight
}

// MPTSettings are the per-peer settings of mpt mode, with MPT's meaning (tunnels.md section 2).
type MPTSettings struct {
	ReorderWindow  int           // packets; 0: no reordering and no GRE sequence numbers
	MaxBuffDelay   time.Duration // longest reorder wait
	Keepalive      time.Duration // interval of keepalives on each path; 0: none
	DeadTime       time.Duration // without keepalives, a path is down; 0 with Keepalive 0
	LocalTunnelIP  netip.Addr    // carried in keepalives
	RemoteTunnelIP netip.Addr
	CmdPort        uint16 // MPT's cmdport_local; 0: no command port
	RemoteCmdPort  uint16 // MPT's remote_cmd_port; 0: DefaultMPTCmdPort
	AuthType       int    // MPT's auth_type, 0, 1 or 2
	AuthKey        string // MPT's auth_key's bytes, decoded from hex
}

// Env is what validation needs from the machine. The app passes the real system
// (net.InterfaceByName, os.ReadFile); tests pass a fake.
type Env interface {
	InterfaceExists(name string) bool
	ReadFile(name string) ([]byte, error)
}

// TunnelDefaults returns the defaults of a braid-mode tunnel, without uplinks or peers and
// without a key (there is no default key).
func TunnelDefaults() Tunnel {
	b := BraidDefaults()
	return Tunnel{
		Mode:      ModeBraid,
		Interface: "braid0",
		Port:      DefaultTunnelPort,
		Scheduler: SchedulerPaced,
		Metrics:   netip.MustParseAddrPort(DefaultTunnelMetrics),
		Control:   DefaultTunnelControl,
		Braid:     &b,
	}
}

// BraidDefaults returns the defaults of braid mode's settings: probes every 50 ms, a path is
// down after 250 ms without replies (some 5 lost probes, well under a second of failover), and
// a reorder buffer of 4096 packets, 4 MiB and at most 100 ms of hold, which keeps a loss from
// stalling TCP the way MPT's 300 ms does (tunnels.md section 3).
func BraidDefaults() BraidSettings {
	return BraidSettings{
		Encryption:    true,
		LossRecovery:  true,
		SparseFlows:   true,
		ProbeInterval: 50 * time.Millisecond,
		DownAfter:     250 * time.Millisecond,
		Reorder: Reorder{
			Enabled:    true,
			MaxPackets: 4096,
			MaxBytes:   4 << 20,
			MaxHold:    100 * time.Millisecond,
		},
	}
}

// MPTDefaults returns the defaults of a peer in mpt mode: no reordering (MPT's default), a
// 100 ms reorder wait when it is turned on (MPT's default for 0), a keepalive every second and
// a path down after 3 s without one, which MPT measured at about 3 s of failover.
func MPTDefaults() MPTSettings {
	return MPTSettings{
		MaxBuffDelay: 100 * time.Millisecond,
		Keepalive:    time.Second,
		DeadTime:     3 * time.Second,
	}
}

// ReadPrivateKey reads a private key file as written by 'braid keygen --out'. Its error names
// the file.
func ReadPrivateKey(env Env, name string) (session.PrivateKey, error) {
	data, err := env.ReadFile(name)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path error would repeat the name
		}
		return session.PrivateKey{}, fmt.Errorf("cannot read %s: %w", name, err)
	}
	k, err := session.ParsePrivateKey(string(data))
	if err != nil {
		return k, fmt.Errorf("%s holds no private key: %s", name, keyReason(err))
	}
	return k, nil
}

func keyReason(err error) string { return strings.TrimPrefix(err.Error(), "session: ") }

// Error is one problem in a configuration: "file:line: object: reason".
type Error = tomlfile.Error

// LoadTunnel decodes the [tunnel] section of the site file data (named filename in errors),
// fills in the defaults and validates the result with env. The error, if any, is a *Error or
// an errors.Join of *Error values sorted by line, each with File set to filename; every
// problem found is reported, not only the first.
func LoadTunnel(filename string, data []byte, env Env) (*Tunnel, error) {
	var f fileSite
	ix, err := tomlfile.Decode(filename, data, &f)
	if err != nil {
		return nil, err
	}
	if f.Tunnel == nil {
		return nil, &Error{File: filename, Reason: "no [tunnel] section"}
	}
	l := &loader{env: env, dir: filepath.Dir(filename)}
	t := l.tunnel(f.Tunnel)
	issues := l.issues
	reported := map[string]bool{}
	for _, is := range issues {
		reported[is.paths[0]] = true
	}
	for _, is := range t.check(env) {
		// A value that did not parse is left zero; do not report it again as missing.
		if !reported[is.paths[0]] {
			issues = append(issues, is)
		}
	}
	if len(issues) == 0 {
		return t, nil
	}
	for _, is := range issues {
		is.err.File = filename
		is.err.Line = ix.Line(is.paths...)
	}
	slices.SortStableFunc(issues, func(a, b issue) int { return cmp.Compare(a.err.Line, b.err.Line) })
	return nil, joinIssues(issues)
}

// Validate reports every problem in t as an errors.Join of *Error values, or nil. Errors name
// fields by their keys in the site file. It asks env whether the uplinks' interfaces exist and,
// if the private key is given only as a file, reads it; a nil env skips these checks (to check
// a configuration meant for another machine). Validate does not modify t.
func (t *Tunnel) Validate(env Env) error {
	return joinIssues(t.check(env))
}

// issue is a problem with the key paths (such as "tunnel.peer[1].path[0].remote") that most
// likely hold the offending value, best first; LoadTunnel uses them to find the line.
type issue struct {
	err   *Error
	paths []string
}

func joinIssues(issues []issue) error {
	errs := make([]error, len(issues))
	for i, is := range issues {
		errs[i] = is.err
	}
	return errors.Join(errs...)
}

// The file* types mirror the file format. Pointers tell an absent key from a zero value, which
// matters for defaults that depend on other keys and for keys of the other mode. Values with
// units are "any" because they may be a TOML string or number.
type fileSite struct {
	Tunnel *fileTunnel `toml:"tunnel"`
	// Sections of the other roles, read by them.
	Proxy     map[string]any `toml:"proxy"`
	LB        map[string]any `toml:"lb"`
	Mapserver map[string]any `toml:"mapserver"`
	XTR       map[string]any `toml:"xtr"`
	PM        map[string]any `toml:"pm"`
}

type fileTunnel struct {
	Mode              *string      `toml:"mode"`
	PrivateKey        *string      `toml:"private_key"`
	PrivateKeyFile    *string      `toml:"private_key_file"`
	Interface         *string      `toml:"interface"`
	Address           any          `toml:"address"`
	MTU               *int64       `toml:"mtu"`
	Port              *int64       `toml:"port"`
	Scheduler         *string      `toml:"scheduler"`
	ProbeInterval     any          `toml:"probe_interval"`
	DownAfter         any          `toml:"down_after"`
	Reorder           *bool        `toml:"reorder"`
	LossRecovery      *bool        `toml:"loss_recovery"`
	SparseFlows       *bool        `toml:"sparse_flows"`
	Encryption        *bool        `toml:"encryption"`
	Cipher            *string      `toml:"cipher"`
	ReorderMaxPackets *int64       `toml:"reorder_max_packets"`
	ReorderMaxBytes   any          `toml:"reorder_max_bytes"`
	ReorderMaxHold    any          `toml:"reorder_max_hold"`
	Shards            *int64       `toml:"shards"`
	Threads           *int64       `toml:"threads"`
	Metrics           *string      `toml:"metrics"`
	Control           *string      `toml:"control"`
	Uplink            []fileUplink `toml:"uplink"`
	Peer              []filePeer   `toml:"peer"`
}

type fileUplink struct {
	Name      string `toml:"name"`
	Interface string `toml:"interface"`
	Address   string `toml:"address"`
	Port      *int64 `toml:"port"`
	Weight    *int64 `toml:"weight"`
	Capacity  any    `toml:"capacity"`
}

type filePeer struct {
	Name      string     `toml:"name"`
	PublicKey *string    `toml:"public_key"`
	Routes    any        `toml:"routes"`
	Path      []filePath `toml:"path"`
	MaxPaths  *int64     `toml:"max_paths"` // braid mode
	// mpt mode (keepalive: both)
	ReorderWindow  *int64  `toml:"reorder_window"`
	MaxBuffDelay   any     `toml:"max_buffdelay"`
	Keepalive      any     `toml:"keepalive"`
	DeadTime       any     `toml:"dead_time"`
	LocalTunnelIP  *string `toml:"local_tunnel_ip"`
	RemoteTunnelIP *string `toml:"remote_tunnel_ip"`
	CmdPort        *int64  `toml:"cmd_port"`
	RemoteCmdPort  *int64  `toml:"remote_cmd_port"`
	AuthType       *int64  `toml:"auth_type"`
	AuthKey        *string `toml:"auth_key"`
}

type filePath struct {
	Uplink string `toml:"uplink"`
	Remote string `toml:"remote"`
	Weight *int64 `toml:"weight"`
}

// loader converts the decoded file into a Tunnel, collecting the values that do not parse and
// the keys of the wrong mode. Slices of the result are indexed as the file's arrays, so the
// key paths of check find the same keys.
type loader struct {
	env    Env
	dir    string // of the site file, for a relative private_key_file
	issues []issue
	// keyFiles are the key files the configuration names (as opened), for KeyFileWarnings
	keyFiles []string
}

func (l *loader) fail(obj, path, format string, args ...any) {
	l.issues = append(l.issues, issue{&Error{Object: obj, Reason: fmt.Sprintf(format, args...)}, []string{path}})
}

func (l *loader) tunnel(f *fileTunnel) *Tunnel {
	t := TunnelDefaults()
	const obj, p = "tunnel", "tunnel."
	if f.Mode != nil {
		t.Mode = Mode(*f.Mode) // an unknown mode is reported by check
	}
	if f.Interface != nil {
		t.Interface = *f.Interface
	}
	t.Addresses = l.prefixes(obj, p+"address", "address", f.Address)
	if f.MTU != nil {
		t.MTU = l.int(obj, p+"mtu", "mtu", *f.MTU)
	}
	if f.Port != nil {
		t.Port = l.port(obj, p+"port", "port", *f.Port, 1)
	}
	if f.Threads != nil {
		t.Threads = l.int(obj, p+"threads", "threads", *f.Threads)
	}
	switch {
	case f.Scheduler != nil:
		t.Scheduler = Scheduler(*f.Scheduler)
	case t.Mode == ModeMPT:
		t.Scheduler = SchedulerWRR
	}
	if f.Metrics != nil {
		t.Metrics = netip.AddrPort{}
		if *f.Metrics != "" {
			ap, err := netip.ParseAddrPort(*f.Metrics)
			if err != nil {
				l.fail(obj, p+"metrics", "metrics %q: want address:port such as 127.0.0.1:9473, or \"\" for none", *f.Metrics)
			}
			t.Metrics = ap
		}
	}
	if f.Control != nil {
		t.Control = *f.Control
	}

	if t.Mode == ModeMPT {
		t.Braid = nil
		for _, k := range []struct {
			key string
			set bool
		}{
			{"private_key", f.PrivateKey != nil},
			{"private_key_file", f.PrivateKeyFile != nil},
			{"probe_interval", f.ProbeInterval != nil},
			{"down_after", f.DownAfter != nil},
			{"reorder", f.Reorder != nil},
			{"loss_recovery", f.LossRecovery != nil},
			{"sparse_flows", f.SparseFlows != nil},
			{"encryption", f.Encryption != nil},
			{"cipher", f.Cipher != nil},
			{"reorder_max_packets", f.ReorderMaxPackets != nil},
			{"reorder_max_bytes", f.ReorderMaxBytes != nil},
			{"reorder_max_hold", f.ReorderMaxHold != nil},
			{"shards", f.Shards != nil},
		} {
			if k.set {
				l.fail(obj, p+k.key, "%s is a braid-mode key; mode is \"mpt\" (MPT has no keys or probes; reordering is per peer: reorder_window)", k.key)
			}
		}
	} else {
		l.braid(t.Braid, f)
	}

	for i := range f.Uplink {
		t.Uplinks = append(t.Uplinks, l.uplink(i, &f.Uplink[i]))
	}
	for i := range f.Peer {
		t.Peers = append(t.Peers, l.peer(&t, i, &f.Peer[i]))
	}
	return &t
}

func (l *loader) braid(b *BraidSettings, f *fileTunnel) {
	const obj, p = "tunnel", "tunnel."
	if f.PrivateKey != nil && f.PrivateKeyFile != nil {
		// The key is still read below, so that this is the only error.
		l.fail(obj, p+"private_key_file", "private_key and private_key_file are both set; keep one")
	}
	switch {
	case f.PrivateKey != nil:
		k, err := session.ParsePrivateKey(*f.PrivateKey)
		if err != nil {
			l.fail(obj, p+"private_key", "private_key: %s", keyReason(err))
		}
		b.PrivateKey = k
	case f.PrivateKeyFile != nil:
		name := *f.PrivateKeyFile
		if name != "" && !filepath.IsAbs(name) {
			name = filepath.Join(l.dir, name)
		}
		b.PrivateKeyFile = name
		if name != "" && l.env != nil {
			k, err := ReadPrivateKey(l.env, name)
			if err != nil {
				l.fail(obj, p+"private_key_file", "private_key_file: %v", err)
			}
			b.PrivateKey = k
		}
	}
	probeSet := l.duration(obj, p+"probe_interval", "probe_interval", f.ProbeInterval, &b.ProbeInterval)
	if !l.duration(obj, p+"down_after", "down_after", f.DownAfter, &b.DownAfter) && probeSet {
		b.DownAfter = 5 * b.ProbeInterval
	}
	if f.Reorder != nil {
		b.Reorder.Enabled = *f.Reorder
	}
	if f.Encryption != nil {
		b.Encryption = *f.Encryption
	}
	if f.LossRecovery != nil {
		b.LossRecovery = *f.LossRecovery
	}
	if f.SparseFlows != nil {
		b.SparseFlows = *f.SparseFlows
	}
	if f.Cipher != nil && *f.Cipher != "auto" {
		if _, err := session.ParseCipher(*f.Cipher); err != nil {
			l.fail(obj, p+"cipher", "cipher %q: want auto, chacha20-poly1305 or aes-256-gcm", *f.Cipher)
		} else {
			b.Cipher = *f.Cipher
		}
	}
	if f.ReorderMaxPackets != nil {
		b.Reorder.MaxPackets = l.int(obj, p+"reorder_max_packets", "reorder_max_packets", *f.ReorderMaxPackets)
	}
	if f.ReorderMaxBytes != nil {
		if s, ok := l.numberOrString(obj, p+"reorder_max_bytes", "reorder_max_bytes", f.ReorderMaxBytes); ok {
			n, err := units.ParseSize(s)
			if err != nil {
				l.fail(obj, p+"reorder_max_bytes", "reorder_max_bytes: %v", err)
			}
			b.Reorder.MaxBytes = n
		}
	}
	l.duration(obj, p+"reorder_max_hold", "reorder_max_hold", f.ReorderMaxHold, &b.Reorder.MaxHold)
	if f.Shards != nil {
		b.Shards = l.int(obj, p+"shards", "shards", *f.Shards)
	}
}

func (l *loader) uplink(i int, f *fileUplink) Uplink {
	u := Uplink{Name: f.Name, Interface: f.Interface}
	obj := objName("uplink", f.Name, i)
	p := fmt.Sprintf("tunnel.uplink[%d].", i)
	if f.Address != "" {
		a, err := netip.ParseAddr(f.Address)
		if err != nil {
			l.fail(obj, p+"address", "address %q: want an IPv4 or IPv6 address such as 192.0.2.1", f.Address)
		}
		u.Address = a
	}
	if f.Port != nil {
		u.Port = l.port(obj, p+"port", "port", *f.Port, 0)
	}
	if f.Weight != nil {
		u.Weight = l.int(obj, p+"weight", "weight", *f.Weight)
	}
	if f.Capacity != nil {
		if s, ok := l.numberOrString(obj, p+"capacity", "capacity", f.Capacity); ok {
			r, err := units.ParseRate(s)
			if err != nil {
				l.fail(obj, p+"capacity", "capacity: %v", err)
			}
			u.Capacity = r
		}
	}
	return u
}

func (l *loader) peer(t *Tunnel, i int, f *filePeer) Peer {
	pr := Peer{Name: f.Name}
	obj := objName("peer", f.Name, i)
	p := fmt.Sprintf("tunnel.peer[%d].", i)
	pr.Routes = l.prefixes(obj, p+"routes", "routes", f.Routes)
	for j, fp := range f.Path {
		pp := PeerPath{Uplink: fp.Uplink}
		pobj := fmt.Sprintf("%s path %d", obj, j+1)
		pk := fmt.Sprintf("%spath[%d].", p, j)
		if fp.Remote != "" {
			ap, err := netip.ParseAddrPort(fp.Remote)
			if err != nil {
				l.fail(pobj, pk+"remote", "remote %q: want address:port such as 198.51.100.1:%d or [2001:db8::1]:%d", fp.Remote, t.Port, t.Port)
			}
			pp.Remote = ap
		}
		if fp.Weight != nil {
			pp.Weight = l.int(pobj, pk+"weight", "weight", *fp.Weight)
		}
		pr.Paths = append(pr.Paths, pp)
	}

	mptKeys := []struct {
		key string
		set bool
	}{
		{"reorder_window", f.ReorderWindow != nil},
		{"max_buffdelay", f.MaxBuffDelay != nil},
		{"dead_time", f.DeadTime != nil},
		{"local_tunnel_ip", f.LocalTunnelIP != nil},
		{"remote_tunnel_ip", f.RemoteTunnelIP != nil},
		{"cmd_port", f.CmdPort != nil},
		{"remote_cmd_port", f.RemoteCmdPort != nil},
		{"auth_type", f.AuthType != nil},
		{"auth_key", f.AuthKey != nil},
	}
	switch t.Mode {
	case ModeBraid:
		for _, k := range mptKeys {
			if k.set {
				l.fail(obj, p+k.key, "%s is an mpt-mode key; mode is \"braid\" (set tunnel.mode = \"mpt\" to interoperate with MPT)", k.key)
			}
		}
		if f.PublicKey != nil {
			k, err := session.ParsePublicKey(*f.PublicKey)
			if err != nil {
				l.fail(obj, p+"public_key", "public_key: %s", keyReason(err))
			}
			pr.PublicKey = k
		}
		// Absent, they stay 0: the defaults (DefaultKeepalive, DefaultMaxPaths).
		if l.duration(obj, p+"keepalive", "keepalive", f.Keepalive, &pr.Keepalive) && pr.Keepalive == 0 {
			l.fail(obj, p+"keepalive", "keepalive 0: braid mode always keeps paths alive; leave it out for the default (%v)", DefaultKeepalive)
		}
		if f.MaxPaths != nil {
			pr.MaxPaths = l.int(obj, p+"max_paths", "max_paths", *f.MaxPaths)
			switch {
			case pr.MaxPaths < 1 || pr.MaxPaths > maxLearnedPaths:
				l.fail(obj, p+"max_paths", "max_paths %d outside 1..%d", pr.MaxPaths, maxLearnedPaths)
			case !pr.Learned():
				l.fail(obj, p+"max_paths", "max_paths bounds learned paths, and this peer's paths have remote addresses (leave remote out on every path to learn them)")
			}
		}
	case ModeMPT:
		if f.PublicKey != nil {
			l.fail(obj, p+"public_key", "public_key is a braid-mode key; mode is \"mpt\" (MPT has no keys)")
		}
		if f.MaxPaths != nil {
			l.fail(obj, p+"max_paths", "max_paths is a braid-mode key; mode is \"mpt\" (MPT's paths are all in the site file)")
		}
		m := MPTDefaults()
		if f.ReorderWindow != nil {
			m.ReorderWindow = l.int(obj, p+"reorder_window", "reorder_window", *f.ReorderWindow)
		}
		if l.duration(obj, p+"max_buffdelay", "max_buffdelay", f.MaxBuffDelay, &m.MaxBuffDelay) && m.MaxBuffDelay == 0 {
			m.MaxBuffDelay = MPTDefaults().MaxBuffDelay // MPT: 0 means 100 ms
		}
		keepSet := l.duration(obj, p+"keepalive", "keepalive", f.Keepalive, &m.Keepalive)
		if !l.duration(obj, p+"dead_time", "dead_time", f.DeadTime, &m.DeadTime) && keepSet {
			m.DeadTime = 3 * m.Keepalive // MPT's default
		}
		if f.RemoteTunnelIP != nil {
			m.RemoteTunnelIP = l.addr(obj, p+"remote_tunnel_ip", "remote_tunnel_ip", *f.RemoteTunnelIP)
		}
		if f.LocalTunnelIP != nil {
			m.LocalTunnelIP = l.addr(obj, p+"local_tunnel_ip", "local_tunnel_ip", *f.LocalTunnelIP)
		} else if m.RemoteTunnelIP.IsValid() {
			for _, a := range t.Addresses {
				if a.Addr().Is4() == m.RemoteTunnelIP.Is4() {
					m.LocalTunnelIP = a.Addr()
					break
				}
			}
		}
		if f.CmdPort != nil {
			m.CmdPort = l.port(obj, p+"cmd_port", "cmd_port", *f.CmdPort, 0)
		}
		if f.RemoteCmdPort != nil {
			m.RemoteCmdPort = l.port(obj, p+"remote_cmd_port", "remote_cmd_port", *f.RemoteCmdPort, 1)
		}
		if f.AuthType != nil {
			m.AuthType = l.int(obj, p+"auth_type", "auth_type", *f.AuthType)
		}
		if f.AuthKey != nil {
			k, err := hex.DecodeString(*f.AuthKey)
			if err != nil {
				l.fail(obj, p+"auth_key", "auth_key: not hex: %v", err)
			}
			m.AuthKey = string(k)
		}
		pr.MPT = &m
	}
	return pr
}

func (l *loader) addr(obj, path, key, s string) netip.Addr {
	a, err := netip.ParseAddr(s)
	if err != nil {
		l.fail(obj, path, "%s %q: want an IPv4 or IPv6 address", key, s)
	}
	return a
}

// prefixes reads a string or a list of strings.
func (l *loader) prefixes(obj, path, key string, v any) []netip.Prefix {
	var list []any
	switch v := v.(type) {
	case nil:
		return nil
	case string:
		list = []any{v}
	case []any:
		list = v
	default:
		l.fail(obj, path, "%s must be a string or a list of strings, not %s", key, tomlfile.TypeName(v))
		return nil
	}
	out := make([]netip.Prefix, 0, len(list))
	for i, e := range list {
		k, p := key, path
		if _, ok := v.([]any); ok {
			k, p = fmt.Sprintf("%s[%d]", key, i), fmt.Sprintf("%s[%d]", path, i)
		}
		s, ok := e.(string)
		if !ok {
			l.fail(obj, p, "%s must be a string, not %s", k, tomlfile.TypeName(e))
			out = append(out, netip.Prefix{})
			continue
		}
		pf, err := netip.ParsePrefix(s)
		if err != nil {
			l.fail(obj, p, "%s %q: want address/length such as 10.2.0.0/16", k, s)
		}
		out = append(out, pf) // invalid ones too, so that indexes match the file's
	}
	return out
}

// int converts an integer of the file; the range is checked by check.
func (l *loader) int(obj, path, key string, v int64) int {
	if int64(int(v)) != v {
		l.fail(obj, path, "%s %d is out of range", key, v)
		return 0
	}
	return int(v)
}

// port converts a port number; lowest is 0 where 0 means a default, else 1.
func (l *loader) port(obj, path, key string, v, lowest int64) uint16 {
	if v < lowest || v > 65535 {
		l.fail(obj, path, "%s %d outside %d..65535", key, v, lowest)
		return 0
	}
	return uint16(v)
}

// duration sets *d if the key is present and valid, and reports whether it was present.
func (l *loader) duration(obj, path, key string, v any, d *time.Duration) bool {
	if v == nil {
		return false
	}
	if s, ok := l.numberOrString(obj, path, key, v); ok {
		x, err := units.ParseDuration(key, s)
		if err != nil {
			l.fail(obj, path, "%v", err)
			*d = 0
		} else {
			*d = x
		}
	}
	return true
}

// numberOrString returns a TOML string as is and a TOML number in decimal notation, which the
// unit parsers read in the unit a bare number has (milliseconds, bit/s, bytes).
func (l *loader) numberOrString(obj, path, key string, v any) (string, bool) {
	if s, ok := tomlfile.NumberText(v); ok {
		return s, true
	}
	l.fail(obj, path, "%s must be a string or a number, not %s", key, tomlfile.TypeName(v))
	return "", false
}

// objName names an uplink or peer by its name, or by its position from 1 when it has none.
func objName(kind, name string, i int) string {
	if name == "" {
		return fmt.Sprintf("%s %d", kind, i+1)
	}
	return kind + " " + name
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// checker accumulates the issues of check.
type checker struct {
	issues []issue
}

func (c *checker) report(obj, reason string, paths ...string) {
	c.issues = append(c.issues, issue{&Error{Object: obj, Reason: reason}, paths})
}

// check validates t. Its key paths index Uplinks, Peers and Paths as the file's arrays do.
func (t *Tunnel) check(env Env) []issue {
	c := &checker{}
	const obj, p = "tunnel", "tunnel."
	switch t.Mode {
	case ModeBraid:
		if t.Braid == nil {
			c.report(obj, "braid mode needs its settings (Braid is nil)", p+"mode")
		}
	case ModeMPT:
		if t.Braid != nil {
			c.report(obj, "mpt mode has no keys, probes or tunnel-wide reordering (Braid must be nil)", p+"mode")
		}
	default:
		c.report(obj, fmt.Sprintf("mode %q: want braid or mpt", t.Mode), p+"mode")
	}
	if reason := checkIfname(t.Interface); reason != "" {
		c.report(obj, "interface "+reason, p+"interface")
	}
	hasIPv6 := false
	seen := map[netip.Addr]bool{}
	for i, a := range t.Addresses {
		ap := []string{fmt.Sprintf("%saddress[%d]", p, i), p + "address"}
		switch {
		case !a.IsValid():
			c.report(obj, "address: invalid prefix", ap...)
		case seen[a.Addr()]:
			c.report(obj, fmt.Sprintf("address %s: listed twice", a.Addr()), ap...)
		}
		seen[a.Addr()] = true
		hasIPv6 = hasIPv6 || a.Addr().Is6()
	}
	switch {
	case t.MTU == 0:
	case t.MTU < minMTU || t.MTU > maxMTU:
		c.report(obj, fmt.Sprintf("mtu %d outside %d..%d (or 0 to derive it from the paths)", t.MTU, minMTU, maxMTU), p+"mtu")
	case hasIPv6 && t.MTU < minMTUIPv6:
		c.report(obj, fmt.Sprintf("mtu %d is below the IPv6 minimum of %d, and the tunnel has an IPv6 address", t.MTU, minMTUIPv6), p+"mtu")
	}
	if t.Threads < 0 || t.Threads > maxThreads {
		c.report(obj, fmt.Sprintf("threads %d outside 0..%d (0: one while a core suffices, then one per CPU)", t.Threads, maxThreads), p+"threads")
	}
	if t.Port == 0 {
		c.report(obj, "port 0: the uplinks need a default port, such as 4754", p+"port")
	}
	switch t.Scheduler {
	case SchedulerPaced, SchedulerWRR:
	case SchedulerMinRTT, SchedulerBLEST, SchedulerECF, SchedulerRBPM:
		if t.Mode == ModeMPT {
			c.report(obj, fmt.Sprintf("scheduler %s needs RTT measurements, which mpt mode does not make; use wrr or paced", t.Scheduler), p+"scheduler")
		}
	default:
		c.report(obj, fmt.Sprintf("scheduler %q: want paced, wrr, minrtt, blest, ecf or rbpm", t.Scheduler), p+"scheduler")
	}
	if m := t.Metrics; (m.Addr().IsValid() || m.Port() != 0) && (!m.Addr().IsValid() || m.Port() == 0) {
		c.report(obj, fmt.Sprintf("metrics %s: want address:port with a port other than 0", m), p+"metrics")
	}
	if msg := controlProblem(t.Control); msg != "" {
		c.report(obj, msg, p+"control")
	}

	var own session.PublicKey
	if t.Mode == ModeBraid && t.Braid != nil {
		own = c.braid(t.Braid, env)
	}
	uplinks := c.uplinks(t, env)
	c.peers(t, own, uplinks)
	return c.issues
}

// braid checks braid mode's settings and returns our public key, if the private key is known.
func (c *checker) braid(b *BraidSettings, env Env) session.PublicKey {
	const obj, p = "tunnel", "tunnel."
	key := b.PrivateKey
	if key.IsZero() {
		switch {
		case b.PrivateKeyFile == "":
			// private_key first: where LoadTunnel reports a key that does not parse.
			c.report(obj, "missing private_key_file (or private_key): no default key exists; run 'braid keygen'", p+"private_key", p+"private_key_file")
		case env != nil:
			k, err := ReadPrivateKey(env, b.PrivateKeyFile)
			if err != nil {
				c.report(obj, "private_key_file: "+err.Error(), p+"private_key_file")
			}
			key = k
		}
	}
	switch {
	case b.ProbeInterval < time.Millisecond || b.ProbeInterval > time.Minute:
		c.report(obj, fmt.Sprintf("probe_interval %v outside 1ms..1m", b.ProbeInterval), p+"probe_interval")
	case b.DownAfter < 2*b.ProbeInterval:
		c.report(obj, fmt.Sprintf("down_after %v is less than 2 × probe_interval (%v): one late probe would take a path down", b.DownAfter, b.ProbeInterval), p+"down_after", p+"probe_interval")
	}
	if b.Shards < 0 || b.Shards > maxShards {
		c.report(obj, fmt.Sprintf("shards %d outside 0..%d (0: one per CPU)", b.Shards, maxShards), p+"shards")
	}
	r := b.Reorder
	switch {
	case r.MaxPackets < 0:
		c.report(obj, fmt.Sprintf("reorder_max_packets %d is negative", r.MaxPackets), p+"reorder_max_packets")
	case r.MaxPackets < 1 || r.MaxPackets > maxReorderPackets:
		c.report(obj, fmt.Sprintf("reorder_max_packets %d outside 1..%d", r.MaxPackets, maxReorderPackets), p+"reorder_max_packets")
	}
	switch {
	case r.MaxBytes < 0:
		c.report(obj, fmt.Sprintf("reorder_max_bytes %d is negative", r.MaxBytes), p+"reorder_max_bytes")
	case r.MaxBytes == 0:
		c.report(obj, "reorder_max_bytes 0: want at least 1", p+"reorder_max_bytes")
	}
	switch {
	case r.MaxHold < 0:
		c.report(obj, fmt.Sprintf("reorder_max_hold %v is negative", r.MaxHold), p+"reorder_max_hold")
	case r.MaxHold < time.Millisecond || r.MaxHold > 10*time.Second:
		c.report(obj, fmt.Sprintf("reorder_max_hold %v outside 1ms..10s", r.MaxHold), p+"reorder_max_hold")
	}
	if key.IsZero() {
		return session.PublicKey{}
	}
	return key.Public()
}

// uplinks checks the uplinks and returns them by name (first definition).
func (c *checker) uplinks(t *Tunnel, env Env) map[string]*Uplink {
	byName := map[string]*Uplink{}
	sockets := map[netip.AddrPort]string{}
	type followKey struct {
		iface string
		port  uint16
	}
	follows := map[followKey]string{}
	if len(t.Uplinks) == 0 {
		c.report("tunnel", "no uplinks: add a [[tunnel.uplink]] for each local end of the paths", "tunnel.uplink", "tunnel")
	}
	for i := range t.Uplinks {
		u := &t.Uplinks[i]
		obj := objName("uplink", u.Name, i)
		p := fmt.Sprintf("tunnel.uplink[%d]", i)
		c.name(obj, p, u.Name)
		if _, dup := byName[u.Name]; dup && u.Name != "" {
			c.report(obj, fmt.Sprintf("name %q: another uplink has this name", u.Name), p+".name", p)
		} else if u.Name != "" {
			byName[u.Name] = u
		}
		follow := u.Follows() && t.Mode == ModeBraid
		switch reason := checkIfname(u.Interface); {
		case reason != "":
			c.report(obj, "interface "+reason, p+".interface", p)
		case u.Interface == t.Interface:
			c.report(obj, fmt.Sprintf("interface %q is the tunnel's own device: the tunnel would carry itself", u.Interface), p+".interface", p)
		case follow:
			// Its interface may appear after start (a modem plugged in): the tunnel waits.
			s := followKey{u.Interface, u.Socket(t.Port).Port()}
			if other, dup := follows[s]; dup {
				c.report(obj, fmt.Sprintf("interface %s, port %d: also the socket of %s (an uplink without address follows its interface's)", s.iface, s.port, other), p+".interface", p)
			} else {
				follows[s] = obj
			}
		case env != nil && !env.InterfaceExists(u.Interface):
			c.report(obj, fmt.Sprintf("interface %q does not exist on this machine", u.Interface), p+".interface", p)
		}
		if follow {
			// No address: the uplink follows its interface's (docs/tunnel.md, "Uplinks
			// that come and go").
		} else if reason := checkHostAddr(u.Address); reason != "" {
			c.report(obj, "address "+reason, p+".address", p)
		} else if s := u.Socket(t.Port); s.Port() != 0 {
			if other, dup := sockets[s]; dup {
				c.report(obj, fmt.Sprintf("address and port %s: also the socket of %s", s, other), p+".address", p)
			} else {
				sockets[s] = obj
			}
		}
		if u.Weight < 0 || u.Weight > maxWeight {
			c.report(obj, fmt.Sprintf("weight %d outside 0..%d", u.Weight, maxWeight), p+".weight", p)
		}
	}
	return byName
}

// peers checks the peers, their keys, routes and paths.
func (c *checker) peers(t *Tunnel, own session.PublicKey, uplinks map[string]*Uplink) {
	if len(t.Peers) == 0 {
		c.report("tunnel", "no peers: add a [[tunnel.peer]] for each other site", "tunnel.peer", "tunnel")
	}
	names := map[string]bool{}
	keys := map[session.PublicKey]string{}
	type route struct {
		prefix netip.Prefix
		peer   string
	}
	var routes []route
	remotes := map[netip.AddrPort]string{} // -> peer object
	for i := range t.Peers {
		pr := &t.Peers[i]
		obj := objName("peer", pr.Name, i)
		p := fmt.Sprintf("tunnel.peer[%d]", i)
		c.name(obj, p, pr.Name)
		if names[pr.Name] && pr.Name != "" {
			c.report(obj, fmt.Sprintf("name %q: another peer has this name", pr.Name), p+".name", p)
		}
		names[pr.Name] = true

		switch t.Mode {
		case ModeBraid:
			switch other, dup := keys[pr.PublicKey]; {
			case pr.PublicKey.IsZero():
				c.report(obj, "missing public_key: run 'braid keygen --public' on the peer and copy its output here", p+".public_key", p)
			case pr.PublicKey == own:
				c.report(obj, "public_key is this site's own public key", p+".public_key", p)
			case dup:
				c.report(obj, fmt.Sprintf("public_key is also the key of %s: one key identifies one peer", other), p+".public_key", p)
			default:
				keys[pr.PublicKey] = obj
			}
			if pr.MPT != nil {
				c.report(obj, "mpt settings in braid mode (MPT must be nil)", p)
			}
			if pr.Keepalive != 0 && (pr.Keepalive < minKeepalive || pr.Keepalive > maxKeepalive) {
				c.report(obj, fmt.Sprintf("keepalive %v outside %v..%v (NATs keep an idle UDP mapping 30 s to 2 min)", pr.Keepalive, minKeepalive, maxKeepalive), p+".keepalive", p)
			}
			if pr.Learned() && (pr.MaxPaths < 0 || pr.MaxPaths > maxLearnedPaths) || pr.MaxPaths < 0 {
				c.report(obj, fmt.Sprintf("max_paths %d outside 1..%d", pr.MaxPaths, maxLearnedPaths), p+".max_paths", p)
			}
		case ModeMPT:
			if !pr.PublicKey.IsZero() {
				c.report(obj, "public_key is a braid-mode key; mode is \"mpt\" (MPT has no keys)", p+".public_key", p)
			}
			if pr.MPT == nil {
				c.report(obj, "mpt mode needs the peer's mpt settings (MPT is nil)", p)
			} else {
				c.mpt(obj, p, pr.MPT, t.Addresses)
			}
		}

		for j, r := range pr.Routes {
			rp := []string{fmt.Sprintf("%s.routes[%d]", p, j), p + ".routes", p}
			if !r.IsValid() {
				c.report(obj, "routes: invalid prefix", rp...)
				continue
			}
			if r != r.Masked() {
				c.report(obj, fmt.Sprintf("routes: %s has host bits set (did you mean %s?)", r, r.Masked()), rp...)
				continue
			}
			for _, o := range routes {
				if !o.prefix.Overlaps(r) {
					continue
				}
				if o.peer == obj {
					c.report(obj, fmt.Sprintf("routes: %s overlaps %s of the same peer", r, o.prefix), rp...)
				} else {
					c.report(obj, fmt.Sprintf("routes: %s overlaps %s of %s: a packet must have one peer", r, o.prefix, o.peer), rp...)
				}
				break
			}
			routes = append(routes, route{r, obj})
		}

		c.paths(t, obj, p, pr, uplinks, remotes)
	}
}

func (c *checker) paths(t *Tunnel, obj, p string, pr *Peer, uplinks map[string]*Uplink, remotes map[netip.AddrPort]string) {
	if len(pr.Paths) == 0 {
		c.report(obj, "no paths: add a [[tunnel.peer.path]] for each uplink that reaches the peer", p+".path", p)
	}
	limit := maxPathsBraid
	if t.Mode == ModeMPT {
		limit = maxPathsMPT
	}
	if len(pr.Paths) > limit {
		c.report(obj, fmt.Sprintf("%d paths: at most %d in %s mode", len(pr.Paths), limit, t.Mode), fmt.Sprintf("%s.path[%d]", p, limit), p)
	}
	type pathKey struct {
		uplink string
		remote netip.AddrPort
	}
	seen := map[pathKey]int{}
	// In braid mode a peer's paths either all have a remote or none has (learned paths).
	learned := t.Mode == ModeBraid && pr.Learned()
	withRemote := 0
	for _, pp := range pr.Paths {
		if pp.Remote.IsValid() {
			withRemote++
		}
	}
	mixed := t.Mode == ModeBraid && withRemote > 0 && withRemote < len(pr.Paths)
	for j, pp := range pr.Paths {
		pobj := fmt.Sprintf("%s path %d", obj, j+1)
		pk := fmt.Sprintf("%s.path[%d]", p, j)
		u, known := uplinks[pp.Uplink]
		switch {
		case pp.Uplink == "":
			c.report(pobj, "missing uplink: name one of the tunnel's uplinks", pk+".uplink", pk)
		case !known:
			c.report(pobj, fmt.Sprintf("uplink %q: no tunnel.uplink has this name", pp.Uplink), pk+".uplink", pk)
		}
		a := pp.Remote.Addr()
		if learned {
			// One entry per uplink on which the peer's paths are learned.
			k := pathKey{uplink: pp.Uplink}
			if first, dup := seen[k]; dup {
				c.report(pobj, fmt.Sprintf("uplink %s: same as path %d (a peer without remote addresses needs each uplink once)", pp.Uplink, first+1), pk+".uplink", pk)
			} else {
				seen[k] = j
			}
			if pp.Weight < 0 || pp.Weight > maxWeight {
				c.report(pobj, fmt.Sprintf("weight %d outside 0..%d", pp.Weight, maxWeight), pk+".weight", pk)
			}
			continue
		}
		if mixed && !pp.Remote.IsValid() {
			c.report(pobj, fmt.Sprintf("missing remote, and %d other paths of the peer have one: give every path a remote, or none (paths learned from the peer's packets)", withRemote), pk+".remote", pk)
			continue
		}
		switch reason := checkHostAddr(a); {
		case reason != "":
			c.report(pobj, "remote "+reason, pk+".remote", pk)
		case pp.Remote.Port() == 0:
			c.report(pobj, fmt.Sprintf("remote %s: port 0; want the peer's port, such as %s", pp.Remote, netip.AddrPortFrom(a, DefaultTunnelPort)), pk+".remote", pk)
		case known && u.Address.IsValid() && u.Address.Is4() != a.Is4():
			c.report(pobj, fmt.Sprintf("remote %s is %s but uplink %s has %s address %s", pp.Remote, family(a), u.Name, family(u.Address), u.Address), pk+".remote", pk)
		default:
			if other, dup := remotes[pp.Remote]; dup && other != obj {
				c.report(pobj, fmt.Sprintf("remote %s is also an address of %s: one address belongs to one peer", pp.Remote, other), pk+".remote", pk)
			} else {
				remotes[pp.Remote] = obj
			}
			k := pathKey{pp.Uplink, pp.Remote}
			if first, dup := seen[k]; dup {
				c.report(pobj, fmt.Sprintf("remote %s from uplink %s: same as path %d", pp.Remote, pp.Uplink, first+1), pk+".remote", pk)
			} else {
				seen[k] = j
			}
		}
		if pp.Weight < 0 || pp.Weight > maxWeight {
			c.report(pobj, fmt.Sprintf("weight %d outside 0..%d", pp.Weight, maxWeight), pk+".weight", pk)
		}
	}
}

func (c *checker) mpt(obj, p string, m *MPTSettings, addrs []netip.Prefix) {
	switch {
	case m.ReorderWindow < 0:
		c.report(obj, fmt.Sprintf("reorder_window %d is negative", m.ReorderWindow), p+".reorder_window", p)
	case m.ReorderWindow > maxReorderWindow:
		c.report(obj, fmt.Sprintf("reorder_window %d outside 0..%d", m.ReorderWindow, maxReorderWindow), p+".reorder_window", p)
	}
	if m.MaxBuffDelay < time.Millisecond || m.MaxBuffDelay > 10*time.Second {
		c.report(obj, fmt.Sprintf("max_buffdelay %v outside 1ms..10s", m.MaxBuffDelay), p+".max_buffdelay", p)
	}
	switch {
	case m.Keepalive < 0:
		c.report(obj, fmt.Sprintf("keepalive %v is negative", m.Keepalive), p+".keepalive", p)
	case m.Keepalive == 0 && m.DeadTime != 0:
		c.report(obj, fmt.Sprintf("dead_time %v without keepalives: no path could ever come back", m.DeadTime), p+".dead_time", p+".keepalive", p)
	case m.Keepalive != 0 && m.DeadTime < 2*m.Keepalive:
		c.report(obj, fmt.Sprintf("dead_time %v is less than 2 × keepalive (%v): one late keepalive would take a path down", m.DeadTime, m.Keepalive), p+".dead_time", p+".keepalive", p)
	}
	switch {
	case m.AuthType < 0 || m.AuthType > 2:
		c.report(obj, fmt.Sprintf("auth_type %d: MPT knows 0 (none), 1 (random token) and 2 (SHA-256)", m.AuthType), p+".auth_type", p)
	case m.AuthType == 2 && len(m.AuthKey) == 0:
		c.report(obj, "auth_type 2 needs auth_key (hex)", p+".auth_key", p)
	}
	if m.CmdPort == 0 && (m.AuthType != 0 || len(m.AuthKey) > 0) {
		c.report(obj, "auth_type and auth_key are for the command port, and cmd_port is 0 (none)", p+".cmd_port", p)
	}
	rem, loc := m.RemoteTunnelIP, m.LocalTunnelIP
	if !rem.IsValid() {
		c.report(obj, "missing remote_tunnel_ip: the peer's tunnel address, carried in keepalives", p+".remote_tunnel_ip", p)
	} else if rem.Is4In6() || rem.Zone() != "" {
		c.report(obj, fmt.Sprintf("remote_tunnel_ip %s: write IPv4 addresses plainly, without a zone", rem), p+".remote_tunnel_ip", p)
	}
	switch {
	case !loc.IsValid() && !rem.IsValid():
		// LoadTunnel's default for local_tunnel_ip follows remote_tunnel_ip, reported above.
	case !loc.IsValid():
		c.report(obj, "missing local_tunnel_ip, and tunnel.address has no address of remote_tunnel_ip's family", p+".local_tunnel_ip", p)
	case loc.Is4In6() || loc.Zone() != "":
		c.report(obj, fmt.Sprintf("local_tunnel_ip %s: write IPv4 addresses plainly, without a zone", loc), p+".local_tunnel_ip", p)
	case rem.IsValid() && loc.Is4() != rem.Is4():
		c.report(obj, fmt.Sprintf("local_tunnel_ip %s and remote_tunnel_ip %s are of different families", loc, rem), p+".local_tunnel_ip", p)
	case loc == rem:
		c.report(obj, fmt.Sprintf("remote_tunnel_ip %s is also local_tunnel_ip", rem), p+".remote_tunnel_ip", p)
	case len(addrs) > 0 && !slices.ContainsFunc(addrs, func(a netip.Prefix) bool { return a.Addr() == loc }):
		c.report(obj, fmt.Sprintf("local_tunnel_ip %s is not one of tunnel.address", loc), p+".local_tunnel_ip", p)
	}
}

// name checks the name of an uplink or a peer.
func (c *checker) name(obj, p, name string) {
	switch {
	case name == "":
		c.report(obj, "missing name", p+".name", p)
	case len(name) > maxName || !nameRE.MatchString(name):
		c.report(obj, fmt.Sprintf("name %q: want at most %d letters, digits, '.', '_' or '-', starting with a letter or digit", name, maxName), p+".name", p)
	}
}

// checkIfname returns why name cannot be a network interface name, or "".
func checkIfname(name string) string {
	switch {
	case name == "":
		return "is missing"
	case len(name) > maxIfname:
		return fmt.Sprintf("%q is longer than %d characters", name, maxIfname)
	case name == "." || name == ".." || strings.ContainsAny(name, "/:% \t\n\r\v\f\x00"):
		// The kernel's dev_valid_name refuses these; '%' would make it choose the name.
		return fmt.Sprintf("%q is not a valid interface name", name)
	}
	return ""
}

// checkHostAddr returns why a cannot be the address of one end of a path, or "".
func checkHostAddr(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "is missing"
	case a.Is4In6():
		return fmt.Sprintf("%s: write IPv4 addresses as such (%s)", a, a.Unmap())
	case a.Zone() != "":
		return fmt.Sprintf("%s: zones are not supported", a)
	case a.IsUnspecified() || a.IsMulticast():
		return fmt.Sprintf("%s: want a unicast address", a)
	}
	return ""
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}
