package config

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"braid/internal/config/tomlfile"
	"braid/internal/proxy/ident"
)

// The [proxy] section of the site file (docs/proxy.md has a full two-site example):
//
//	[proxy]
//	mode = "tproxy"             # interception: tproxy (default; the original destination is
//	                            # the socket's own address, no NAT), redirect (NAT and
//	                            # SO_ORIGINAL_DST), or socks (no interception: SOCKS5 only)
//	private_key_file = "proxy.key" # Ed25519 key from 'braid proxy keygen --out'; relative to
//	                            # the site file's directory. Or private_key = "<base64>".
//	plaintext = false           # true: proxies talk without TLS (only on links protected
//	                            # below, e.g. by IPsec); then no key is needed
//	path_manager = "braid"      # braid: subflows over every uplink to every peer address,
//	                            # ADD_ADDR of our other uplinks, dead paths replaced (the
//	                            # kernel's userspace PM, driven in process); kernel: endpoints
//	                            # for the kernel's own PM; none: one subflow
//	pm_policy = "fullmesh"      # the braid path manager's policy, the code of 'braid pm
//	                            # --policy': fullmesh (default; every subflow active) or
//	                            # rbpm (also demotes to backup the subflows whose data would
//	                            # wait in the peer's buffer; see docs/proxy.md)
//	pm_join_timeout = "1s"      # braid path manager: a subflow join not up within this is
//	                            # given up and tried again (with a fresh port)
//	pm_join_backoff_max = "30s" # an uplink and peer address that have never carried a
//	                            # subflow on a connection are tried at growing intervals,
//	                            # at most this far apart ("0": every pm_join_timeout)
//	pool = 4                    # pre-established connections per peer (0: connect on demand)
//	pool_idle = "60s"           # a pooled connection unused for this long is replaced
//	connect_timeout = "5s"      # to a peer, and from the far proxy to the destination
//	header_timeout = "5s"       # a request must arrive whole within this once it has begun
//	drain_timeout = "30s"       # on SIGTERM, existing connections get this long to finish
//	send_backlog = "100ms"      # the relay holds what the MPTCP subflows have queued and not
//	                            # sent to this much of their delivery rate ("0": kernel's limit)
//	reset_backlog = "100ms"     # on a failover, live subflows with more unsent data than this
//	                            # are reset, so that the dead path's data goes first ("0": off)
//	fwmark = 0x1b5              # marks packets to the proxy's sockets (TPROXY, transparent)
//	route_table = 4755          # the policy-routing table that delivers them locally
//	metrics = "127.0.0.1:9478"  # status and Prometheus endpoint; "" disables it
//	control = "@braid/proxy"    # control socket ('braid proxy reload'); "" disables it
//	max_unauthenticated = 256   # connections from would-be peers not yet authenticated;
//	                            # more are reset at once (counted as unauth_limit); peers'
//	                            # own addresses have a cap of this size of their own
//	backup = ["lte"]            # subflows over these uplinks are backup
//	  [[proxy.uplink]]          # as [[tunnel.uplink]] (used when there is no proxy.uplink)
//	  name = "fibre"
//	  interface = "wan0"
//	  address = "192.0.2.1"
//	  [[proxy.tenant]]
//	  name = "blue"             # tenants are isolated: own networks, ports, peers and keys
//	  networks = ["10.1.0.0/24"] # this site's networks of the tenant: intercepted as sources,
//	                            # served as destinations of the peers' connections
//	  port = 7001               # local port the interception delivers to (tproxy, redirect)
//	  peer_port = 7101          # MPTCP port where this tenant's peers connect to us
//	  socks = "10.1.0.254:1080" # optional SOCKS5 listener for ordinary clients
//	  socks_clients = ["127.0.0.1/32"] # the clients it serves (default: the tenant's networks)
//	  allow_sourceless = false  # true: a peer's request without a client source (its SOCKS
//	                            # client outside its networks) is connected from this proxy's
//	                            # own address; false refuses it (no_source)
//	    [[proxy.tenant.peer]]
//	    name = "site-b"
//	    public_key = "<base64>" # the peer's 'braid proxy keygen --public'; required unless
//	                            # plaintext
//	    address = ["198.51.100.1:7101"] # the peer proxy's address(es), tried in order; its
//	                            # other uplinks arrive by ADD_ADDR
//	    networks = ["10.2.0.0/24"] # the peer's networks of the tenant: destinations sent to
//	                            # this peer, and the only sources it may claim
//	    sources = ["198.51.100.0/29"] # plaintext only: the addresses the peer connects from
//	                            # (default: those of address); nothing else is served

