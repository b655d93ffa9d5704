package config

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"braid/internal/config/tomlfile"
)

// The [mapserver] and [xtr] sections of the site file (docs/lisp.md has a full example):
//
//	[mapserver]
//	roles = ["map-server", "map-resolver"] # either or both (default both)
//	listen = "0.0.0.0:4342"     # UDP address of the control plane (default 0.0.0.0:4342)
//	forward = ["10.0.9.2:4342"] # a map-resolver alone forwards Map-Requests to these
//	registration_timeout = "3m" # a registration not refreshed for this long is dropped
//	negative_ttl = 15           # minutes, negative replies for space no site holds
//	unregistered_ttl = 1        # minutes, negative replies for a site that is not registered
//	rate_per_source = 1000      # messages per second from one address; 0 = no limit
//	burst_per_source = 1000
//	rate_per_destination = 100  # Map-Replies per second to one address; 0 = no limit
//	burst_per_destination = 200
//	max_amplification = 3       # a reply is at most this many times its request; 0 = no bound
//	metrics = "127.0.0.1:9474"  # status and Prometheus endpoint; "" disables it
//	control = "@braid/mapserver" # control socket ('braid mapserver reload'); "" disables it
//	  [[mapserver.site]]
//	  name = "site1"
//	  key = "secret"            # the site's shared key (key ID key_id, default 0), at least
//	                            # 16 bytes; or key_file = "site1.key" (relative to this file)
//	  key_id = 0
//	  eid_prefixes = ["192.168.1.0/24", "fd00:1::/64"]
//	  proxy_reply = false       # answer for the site even when its registrations do not ask
//	  replay = "timestamp"      # nonces carry the time of sending (braid xtr); "window" for
//	                            # xTRs with random nonces: replays refused for ten minutes only
//
//	[xtr]
//	interface = "lisp0"         # TUN device (default lisp0)
//	mtu = 0                     # 0: 1500 less the outer headers (36 bytes IPv4, 56 IPv6)
//	eid_prefixes = ["192.168.1.0/24"] # the site's EIDs
//	routes = ["192.168.0.0/16"] # EID space routed into the device (default: none)
//	map_resolvers = ["10.0.9.1:4342", "10.0.9.5:4342"] # asked in this order; a silent one is skipped
//	resolver_timeout = "300ms"  # with several resolvers: a request unanswered this long goes to
//	                            # the next one (at most request_timeout)
//	resolver_backoff = "30s"    # a silent resolver rests 1 s, doubling per miss up to this
//	probe_interval = "1s"       # RLOC-probe every pair in use this often
//	down_after = "3s"           # a pair without probe replies for this long is not used
//	register_interval = "1m"
//	register_ttl = 10           # minutes, the TTL other sites cache our mapping for
//	request_timeout = "1s"      # Map-Request retry timeout
//	request_retries = 3
//	placement = false           # A-MPTCP placement of TCP flows on RLOC pairs
//	any_outer_source = false    # true: the ETR takes packets from any outer source (not only
//	                            # from a locator of the mapping of the inner source)
//	metrics = "127.0.0.1:9477"
//	control = "@braid/xtr"      # control socket ('braid xtr reload'); "" disables it
//	  [[xtr.rloc]]
//	  address = "10.0.1.1"
//	  interface = "wan1"        # optional: packets of this RLOC leave through it
//	  priority = 1              # lower is preferred; 255 = never for unicast
//	  weight = 50
//	  [[xtr.map_server]]       # one per map server: the site registers with every one
//	  address = "10.0.9.1:4342"
//	  key = "secret"            # at least 16 bytes; or key_file = "..."
//	  key_id = 0
//	  algorithm = "hmac-sha256" # hmac-sha256 (default, RFC 9301's mandatory one) or hmac-sha1
//	                            # (what some deployed map servers accept only)
//	  auth_length = 0           # digest bytes sent: 0 = the full digest (20 or 32), or the
//	                            # truncated 12 (sha1) or 16 (sha256)
//	  proxy_reply = false       # ask the map server to answer for this site

// MaxLispResolvers is the largest number of map_resolvers an xTR takes.
const MaxLispResolvers = 64