// Proxy is the configuration of `braid proxy`. Each field's tag "key" names the file's key it
// comes from, for messages such as a reload's refusal.
type Proxy struct {
	Mode           string           `key:"mode"` // tproxy, redirect, socks
	PrivateKey     ident.PrivateKey `key:"private_key"`
	PrivateKeyFile string           `key:"private_key_file"` // the file PrivateKey was read from, if any (KeyFileWarnings)
	HasKey         bool             `key:"private_key"`
	Plaintext      bool             `key:"plaintext"`
	PathManager    string           `key:"path_manager"` // braid, kernel, none
	PMPolicy       string           `key:"pm_policy"`    // the braid path manager's policy: fullmesh, rbpm
	// PMJoinTimeout and PMJoinBackoffMax are the braid path manager's join timeout and the
	// bound of its backoff for pairs that never came up (core.Config; 0: no backoff).
	PMJoinTimeout    time.Duration `key:"pm_join_timeout"`
	PMJoinBackoffMax time.Duration `key:"pm_join_backoff_max"`
	Pool             int           `key:"pool"`
	PoolIdle         time.Duration `key:"pool_idle"`
	ConnectTimeout   time.Duration `key:"connect_timeout"`
	HeaderTimeout    time.Duration `key:"header_timeout"`
	DrainTimeout     time.Duration `key:"drain_timeout"`
	SendBacklog      time.Duration `key:"send_backlog"`  // 0: no bound but the kernel's
	ResetBacklog     time.Duration `key:"reset_backlog"` // 0: live subflows are not reset on a failover
	FwMark           uint32        `key:"fwmark"`
	RouteTable       int           `key:"route_table"`
	Metrics          string        `key:"metrics"`
	Control          string        `key:"control"` // control socket; "" disables it
	// MaxUnauthenticated caps the connections from would-be peers not yet authenticated.
	MaxUnauthenticated int           `key:"max_unauthenticated"`
	Uplinks            []PMUplink    `key:"uplink"`
	Tenants            []ProxyTenant `key:"tenant"`
}

// ProxyTenant is one tenant of the proxy.
type ProxyTenant struct {
	Name     string
	Networks []netip.Prefix
	Port     uint16
	PeerPort uint16
	Socks    netip.AddrPort // invalid: none
	// SocksClients are the clients the SOCKS5 listener serves (empty: Networks).
	SocksClients []netip.Prefix
	// AllowSourceless lets a peer's request without a source be connected from this proxy's
	// own address.
	AllowSourceless bool
	Peers           []ProxyPeer
}

// ProxyPeer is a peer proxy of a tenant.
type ProxyPeer struct {
	Name      string
	PublicKey ident.PublicKey
	Addresses []netip.AddrPort
	Networks  []netip.Prefix
	Sources   []netip.Prefix // plaintext: where the peer connects from (empty: Addresses)
}

// DefaultProxyControl is the proxy's control socket, an abstract one of its network namespace.
const DefaultProxyControl = "@braid/proxy"

// Proxy modes and path managers.
var (
	ProxyModes        = []string{"tproxy", "redirect", "socks"}
	ProxyPathManagers = []string{"braid", "kernel", "none"}
	// ProxyPMPolicies are the policies of braid's path manager in the proxy (amptcp, which
	// needs a LISP mapping system, is braid pm's only).
	ProxyPMPolicies = []string{"fullmesh", "rbpm"}
)

// ProxyDefaults returns the defaults, without key, uplinks or tenants.
func ProxyDefaults() Proxy {
	return Proxy{Mode: "tproxy", PathManager: "braid", PMPolicy: "fullmesh", PMJoinTimeout: time.Second, PMJoinBackoffMax: 30 * time.Second, Pool: 4, PoolIdle: time.Minute, ConnectTimeout: 5 * time.Second,
		HeaderTimeout: 5 * time.Second, DrainTimeout: 30 * time.Second, SendBacklog: 100 * time.Millisecond,
		ResetBacklog: 100 * time.Millisecond, FwMark: 0x1b5, RouteTable: 4755, Metrics: DefaultProxyMetrics,
		Control: DefaultProxyControl, MaxUnauthenticated: 256}
}

type proxySite struct {
	Tunnel    *fileTunnel    `toml:"tunnel"`
	Proxy     *fileProxy     `toml:"proxy"`
	PM        map[string]any `toml:"pm"`
	LB        map[string]any `toml:"lb"`
	Mapserver map[string]any `toml:"mapserver"`
	XTR       map[string]any `toml:"xtr"`
}

type fileProxy struct {
	Mode           *string      `toml:"mode"`
	PrivateKey     *string      `toml:"private_key"`
	PrivateKeyFile *string      `toml:"private_key_file"`
	Plaintext      *bool        `toml:"plaintext"`
	PathManager    *string      `toml:"path_manager"`
	PMPolicy       *string      `toml:"pm_policy"`
	PMJoinTimeout  any          `toml:"pm_join_timeout"`
	PMJoinBackoff  any          `toml:"pm_join_backoff_max"`
	Pool           *int64       `toml:"pool"`
	PoolIdle       any          `toml:"pool_idle"`
	ConnectTimeout any          `toml:"connect_timeout"`
	HeaderTimeout  any          `toml:"header_timeout"`
	DrainTimeout   any          `toml:"drain_timeout"`
	SendBacklog    any          `toml:"send_backlog"`
	ResetBacklog   any          `toml:"reset_backlog"`
	FwMark         *int64       `toml:"fwmark"`
	RouteTable     *int64       `toml:"route_table"`
	Metrics        *string      `toml:"metrics"`
	Control        *string      `toml:"control"`
	MaxUnauth      *int64       `toml:"max_unauthenticated"`
	Backup         []string     `toml:"backup"`
	Uplink         []fileUplink `toml:"uplink"`
	Tenant         []fileTenant `toml:"tenant"`
}

type fileTenant struct {
	Name     string          `toml:"name"`
	Networks any             `toml:"networks"`
	Port     *int64          `toml:"port"`
	PeerPort *int64          `toml:"peer_port"`
	Socks    *string         `toml:"socks"`
	SocksCl  any             `toml:"socks_clients"`
	NoSource *bool           `toml:"allow_sourceless"`
	Peer     []fileProxyPeer `toml:"peer"`
}

type fileProxyPeer struct {
	Name      string  `toml:"name"`
	PublicKey *string `toml:"public_key"`
	Address   any     `toml:"address"`
	Networks  any     `toml:"networks"`
	Sources   any     `toml:"sources"`
}