// Mapserver is the configuration of `braid mapserver`.
type Mapserver struct {
	KeyFiles               []string // the sites' key_file values, as opened (KeyFileWarnings)
	MapServer, MapResolver bool
	Listen                 netip.AddrPort
	Forward                []netip.AddrPort
	RegistrationTimeout    time.Duration
	NegativeTTL            uint32
	UnregisteredTTL        uint32
	RatePerSource          float64
	BurstPerSource         int
	RatePerDestination     float64
	BurstPerDestination    int
	MaxAmplification       float64
	Metrics                string
	Control                string // control socket ('braid mapserver reload'); "" for none
	Sites                  []LispSite
}

// LispSite is a site a map server serves.
type LispSite struct {
	Name       string
	Key        string
	KeyID      uint8
	Prefixes   []netip.Prefix
	ProxyReply bool
	// Replay is "timestamp" (default: registration nonces must be the time of sending, within
	// ten minutes of the map server's clock) or "window" (any nonce, remembered ten minutes).
	Replay string
}

// MapserverDefaults returns both roles on 0.0.0.0:4342, without sites.
func MapserverDefaults() Mapserver {
	return Mapserver{MapServer: true, MapResolver: true, Listen: netip.MustParseAddrPort("0.0.0.0:4342"),
		RegistrationTimeout: 3 * time.Minute, NegativeTTL: 15, UnregisteredTTL: 1, RatePerSource: 1000,
		BurstPerSource: 1000, RatePerDestination: 100, BurstPerDestination: 200, MaxAmplification: 3,
		Metrics: DefaultMapserverMetrics, Control: DefaultMapserverControl}
}

// XTR is the configuration of `braid xtr`.
type XTR struct {
	KeyFiles         []string // the map servers' key_file values, as opened (KeyFileWarnings)
	Interface        string
	MTU              int
	EIDs             []netip.Prefix
	Routes           []netip.Prefix
	Resolvers        []netip.AddrPort
	ProbeInterval    time.Duration
	DownAfter        time.Duration
	RegisterInterval time.Duration
	RegisterTTL      uint32
	RequestTimeout   time.Duration
	RequestRetries   int
	ResolverTimeout  time.Duration
	ResolverBackoff  time.Duration
	Placement        bool
	AnyOuterSource   bool
	Metrics          string
	Control          string // control socket ('braid xtr reload'); "" for none
	RLOCs            []RLOC
	MapServers       []LispMapServer
}

// RLOC is one of the xTR's locators.
type RLOC struct {
	Address   netip.Addr
	Interface string
	Priority  uint8
	Weight    uint8
}

// LispMapServer is a map server an xTR registers with.
type LispMapServer struct {
	Address    netip.AddrPort
	Key        string
	KeyID      uint8
	Algorithm  string // hmac-sha1 or hmac-sha256
	AuthLength int
	ProxyReply bool
}

// XTRDefaults returns the defaults, without EIDs, RLOCs or map servers.
func XTRDefaults() XTR {
	return XTR{Interface: "lisp0", ProbeInterval: time.Second, DownAfter: 3 * time.Second, RegisterInterval: time.Minute,
		RegisterTTL: 10, RequestTimeout: time.Second, RequestRetries: 3, ResolverTimeout: 300 * time.Millisecond,
		ResolverBackoff: 30 * time.Second, Metrics: DefaultXTRMetrics, Control: DefaultXTRControl}
}

type lispSite struct {
	Tunnel    map[string]any `toml:"tunnel"`
	Proxy     map[string]any `toml:"proxy"`
	LB        map[string]any `toml:"lb"`
	PM        map[string]any `toml:"pm"`
	Mapserver *fileMapserver `toml:"mapserver"`
	XTR       *fileXTR       `toml:"xtr"`
}