// LoadProxy reads the proxy's configuration from the site file data (named filename in
// errors); every problem is reported with its line. Uplinks are [[proxy.uplink]] or, when
// there are none, [[tunnel.uplink]].
func LoadProxy(filename string, data []byte, env Env) (*Proxy, error) {
	var f proxySite
	ix, err := tomlfile.Decode(filename, data, &f)
	if err != nil {
		return nil, err
	}
	if f.Proxy == nil {
		return nil, &Error{File: filename, Reason: "no [proxy] section"}
	}
	l := &loader{env: env, dir: filepath.Dir(filename)}
	p := ProxyDefaults()
	fp := f.Proxy
	prefix, ups := "proxy.uplink", fp.Uplink
	if len(ups) == 0 && f.Tunnel != nil {
		prefix, ups = "tunnel.uplink", f.Tunnel.Uplink
	}
	n := len(l.issues)
	for i := range ups {
		u := l.uplink(i, &ups[i])
		p.Uplinks = append(p.Uplinks, PMUplink{Name: u.Name, Interface: u.Interface, Address: u.Address})
	}
	if prefix == "proxy.uplink" {
		for _, is := range l.issues[n:] {
			for j, s := range is.paths {
				is.paths[j] = strings.Replace(s, "tunnel.uplink", "proxy.uplink", 1)
			}
		}
	}
	const obj = "proxy"
	if fp.Mode != nil {
		p.Mode = *fp.Mode
	}
	if fp.Plaintext != nil {
		p.Plaintext = *fp.Plaintext
	}
	if fp.PathManager != nil {
		p.PathManager = *fp.PathManager
	}
	if fp.PMPolicy != nil {
		p.PMPolicy = *fp.PMPolicy
	}
	if fp.Metrics != nil {
		p.Metrics = *fp.Metrics
	}
	if fp.Pool != nil {
		p.Pool = l.int(obj, "proxy.pool", "pool", *fp.Pool)
	}
	if fp.Control != nil {
		p.Control = *fp.Control
	}
	if fp.MaxUnauth != nil {
		p.MaxUnauthenticated = l.int(obj, "proxy.max_unauthenticated", "max_unauthenticated", *fp.MaxUnauth)
	}
	if fp.FwMark != nil {
		if *fp.FwMark <= 0 || *fp.FwMark > 0xFFFFFFFF {
			l.fail(obj, "proxy.fwmark", "fwmark %d outside 1..0xffffffff", *fp.FwMark)
		} else {
			p.FwMark = uint32(*fp.FwMark)
		}
	}
	if fp.RouteTable != nil {
		// 253..255 are the kernel's default, main and local tables.
		if *fp.RouteTable < 1 || *fp.RouteTable > 0x7FFFFFFF || (*fp.RouteTable >= 253 && *fp.RouteTable <= 255) {
			l.fail(obj, "proxy.route_table", "route_table %d: want 1..2147483647, not 253..255 (the kernel's own tables)", *fp.RouteTable)
		} else {
			p.RouteTable = int(*fp.RouteTable)
		}
	}
	l.duration(obj, "proxy.pool_idle", "pool_idle", fp.PoolIdle, &p.PoolIdle)
	l.duration(obj, "proxy.connect_timeout", "connect_timeout", fp.ConnectTimeout, &p.ConnectTimeout)
	l.duration(obj, "proxy.header_timeout", "header_timeout", fp.HeaderTimeout, &p.HeaderTimeout)
	l.duration(obj, "proxy.drain_timeout", "drain_timeout", fp.DrainTimeout, &p.DrainTimeout)
	l.duration(obj, "proxy.send_backlog", "send_backlog", fp.SendBacklog, &p.SendBacklog)
	l.duration(obj, "proxy.reset_backlog", "reset_backlog", fp.ResetBacklog, &p.ResetBacklog)
	l.duration(obj, "proxy.pm_join_timeout", "pm_join_timeout", fp.PMJoinTimeout, &p.PMJoinTimeout)
	l.duration(obj, "proxy.pm_join_backoff_max", "pm_join_backoff_max", fp.PMJoinBackoff, &p.PMJoinBackoffMax)
	switch {
	case fp.PrivateKey != nil && fp.PrivateKeyFile != nil:
		l.fail(obj, "proxy.private_key", "give private_key or private_key_file, not both")
	case fp.PrivateKey != nil:
		k, err := ident.ParsePrivateKey(*fp.PrivateKey)
		if err != nil {
			l.fail(obj, "proxy.private_key", "private_key: %s", strings.TrimPrefix(err.Error(), "ident: "))
		}
		p.PrivateKey, p.HasKey = k, err == nil
	case fp.PrivateKeyFile != nil && env != nil:
		name := *fp.PrivateKeyFile
		if !filepath.IsAbs(name) {
			name = filepath.Join(l.dir, name)
		}
		p.PrivateKeyFile = name
		k, err := readProxyKey(env, name)
		if err != nil {
			l.fail(obj, "proxy.private_key_file", "private_key_file: %v", err)
		}
		p.PrivateKey, p.HasKey = k, err == nil
	}
	for i := range fp.Tenant {
		p.Tenants = append(p.Tenants, l.tenant(i, &fp.Tenant[i]))
	}
	c := &checker{}
	for _, name := range fp.Backup {
		if !slices.ContainsFunc(p.Uplinks, func(u PMUplink) bool { return u.Name == name }) {
			c.report(obj, fmt.Sprintf("backup %q: no uplink has this name", name), "proxy.backup")
		}
		for i := range p.Uplinks {
			if p.Uplinks[i].Name == name {
				p.Uplinks[i].Backup = true
			}
		}
	}
	p.check(c, prefix, env, fp.PrivateKeyFile != nil && env == nil)
	if p.PathManager != "braid" && slices.Contains(ProxyPathManagers, p.PathManager) {
		if fp.PMPolicy != nil {
			c.report(obj, fmt.Sprintf("pm_policy %q is a policy of path_manager \"braid\", not of %q", p.PMPolicy, p.PathManager), "proxy.pm_policy", "proxy")
		}
		for _, k := range []struct {
			key string
			set bool
		}{{"pm_join_timeout", fp.PMJoinTimeout != nil}, {"pm_join_backoff_max", fp.PMJoinBackoff != nil}} {
			if k.set {
				c.report(obj, fmt.Sprintf("%s is a setting of path_manager \"braid\", not of %q", k.key, p.PathManager), "proxy."+k.key, "proxy")
			}
		}
	}
	reported := map[string]bool{}
	for _, is := range l.issues {
		reported[is.paths[0]] = true
	}
	issues := l.issues
	for _, is := range c.issues {
		if !reported[is.paths[0]] {
			issues = append(issues, is)
		}
	}
	if len(issues) == 0 {
		return &p, nil
	}
	for _, is := range issues {
		is.err.File = filename
		is.err.Line = ix.Line(is.paths...)
	}
	slices.SortStableFunc(issues, func(a, b issue) int { return cmp.Compare(a.err.Line, b.err.Line) })
	return nil, joinIssues(issues)
}