type fileMapserver struct {
	Roles               []string       `toml:"roles"`
	Listen              *string        `toml:"listen"`
	Forward             []string       `toml:"forward"`
	RegistrationTimeout any            `toml:"registration_timeout"`
	NegativeTTL         *int64         `toml:"negative_ttl"`
	UnregisteredTTL     *int64         `toml:"unregistered_ttl"`
	RatePerSource       *float64       `toml:"rate_per_source"`
	BurstPerSource      *int64         `toml:"burst_per_source"`
	RatePerDest         *float64       `toml:"rate_per_destination"`
	BurstPerDest        *int64         `toml:"burst_per_destination"`
	MaxAmplification    *float64       `toml:"max_amplification"`
	Metrics             *string        `toml:"metrics"`
	Control             *string        `toml:"control"`
	Site                []fileLispSite `toml:"site"`
}

type fileLispSite struct {
	Name        string  `toml:"name"`
	Key         string  `toml:"key"`
	KeyFile     string  `toml:"key_file"`
	KeyID       *int64  `toml:"key_id"`
	EIDPrefixes any     `toml:"eid_prefixes"`
	ProxyReply  bool    `toml:"proxy_reply"`
	Replay      *string `toml:"replay"`
}

type fileXTR struct {
	Interface        *string         `toml:"interface"`
	MTU              *int64          `toml:"mtu"`
	EIDPrefixes      any             `toml:"eid_prefixes"`
	Routes           any             `toml:"routes"`
	MapResolvers     []string        `toml:"map_resolvers"`
	ProbeInterval    any             `toml:"probe_interval"`
	DownAfter        any             `toml:"down_after"`
	RegisterInterval any             `toml:"register_interval"`
	RegisterTTL      *int64          `toml:"register_ttl"`
	RequestTimeout   any             `toml:"request_timeout"`
	RequestRetries   *int64          `toml:"request_retries"`
	ResolverTimeout  any             `toml:"resolver_timeout"`
	ResolverBackoff  any             `toml:"resolver_backoff"`
	Placement        *bool           `toml:"placement"`
	AnyOuterSource   bool            `toml:"any_outer_source"`
	Metrics          *string         `toml:"metrics"`
	Control          *string         `toml:"control"`
	RLOC             []fileRLOC      `toml:"rloc"`
	MapServer        []fileMapServer `toml:"map_server"`
}

type fileRLOC struct {
	Address   string `toml:"address"`
	Interface string `toml:"interface"`
	Priority  *int64 `toml:"priority"`
	Weight    *int64 `toml:"weight"`
}

type fileMapServer struct {
	Address    string  `toml:"address"`
	Key        string  `toml:"key"`
	KeyFile    string  `toml:"key_file"`
	KeyID      *int64  `toml:"key_id"`
	Algorithm  *string `toml:"algorithm"`
	AuthLength *int64  `toml:"auth_length"`
	ProxyReply bool    `toml:"proxy_reply"`
}

func (l *loader) addrPort(obj, path, key, s string) netip.AddrPort {
	a, err := netip.ParseAddrPort(s)
	if err != nil {
		l.fail(obj, path, "%s %q: want address:port, such as 10.0.9.1:4342 or [2001:db8::1]:4342", key, s)
	}
	return a
}

func (l *loader) byteRange(obj, path, key string, v *int64, lo, hi int64, d *uint8) {
	if v == nil {
		return
	}
	if *v < lo || *v > hi {
		l.fail(obj, path, "%s %d outside %d..%d", key, *v, lo, hi)
		return
	}
	*d = uint8(*v)
}

// finish sorts the issues by line and returns them joined, or nil.
func finish(filename string, ix *tomlfile.Index, issues []issue) error {
	if len(issues) == 0 {
		return nil
	}
	for _, is := range issues {
		is.err.File = filename
		is.err.Line = ix.Line(is.paths...)
	}
	slices.SortStableFunc(issues, func(a, b issue) int { return cmp.Compare(a.err.Line, b.err.Line) })
	return joinIssues(issues)
}

// MinLispKey is the shortest LISP authentication key taken, in bytes: shorter shared secrets
// can be guessed offline from one captured Map-Register.
const MinLispKey = 16

// lispKey returns the key of key = "..." or of the file key_file names (relative to the site
// file's directory; one trailing newline is not part of the key), and checks its length.
func (l *loader) lispKey(filename, obj, path, key, keyFile string) string {
	switch {
	case key != "" && keyFile != "":
		l.fail(obj, path+".key_file", "key and key_file are both set: use one")
		return key
	case keyFile != "":
		f := keyFile
		if !filepath.IsAbs(f) {
			f = filepath.Join(filepath.Dir(filename), f)
		}
		l.keyFiles = append(l.keyFiles, f)
		b, err := os.ReadFile(f)
		if err != nil {
			l.fail(obj, path+".key_file", "key_file: %v", err)
			return ""
		}
		key = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if len(key) < MinLispKey {
			l.fail(obj, path+".key_file", "the key in %s is %d bytes: at least %d (for example: head -c 24 /dev/urandom | base64 > %s)", keyFile, len(key), MinLispKey, keyFile)
		}
		return key
	case key == "":
		l.fail(obj, path+".key", "key or key_file is required: registrations are authenticated with it")
	case len(key) < MinLispKey:
		l.fail(obj, path+".key", "key is %d bytes: at least %d (for example the output of: head -c 24 /dev/urandom | base64)", len(key), MinLispKey)
	}
	return key
}