func readProxyKey(env Env, name string) (ident.PrivateKey, error) {
	data, err := env.ReadFile(name)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return ident.PrivateKey{}, fmt.Errorf("cannot read %s: %w", name, err)
	}
	k, err := ident.ParsePrivateKey(strings.TrimSpace(string(data)))
	if err != nil {
		return k, fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "ident: "))
	}
	return k, nil
}

func (l *loader) tenant(i int, f *fileTenant) ProxyTenant {
	t := ProxyTenant{Name: f.Name}
	obj := objName("tenant", f.Name, i)
	p := fmt.Sprintf("proxy.tenant[%d].", i)
	t.Networks = l.prefixes(obj, p+"networks", "networks", f.Networks)
	if f.Port != nil {
		t.Port = l.port(obj, p+"port", "port", *f.Port, 1)
	}
	if f.PeerPort != nil {
		t.PeerPort = l.port(obj, p+"peer_port", "peer_port", *f.PeerPort, 1)
	}
	if f.Socks != nil && *f.Socks != "" {
		a, err := netip.ParseAddrPort(*f.Socks)
		if err != nil {
			l.fail(obj, p+"socks", "socks %q: want address:port such as 10.1.0.254:1080", *f.Socks)
		}
		t.Socks = a
	}
	if f.SocksCl != nil {
		t.SocksClients = l.prefixes(obj, p+"socks_clients", "socks_clients", f.SocksCl)
	}
	if f.NoSource != nil {
		t.AllowSourceless = *f.NoSource
	}
	for j := range f.Peer {
		fpr := &f.Peer[j]
		pr := ProxyPeer{Name: fpr.Name}
		pobj := obj + " " + objName("peer", fpr.Name, j)
		pp := fmt.Sprintf("%speer[%d].", p, j)
		if fpr.PublicKey != nil {
			k, err := ident.ParsePublicKey(*fpr.PublicKey)
			if err != nil {
				l.fail(pobj, pp+"public_key", "public_key: %s", strings.TrimPrefix(err.Error(), "ident: "))
			}
			pr.PublicKey = k
		}
		pr.Networks = l.prefixes(pobj, pp+"networks", "networks", fpr.Networks)
		if fpr.Sources != nil {
			pr.Sources = l.prefixes(pobj, pp+"sources", "sources", fpr.Sources)
		}
		var addrs []string
		switch v := fpr.Address.(type) {
		case nil:
		case string:
			addrs = []string{v}
		case []any:
			for k, e := range v {
				s, ok := e.(string)
				if !ok {
					l.fail(pobj, fmt.Sprintf("%saddress[%d]", pp, k), "address[%d] must be a string, not %s", k, tomlfile.TypeName(e))
					continue
				}
				addrs = append(addrs, s)
			}
		default:
			l.fail(pobj, pp+"address", "address must be a string or a list of strings, not %s", tomlfile.TypeName(v))
		}
		for _, s := range addrs {
			a, err := netip.ParseAddrPort(s)
			if err != nil {
				l.fail(pobj, pp+"address", "address %q: want address:port such as 198.51.100.1:7101 ([2001:db8::1]:7101 for IPv6)", s)
				continue
			}
			pr.Addresses = append(pr.Addresses, a)
		}
		t.Peers = append(t.Peers, pr)
	}
	return t
}