// LoadMapserver reads the [mapserver] section of the site file data (named filename in errors)
// and reports every problem with its line.
func LoadMapserver(filename string, data []byte) (*Mapserver, error) {
	var f lispSite
	ix, err := tomlfile.Decode(filename, data, &f)
	if err != nil {
		return nil, err
	}
	if f.Mapserver == nil {
		return nil, &Error{File: filename, Reason: "no [mapserver] section"}
	}
	fm := f.Mapserver
	l := &loader{}
	m := MapserverDefaults()
	const obj = "mapserver"
	if fm.Roles != nil {
		m.MapServer, m.MapResolver = false, false
		for _, r := range fm.Roles {
			switch r {
			case "map-server":
				m.MapServer = true
			case "map-resolver":
				m.MapResolver = true
			default:
				l.fail(obj, "mapserver.roles", "role %q: want map-server or map-resolver", r)
			}
		}
		if !m.MapServer && !m.MapResolver {
			l.fail(obj, "mapserver.roles", "roles is empty: want map-server, map-resolver or both")
		}
	}
	if fm.Listen != nil {
		m.Listen = l.addrPort(obj, "mapserver.listen", "listen", *fm.Listen)
	}
	for i, s := range fm.Forward {
		m.Forward = append(m.Forward, l.addrPort(obj, fmt.Sprintf("mapserver.forward[%d]", i), "forward", s))
	}
	if !m.MapServer && m.MapResolver && len(fm.Forward) == 0 {
		l.fail(obj, "mapserver.roles", "a map-resolver without the map-server role needs forward = [map servers]")
	}
	l.duration(obj, "mapserver.registration_timeout", "registration_timeout", fm.RegistrationTimeout, &m.RegistrationTimeout)
	if m.RegistrationTimeout < time.Second {
		l.fail(obj, "mapserver.registration_timeout", "registration_timeout %v: at least 1s", m.RegistrationTimeout)
	}
	for _, t := range []struct {
		key string
		v   *int64
		d   *uint32
	}{{"negative_ttl", fm.NegativeTTL, &m.NegativeTTL}, {"unregistered_ttl", fm.UnregisteredTTL, &m.UnregisteredTTL}} {
		if t.v != nil {
			if *t.v < 0 || *t.v > 0xffffffff {
				l.fail(obj, "mapserver."+t.key, "%s %d: minutes, 0..4294967295", t.key, *t.v)
			} else {
				*t.d = uint32(*t.v)
			}
		}
	}
	if fm.RatePerSource != nil {
		if *fm.RatePerSource < 0 {
			l.fail(obj, "mapserver.rate_per_source", "rate_per_source %g is negative", *fm.RatePerSource)
		}
		m.RatePerSource = *fm.RatePerSource
	}
	if fm.BurstPerSource != nil {
		if *fm.BurstPerSource < 1 || *fm.BurstPerSource > 1<<20 {
			l.fail(obj, "mapserver.burst_per_source", "burst_per_source %d outside 1..1048576", *fm.BurstPerSource)
		}
		m.BurstPerSource = int(*fm.BurstPerSource)
	}
	if fm.RatePerDest != nil {
		if *fm.RatePerDest < 0 {
			l.fail(obj, "mapserver.rate_per_destination", "rate_per_destination %g is negative", *fm.RatePerDest)
		}
		m.RatePerDestination = *fm.RatePerDest
	}
	if fm.BurstPerDest != nil {
		if *fm.BurstPerDest < 1 || *fm.BurstPerDest > 1<<20 {
			l.fail(obj, "mapserver.burst_per_destination", "burst_per_destination %d outside 1..1048576", *fm.BurstPerDest)
		}
		m.BurstPerDestination = int(*fm.BurstPerDest)
	}
	if fm.MaxAmplification != nil {
		if a := *fm.MaxAmplification; a != 0 && a < 1 {
			l.fail(obj, "mapserver.max_amplification", "max_amplification %g: at least 1 (a reply as long as its request), or 0 for no bound", a)
		}
		m.MaxAmplification = *fm.MaxAmplification
	}
	if fm.Metrics != nil {
		m.Metrics = *fm.Metrics
		if m.Metrics != "" {
			l.addrPort(obj, "mapserver.metrics", "metrics", m.Metrics)
		}
	}
	if fm.Control != nil {
		m.Control = *fm.Control
		if msg := controlProblem(m.Control); msg != "" {
			l.fail(obj, "mapserver.control", "%s", msg)
		}
	}
	owner := map[netip.Prefix]string{}
	names := map[string]bool{}
	for i, fs := range fm.Site {
		p := fmt.Sprintf("mapserver.site[%d]", i)
		so := objName("site", fs.Name, i)
		s := LispSite{Name: fs.Name, Key: fs.Key, ProxyReply: fs.ProxyReply, Replay: "timestamp"}
		if fs.Replay != nil {
			s.Replay = *fs.Replay
			if s.Replay != "timestamp" && s.Replay != "window" {
				l.fail(so, p+".replay", "replay %q: want \"timestamp\" (registration nonces carry the time, as braid xtr sends) or \"window\" (random nonces, replays refused for ten minutes only)", s.Replay)
			}
		}
		if !nameRE.MatchString(fs.Name) || len(fs.Name) > maxName {
			l.fail(so, p+".name", "name %q: letters, digits, '.', '_', '-', at most %d", fs.Name, maxName)
		}
		if names[fs.Name] {
			l.fail(so, p+".name", "name %q is used by another site", fs.Name)
		}
		names[fs.Name] = true
		s.Key = l.lispKey(filename, so, p, fs.Key, fs.KeyFile)
		l.byteRange(so, p+".key_id", "key_id", fs.KeyID, 0, 255, &s.KeyID)
		s.Prefixes = l.prefixes(so, p+".eid_prefixes", "eid_prefixes", fs.EIDPrefixes)
		if len(s.Prefixes) == 0 {
			l.fail(so, p+".eid_prefixes", "eid_prefixes is required")
		}
		for _, pf := range s.Prefixes {
			if pf.IsValid() && pf != pf.Masked() {
				l.fail(so, p+".eid_prefixes", "%v has host bits set (did you mean %v?)", pf, pf.Masked())
			}
			if o, ok := owner[pf.Masked()]; ok && pf.IsValid() {
				l.fail(so, p+".eid_prefixes", "%v is also configured for site %s", pf, o)
			}
			owner[pf.Masked()] = fs.Name
		}
		m.Sites = append(m.Sites, s)
	}
	if m.MapServer && len(m.Sites) == 0 {
		l.fail(obj, "mapserver", "the map-server role needs at least one [[mapserver.site]]")
	}
	if err := finish(filename, ix, l.issues); err != nil {
		return nil, err
	}
	m.KeyFiles = l.keyFiles
	return &m, nil
}

// LoadXTR reads the [xtr] section of the site file data (named filename in errors) and reports
// every problem with its line. env says whether the RLOCs' interfaces exist (nil: not checked).
func LoadXTR(filename string, data []byte, env Env) (*XTR, error) {
	var f lispSite
	ix, err := tomlfile.Decode(filename, data, &f)
	if err != nil {
		return nil, err
	}
	if f.XTR == nil {
		return nil, &Error{File: filename, Reason: "no [xtr] section"}
	}
	fx := f.XTR
	l := &loader{env: env}
	x := XTRDefaults()
	const obj = "xtr"
	if fx.Interface != nil {
		x.Interface = *fx.Interface
		if reason := checkIfname(x.Interface); reason != "" {
			l.fail(obj, "xtr.interface", "interface %s", reason)
		}
	}
	if fx.MTU != nil {
		if *fx.MTU != 0 && (*fx.MTU < minMTU || *fx.MTU > maxMTU) {
			l.fail(obj, "xtr.mtu", "mtu %d outside %d..%d (or 0 to derive it)", *fx.MTU, minMTU, maxMTU)
		}
		x.MTU = int(*fx.MTU)
	}
	x.EIDs = l.prefixes(obj, "xtr.eid_prefixes", "eid_prefixes", fx.EIDPrefixes)
	if len(x.EIDs) == 0 {
		l.fail(obj, "xtr.eid_prefixes", "eid_prefixes is required: the site's EID prefixes")
	}
	x.Routes = l.prefixes(obj, "xtr.routes", "routes", fx.Routes)
	for i, s := range fx.MapResolvers {
		p := fmt.Sprintf("xtr.map_resolvers[%d]", i)
		a := l.addrPort(obj, p, "map_resolvers", s)
		if a.IsValid() && slices.Contains(x.Resolvers, a) {
			l.fail(obj, p, "map_resolvers lists %v twice", a)
		}
		x.Resolvers = append(x.Resolvers, a)
	}
	if len(fx.MapResolvers) == 0 {
		l.fail(obj, "xtr.map_resolvers", "map_resolvers is required")
	}
	if len(fx.MapResolvers) > MaxLispResolvers {
		l.fail(obj, "xtr.map_resolvers", "%d map_resolvers: at most %d", len(fx.MapResolvers), MaxLispResolvers)
	}
	l.duration(obj, "xtr.probe_interval", "probe_interval", fx.ProbeInterval, &x.ProbeInterval)
	if !l.duration(obj, "xtr.down_after", "down_after", fx.DownAfter, &x.DownAfter) {
		x.DownAfter = 3 * x.ProbeInterval
	}
	l.duration(obj, "xtr.register_interval", "register_interval", fx.RegisterInterval, &x.RegisterInterval)
	l.duration(obj, "xtr.request_timeout", "request_timeout", fx.RequestTimeout, &x.RequestTimeout)
	rtSet := l.duration(obj, "xtr.resolver_timeout", "resolver_timeout", fx.ResolverTimeout, &x.ResolverTimeout)
	l.duration(obj, "xtr.resolver_backoff", "resolver_backoff", fx.ResolverBackoff, &x.ResolverBackoff)
	switch {
	case x.ResolverTimeout > x.RequestTimeout && rtSet:
		l.fail(obj, "xtr.resolver_timeout", "resolver_timeout %v: at most request_timeout (%v)", x.ResolverTimeout, x.RequestTimeout)
	case x.ResolverTimeout > x.RequestTimeout:
		x.ResolverTimeout = x.RequestTimeout
	}
	if x.ResolverBackoff < time.Second {
		l.fail(obj, "xtr.resolver_backoff", "resolver_backoff %v: at least 1s (a silent resolver's first rest)", x.ResolverBackoff)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
		lo  time.Duration
	}{{"probe_interval", x.ProbeInterval, 10 * time.Millisecond}, {"register_interval", x.RegisterInterval, time.Second},
		{"request_timeout", x.RequestTimeout, 10 * time.Millisecond},
		{"resolver_timeout", x.ResolverTimeout, 10 * time.Millisecond}} {
		if d.v < d.lo {
			l.fail(obj, "xtr."+d.key, "%s %v: at least %v", d.key, d.v, d.lo)
		}
	}
	if x.DownAfter < 2*x.ProbeInterval {
		l.fail(obj, "xtr.down_after", "down_after %v: at least 2 × probe_interval = %v", x.DownAfter, 2*x.ProbeInterval)
	}
	if fx.RegisterTTL != nil {
		if *fx.RegisterTTL < 1 || *fx.RegisterTTL > 0xffffffff {
			l.fail(obj, "xtr.register_ttl", "register_ttl %d: minutes, at least 1", *fx.RegisterTTL)
		} else {
			x.RegisterTTL = uint32(*fx.RegisterTTL)
		}
	}
	if fx.RequestRetries != nil {
		if *fx.RequestRetries < 0 || *fx.RequestRetries > 100 {
			l.fail(obj, "xtr.request_retries", "request_retries %d outside 0..100", *fx.RequestRetries)
		} else {
			x.RequestRetries = int(*fx.RequestRetries)
		}
	}
	if fx.Placement != nil {
		x.Placement = *fx.Placement
	}
	x.AnyOuterSource = fx.AnyOuterSource
	if fx.Metrics != nil {
		x.Metrics = *fx.Metrics
		if x.Metrics != "" {
			l.addrPort(obj, "xtr.metrics", "metrics", x.Metrics)
		}
	}
	if fx.Control != nil {
		x.Control = *fx.Control
		if msg := controlProblem(x.Control); msg != "" {
			l.fail(obj, "xtr.control", "%s", msg)
		}
	}
	seen := map[netip.Addr]bool{}
	usable := false
	for i, fr := range fx.RLOC {
		p := fmt.Sprintf("xtr.rloc[%d]", i)
		ro := fmt.Sprintf("rloc %d", i+1)
		r := RLOC{Address: l.addr(ro, p+".address", "address", fr.Address), Interface: fr.Interface, Priority: 1, Weight: 1}
		if seen[r.Address] {
			l.fail(ro, p+".address", "address %v is listed twice", r.Address)
		}
		seen[r.Address] = true
		l.byteRange(ro, p+".priority", "priority", fr.Priority, 0, 255, &r.Priority)
		l.byteRange(ro, p+".weight", "weight", fr.Weight, 0, 255, &r.Weight)
		if r.Priority != 255 {
			usable = true
		}
		if fr.Interface != "" && env != nil && !env.InterfaceExists(fr.Interface) {
			l.fail(ro, p+".interface", "interface %q does not exist on this machine", fr.Interface)
		}
		x.RLOCs = append(x.RLOCs, r)
	}
	if len(fx.RLOC) == 0 {
		l.fail(obj, "xtr", "at least one [[xtr.rloc]] is required")
	} else if !usable {
		l.fail(obj, "xtr.rloc", "every RLOC has priority 255 (not for unicast)")
	}
	msSeen := map[netip.AddrPort]bool{}
	for i, fm := range fx.MapServer {
		p := fmt.Sprintf("xtr.map_server[%d]", i)
		mo := fmt.Sprintf("map_server %d", i+1)
		ms := LispMapServer{Address: l.addrPort(mo, p+".address", "address", fm.Address), Algorithm: "hmac-sha256", ProxyReply: fm.ProxyReply}
		if ms.Address.IsValid() && msSeen[ms.Address] {
			l.fail(mo, p+".address", "map server %v is listed twice", ms.Address)
		}
		msSeen[ms.Address] = true
		ms.Key = l.lispKey(filename, mo, p, fm.Key, fm.KeyFile)
		l.byteRange(mo, p+".key_id", "key_id", fm.KeyID, 0, 255, &ms.KeyID)
		if fm.Algorithm != nil {
			ms.Algorithm = *fm.Algorithm
		}
		allowed := map[string][]int{"hmac-sha1": {0, 20, 12}, "hmac-sha256": {0, 32, 16}}
		lens, ok := allowed[ms.Algorithm]
		if !ok {
			l.fail(mo, p+".algorithm", "algorithm %q: want hmac-sha1 or hmac-sha256", ms.Algorithm)
		}
		if fm.AuthLength != nil {
			ms.AuthLength = int(*fm.AuthLength)
			if ok && !slices.Contains(lens, ms.AuthLength) {
				l.fail(mo, p+".auth_length", "auth_length %d: %s sends %d (full) or %d (truncated), or 0 for the full digest", ms.AuthLength, ms.Algorithm, lens[1], lens[2])
			}
		}
		x.MapServers = append(x.MapServers, ms)
	}
	if err := finish(filename, ix, l.issues); err != nil {
		return nil, err
	}
	x.KeyFiles = l.keyFiles
	return &x, nil
}