func (p *Proxy) check(c *checker, prefix string, env Env, keyUnread bool) {
	const obj = "proxy"
	if !slices.Contains(ProxyModes, p.Mode) {
		c.report(obj, fmt.Sprintf("mode %q: known modes are %s", p.Mode, strings.Join(ProxyModes, ", ")), "proxy.mode", "proxy")
	}
	if !slices.Contains(ProxyPathManagers, p.PathManager) {
		c.report(obj, fmt.Sprintf("path_manager %q: known path managers are %s (braid's policy is pm_policy)", p.PathManager, strings.Join(ProxyPathManagers, ", ")), "proxy.path_manager", "proxy")
	}
	if !slices.Contains(ProxyPMPolicies, p.PMPolicy) {
		c.report(obj, fmt.Sprintf("pm_policy %q: known policies are %s", p.PMPolicy, strings.Join(ProxyPMPolicies, ", ")), "proxy.pm_policy", "proxy")
	}
	if !p.Plaintext && !p.HasKey && !keyUnread {
		c.report(obj, "no private_key or private_key_file: proxies authenticate each other with keys ('braid proxy keygen'); plaintext = true only for links protected below", "proxy.private_key", "proxy")
	}
	if p.Metrics != "" {
		if _, err := netip.ParseAddrPort(p.Metrics); err != nil {
			c.report(obj, fmt.Sprintf("metrics %q: want address:port such as 127.0.0.1:9478", p.Metrics), "proxy.metrics", "proxy")
		}
	}
	if msg := controlProblem(p.Control); msg != "" {
		c.report(obj, msg, "proxy.control", "proxy")
	}
	if p.MaxUnauthenticated < 1 || p.MaxUnauthenticated > 65536 {
		c.report(obj, fmt.Sprintf("max_unauthenticated %d outside 1..65536", p.MaxUnauthenticated), "proxy.max_unauthenticated", "proxy")
	}
	if p.Pool < 0 || p.Pool > 64 {
		c.report(obj, fmt.Sprintf("pool %d outside 0..64", p.Pool), "proxy.pool", "proxy")
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"pool_idle", p.PoolIdle}, {"connect_timeout", p.ConnectTimeout}, {"header_timeout", p.HeaderTimeout}, {"drain_timeout", p.DrainTimeout},
		{"pm_join_timeout", p.PMJoinTimeout}} {
		if d.v <= 0 {
			c.report(obj, d.key+" must be positive", "proxy."+d.key, "proxy")
		}
	}
	if p.PMJoinBackoffMax > 0 && p.PMJoinBackoffMax < p.PMJoinTimeout {
		c.report(obj, fmt.Sprintf("pm_join_backoff_max %v is shorter than pm_join_timeout %v: give at least pm_join_timeout, or 0 to turn the backoff off", p.PMJoinBackoffMax, p.PMJoinTimeout), "proxy.pm_join_backoff_max", "proxy")
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"send_backlog", p.SendBacklog}, {"reset_backlog", p.ResetBacklog}} {
		if d.v < 0 || d.v > 10*time.Second {
			c.report(obj, d.key+" outside 0..10s", "proxy."+d.key, "proxy")
		}
	}
	if p.PathManager != "none" && len(p.Uplinks) == 0 {
		c.report(obj, "no uplinks: add a [[proxy.uplink]] (or [[tunnel.uplink]]) for each local path, or path_manager = \"none\"", "proxy")
	}
	seen := map[string]bool{}
	for i, u := range p.Uplinks {
		uobj := objName("uplink", u.Name, i)
		pth := fmt.Sprintf("%s[%d]", prefix, i)
		c.name(uobj, pth, u.Name)
		if seen[u.Name] && u.Name != "" {
			c.report(uobj, fmt.Sprintf("name %q: another uplink has this name", u.Name), pth+".name", pth)
		}
		seen[u.Name] = true
		switch reason := checkIfname(u.Interface); {
		case reason != "":
			c.report(uobj, "interface "+reason, pth+".interface", pth)
		case env != nil && !env.InterfaceExists(u.Interface):
			c.report(uobj, fmt.Sprintf("interface %q does not exist on this machine", u.Interface), pth+".interface", pth)
		}
		if reason := checkHostAddr(u.Address); reason != "" {
			c.report(uobj, "address "+reason, pth+".address", pth)
		}
	}
	if len(p.Tenants) == 0 {
		c.report(obj, "no tenants: add a [[proxy.tenant]] with its networks and peers", "proxy")
	}
	names, ports := map[string]bool{}, map[uint16]string{}
	keys := map[ident.PublicKey]string{}
	var own ident.PublicKey
	if p.HasKey {
		own = p.PrivateKey.Public()
	}
	for i := range p.Tenants {
		t := &p.Tenants[i]
		tobj := objName("tenant", t.Name, i)
		tp := fmt.Sprintf("proxy.tenant[%d]", i)
		c.name(tobj, tp, t.Name)
		if names[t.Name] && t.Name != "" {
			c.report(tobj, fmt.Sprintf("name %q: another tenant has this name", t.Name), tp+".name", tp)
		}
		names[t.Name] = true
		if len(t.Networks) == 0 {
			c.report(tobj, "no networks: list the tenant's networks at this site", tp+".networks", tp)
		}
		c.prefixList(tobj, tp+".networks", "networks", t.Networks)
		if t.Port == 0 && p.Mode != "socks" {
			c.report(tobj, "missing port: the local port interception delivers to", tp+".port", tp)
		}
		if t.PeerPort == 0 {
			c.report(tobj, "missing peer_port: the port this tenant's peers connect to", tp+".peer_port", tp)
		}
		for _, x := range []struct {
			port uint16
			key  string
		}{{t.Port, "port"}, {t.PeerPort, "peer_port"}, {t.Socks.Port(), "socks"}} {
			if x.port == 0 {
				continue
			}
			if other, dup := ports[x.port]; dup {
				c.report(tobj, fmt.Sprintf("%s %d is already %s", x.key, x.port, other), tp+"."+x.key, tp)
			}
			ports[x.port] = fmt.Sprintf("%s's %s", tobj, x.key)
		}
		if p.Mode == "socks" && !t.Socks.IsValid() {
			c.report(tobj, "mode socks needs a socks listener address", tp+".socks", tp)
		}
		if len(t.Peers) == 0 {
			c.report(tobj, "no peers: add a [[proxy.tenant.peer]]", tp)
		}
		if len(t.SocksClients) > 0 && !t.Socks.IsValid() {
			c.report(tobj, "socks_clients without a socks listener", tp+".socks_clients", tp)
		}
		c.prefixList(tobj, tp+".socks_clients", "socks_clients", t.SocksClients)
		// Plaintext: a peer is known by its source address alone, so no two peers of the
		// tenant may share one.
		srcOwner := map[netip.Prefix]string{}
		pnames := map[string]bool{}
		for j := range t.Peers {
			pr := &t.Peers[j]
			pobj := tobj + " " + objName("peer", pr.Name, j)
			pp := fmt.Sprintf("%s.peer[%d]", tp, j)
			c.name(pobj, pp, pr.Name)
			if pnames[pr.Name] && pr.Name != "" {
				c.report(pobj, fmt.Sprintf("name %q: the tenant has another peer of this name", pr.Name), pp+".name", pp)
			}
			pnames[pr.Name] = true
			if !p.Plaintext {
				switch {
				case pr.PublicKey == ident.PublicKey{}:
					c.report(pobj, "missing public_key (the peer's 'braid proxy keygen --public')", pp+".public_key", pp)
				case p.HasKey && pr.PublicKey == own:
					c.report(pobj, "public_key is this proxy's own key", pp+".public_key", pp)
				case keys[pr.PublicKey] != "" && keys[pr.PublicKey] != t.Name+"\x00"+pr.Name:
					// The same site may serve several tenants; within one tenant a key names one peer.
					if strings.HasPrefix(keys[pr.PublicKey], t.Name+"\x00") {
						c.report(pobj, "public_key is also another peer's of this tenant", pp+".public_key", pp)
					}
				}
				keys[pr.PublicKey] = t.Name + "\x00" + pr.Name
			}
			if len(pr.Addresses) == 0 {
				c.report(pobj, "missing address: the peer proxy's address:port", pp+".address", pp)
			}
			for _, a := range pr.Addresses {
				if reason := checkHostAddr(a.Addr()); reason != "" || a.Port() == 0 {
					c.report(pobj, fmt.Sprintf("address %s: want a host address and a port", a), pp+".address", pp)
				}
			}
			if len(pr.Networks) == 0 {
				c.report(pobj, "no networks: list the peer's networks of this tenant", pp+".networks", pp)
			}
			if len(pr.Sources) > 0 && !p.Plaintext {
				c.report(pobj, "sources is for plaintext only (with keys, the key tells the peer)", pp+".sources", pp)
			}
			c.prefixList(pobj, pp+".sources", "sources", pr.Sources)
			if p.Plaintext {
				srcs := pr.Sources
				if len(srcs) == 0 {
					for _, a := range pr.Addresses {
						ip := a.Addr().Unmap()
						srcs = append(srcs, netip.PrefixFrom(ip, ip.BitLen()))
					}
				}
				for _, s := range srcs {
					for o, name := range srcOwner {
						if s.IsValid() && o.IsValid() && s.Overlaps(o) && name != pr.Name {
							key := pp + ".sources"
							if len(pr.Sources) == 0 {
								key = pp + ".address"
							}
							c.report(pobj, fmt.Sprintf("plaintext: source %s overlaps peer %s's %s (the source address is all that tells plaintext peers apart)", s, name, o), key, pp)
						}
					}
				}
				for _, s := range srcs {
					srcOwner[s] = pr.Name
				}
			}
			c.prefixList(pobj, pp+".networks", "networks", pr.Networks)
			for _, n := range pr.Networks {
				for _, own := range t.Networks {
					if n.IsValid() && own.IsValid() && n.Overlaps(own) {
						c.report(pobj, fmt.Sprintf("networks %s overlaps the tenant's own %s", n, own), pp+".networks", pp)
					}
				}
			}
		}
	}
}

// prefixList checks that prefixes are canonical (no host bits).
func (c *checker) prefixList(obj, path, key string, ps []netip.Prefix) {
	for _, pf := range ps {
		if pf.IsValid() && pf.Masked() != pf {
			c.report(obj, fmt.Sprintf("%s %s has host bits set (did you mean %s?)", key, pf, pf.Masked()), path, path)
		}
	}
}
