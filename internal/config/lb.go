package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"braid/internal/config/tomlfile"
)

// LB is the load balancer's configuration: the [lb] section of the site file, its
// [[lb.service]] virtual services and [[lb.backend]] servers.
type LB struct {
	Interface    string           // where traffic to the VIPs arrives; the XDP program attaches here
	Interfaces   []string         // more interfaces where it arrives (the program attaches to each)
	Attach       string           // auto, native or generic
	Mode         string           // mac or ipip
	Aware        bool             // MPTCP-aware (false: an MPTCP-unaware balancer, for comparison)
	Hash         string           // 5-tuple or addresses
	Collision    string           // keep (the first owner keeps a token) or drop (joins dropped)
	SourceMAC    net.HardwareAddr // of forwarded frames; nil: the interface's own
	EncapSource4 netip.Addr       // outer source of IPv4 encapsulation (mode ipip)
	EncapSource6 netip.Addr       // outer source of IPv6 encapsulation (mode ipip)
	Metrics      string           // status and metrics endpoint; "" for none
	Control      string           // control socket; "" for none
	HashSeed     uint32

	// Token learnings per second and burst per client /24 (IPv4) or /64 (IPv6); promotions
	// (a token's first join) have a budget of the same size apart.
	LearnRate, LearnBurst uint32
	// Promotions to the joined token table per second and burst, all CPUs together.
	GlobalRate, GlobalBurst uint32
	// FloodRate is the rate of forged learnings (per second) that the pending table is sized
	// to outlast: a legitimate token stays for TokenUnjoined under such a flood, twice over.
	FloodRate     uint32
	TokenUnjoined time.Duration // a token never joined steers no join after this long
	TokenIdle     time.Duration
	TokenClosing  time.Duration
	Sweep         time.Duration
	// ConnTable: flows past their SYN; EmbryonicTable: flows seen only by their SYN;
	// TokenTable: joined tokens; PendingTable: tokens never joined. The token tables default
	// to the sizes the rates call for (LBTokenSizes).
	ConnTable, EmbryonicTable, TokenTable, PendingTable uint32

	HealthInterval, HealthTimeout time.Duration
	Rise, Fall                    int

	Services []netip.AddrPort
	Backends []LBBackend

	BGP *LBBGP // [lb.bgp]: VIPs announced to upstream routers; nil for none
}

// LBBackend is one server behind the balancer.
type LBBackend struct {
	Name          string
	MAC           net.HardwareAddr // destination MAC of its frames (it, or the next hop to it)
	Interface     string           // egress interface; "" sends back out of lb.interface
	Address       netip.Addr       // its own address: encapsulation destination (ipip)
	Weight        uint32           // 0: drained
	Health        string           // host:port of a TCP health check; "" for none
	StatelessPort uint16           // its own port on every VIP (stateless mode); 0 for none
}

// Limits of the data plane (internal/lb/xdp).
const (
	LBMaxServices = 4
	LBMaxBackends = 256
)

// LBDefaults returns the defaults, without services or backends.
func LBDefaults() LB {
	return LB{Attach: "auto", Mode: "mac", Aware: true, Hash: "5-tuple", Collision: "keep",
		Metrics: DefaultLBMetrics, Control: DefaultLBControl, HashSeed: 0x6272646c,
		LearnRate: 100, LearnBurst: 200, GlobalRate: 2000, GlobalBurst: 4000, FloodRate: 20000,
		TokenUnjoined: 10 * time.Second, TokenIdle: 10 * time.Minute, TokenClosing: 30 * time.Second, Sweep: time.Second,
		ConnTable: 1 << 20, EmbryonicTable: 1 << 18, TokenTable: 1 << 18, PendingTable: 1 << 19,
		HealthInterval: time.Second, HealthTimeout: 500 * time.Millisecond, Rise: 2, Fall: 3}
}

// LBTokenSizes returns the token table sizes that lb's rates call for, powers of two:
//
//   - pending: a flood of FloodRate forged learnings per second pushes a pending token out of
//     the LRU after pending/FloodRate seconds; that is at least twice TokenUnjoined.
//   - joined: forged joins promote at most GlobalRate tokens per second; above 3/4 of the table
//     the sweeper removes tokens idle for TokenClosing, so a promotion flood holds about
//     GlobalRate x TokenClosing entries; that is at most half of 3/4 of the table.
//
// The defaults (FloodRate 20 000/s, TokenUnjoined 10 s; GlobalRate 2 000/s, TokenClosing
// 30 s) give 524 288 and 262 144 entries (160 000 rounded up).
func LBTokenSizes(lb *LB) (pending, joined uint32) {
	p := 2 * float64(lb.FloodRate) * lb.TokenUnjoined.Seconds()
	j := 2 * float64(lb.GlobalRate) * lb.TokenClosing.Seconds() * 4 / 3
	return pow2(p), pow2(j)
}

func pow2(x float64) uint32 {
	n := uint32(1024)
	for float64(n) < x && n < 1<<26 {
		n <<= 1
	}
	return n
}

type lbSite struct {
	Tunnel    map[string]any `toml:"tunnel"`
	PM        map[string]any `toml:"pm"`
	Proxy     map[string]any `toml:"proxy"`
	LB        *fileLB        `toml:"lb"`
	Mapserver map[string]any `toml:"mapserver"`
	XTR       map[string]any `toml:"xtr"`
}

type fileLB struct {
	Interface      *string         `toml:"interface"`
	Interfaces     []string        `toml:"interfaces"`
	Attach         *string         `toml:"attach"`
	Mode           *string         `toml:"mode"`
	Aware          *bool           `toml:"aware"`
	Hash           *string         `toml:"hash"`
	Collision      *string         `toml:"collision"`
	SourceMAC      *string         `toml:"source_mac"`
	EncapSource4   *string         `toml:"encap_source4"`
	EncapSource6   *string         `toml:"encap_source6"`
	Metrics        *string         `toml:"metrics"`
	Control        *string         `toml:"control"`
	HashSeed       *int64          `toml:"hash_seed"`
	LearnRate      *int64          `toml:"learn_rate"`
	LearnBurst     *int64          `toml:"learn_burst"`
	GlobalRate     *int64          `toml:"global_rate"`
	GlobalBurst    *int64          `toml:"global_burst"`
	FloodRate      *int64          `toml:"flood_rate"`
	TokenUnjoined  any             `toml:"token_unjoined"`
	TokenIdle      any             `toml:"token_idle"`
	TokenClosing   any             `toml:"token_closing"`
	Sweep          any             `toml:"sweep"`
	ConnTable      *int64          `toml:"conn_table"`
	EmbryonicTable *int64          `toml:"embryonic_table"`
	TokenTable     *int64          `toml:"token_table"`
	PendingTable   *int64          `toml:"pending_table"`
	HealthInterval any             `toml:"health_interval"`
	HealthTimeout  any             `toml:"health_timeout"`
	Rise           *int64          `toml:"rise"`
	Fall           *int64          `toml:"fall"`
	Service        []fileLBService `toml:"service"`
	Backend        []fileLBBackend `toml:"backend"`
	BGP            *fileLBBGP      `toml:"bgp"`
}

type fileLBService struct {
	VIP *string `toml:"vip"`
}

type fileLBBackend struct {
	Name          *string `toml:"name"`
	MAC           *string `toml:"mac"`
	Interface     *string `toml:"interface"`
	Address       *string `toml:"address"`
	Weight        *int64  `toml:"weight"`
	Health        *string `toml:"health"`
	StatelessPort *int64  `toml:"stateless_port"`
}

// LoadLB reads the [lb] section of the site file data (named filename in errors) and reports
// every problem with its line. env, if not nil, is asked whether interfaces exist.
func LoadLB(filename string, data []byte, env Env) (*LB, error) {
	var f lbSite
	ix, err := tomlfile.Decode(filename, data, &f)
	if err != nil {
		return nil, err
	}
	if f.LB == nil {
		return nil, &Error{File: filename, Reason: "no [lb] section"}
	}
	fl := f.LB
	l := &loader{env: env}
	lb := LBDefaults()
	const obj = "lb"
	str := func(p *string, d *string) {
		if p != nil {
			*d = *p
		}
	}
	str(fl.Interface, &lb.Interface)
	lb.Interfaces = fl.Interfaces
	str(fl.Attach, &lb.Attach)
	str(fl.Mode, &lb.Mode)
	str(fl.Hash, &lb.Hash)
	str(fl.Collision, &lb.Collision)
	str(fl.Metrics, &lb.Metrics)
	str(fl.Control, &lb.Control)
	if fl.Aware != nil {
		lb.Aware = *fl.Aware
	}
	if fl.SourceMAC != nil {
		m, err := net.ParseMAC(*fl.SourceMAC)
		if err != nil || len(m) != 6 {
			l.fail(obj, "lb.source_mac", "source_mac %q: want an Ethernet address such as 02:00:00:00:00:01", *fl.SourceMAC)
		}
		lb.SourceMAC = m
	}
	if fl.EncapSource4 != nil {
		lb.EncapSource4 = l.addr(obj, "lb.encap_source4", "encap_source4", *fl.EncapSource4)
	}
	if fl.EncapSource6 != nil {
		lb.EncapSource6 = l.addr(obj, "lb.encap_source6", "encap_source6", *fl.EncapSource6)
	}
	u32 := func(key string, v *int64, lo, hi int64, d *uint32) {
		if v == nil {
			return
		}
		if *v < lo || *v > hi {
			l.fail(obj, "lb."+key, "%s %d outside %d..%d", key, *v, lo, hi)
			return
		}
		*d = uint32(*v)
	}
	u32("hash_seed", fl.HashSeed, 0, 1<<32-1, &lb.HashSeed)
	u32("learn_rate", fl.LearnRate, 0, 1e6, &lb.LearnRate)
	u32("learn_burst", fl.LearnBurst, 1, 1e7, &lb.LearnBurst)
	u32("global_rate", fl.GlobalRate, 0, 1e6, &lb.GlobalRate)
	u32("global_burst", fl.GlobalBurst, 1, 1e7, &lb.GlobalBurst)
	u32("flood_rate", fl.FloodRate, 1, 1e8, &lb.FloodRate)
	u32("conn_table", fl.ConnTable, 1024, 1<<26, &lb.ConnTable)
	u32("embryonic_table", fl.EmbryonicTable, 1024, 1<<26, &lb.EmbryonicTable)
	var rise, fall uint32 = uint32(lb.Rise), uint32(lb.Fall)
	u32("rise", fl.Rise, 1, 100, &rise)
	u32("fall", fl.Fall, 1, 100, &fall)
	lb.Rise, lb.Fall = int(rise), int(fall)
	l.duration(obj, "lb.token_unjoined", "token_unjoined", fl.TokenUnjoined, &lb.TokenUnjoined)
	l.duration(obj, "lb.token_idle", "token_idle", fl.TokenIdle, &lb.TokenIdle)
	l.duration(obj, "lb.token_closing", "token_closing", fl.TokenClosing, &lb.TokenClosing)
	l.duration(obj, "lb.sweep", "sweep", fl.Sweep, &lb.Sweep)
	l.duration(obj, "lb.health_interval", "health_interval", fl.HealthInterval, &lb.HealthInterval)
	l.duration(obj, "lb.health_timeout", "health_timeout", fl.HealthTimeout, &lb.HealthTimeout)
	// The token tables follow the rates unless set.
	lb.PendingTable, lb.TokenTable = LBTokenSizes(&lb)
	u32("token_table", fl.TokenTable, 1024, 1<<24, &lb.TokenTable)
	u32("pending_table", fl.PendingTable, 1024, 1<<26, &lb.PendingTable)

	for i, s := range fl.Service {
		p := fmt.Sprintf("lb.service[%d]", i)
		if s.VIP == nil {
			l.fail(fmt.Sprintf("service %d", i+1), p, "missing vip (address:port)")
			lb.Services = append(lb.Services, netip.AddrPort{})
			continue
		}
		lb.Services = append(lb.Services, l.addrPort(fmt.Sprintf("service %d", i+1), p+".vip", "vip", *s.VIP))
	}
	for i, fb := range fl.Backend {
		p := fmt.Sprintf("lb.backend[%d]", i)
		var b LBBackend
		b.Weight = 1
		str(fb.Name, &b.Name)
		o := objName("backend", b.Name, i)
		str(fb.Interface, &b.Interface)
		str(fb.Health, &b.Health)
		if fb.MAC != nil {
			m, err := net.ParseMAC(*fb.MAC)
			if err != nil || len(m) != 6 {
				l.fail(o, p+".mac", "mac %q: want an Ethernet address such as 02:00:00:00:00:01", *fb.MAC)
			}
			b.MAC = m
		}
		if fb.Address != nil {
			b.Address = l.addr(o, p+".address", "address", *fb.Address)
		}
		if fb.Weight != nil {
			if *fb.Weight < 0 || *fb.Weight > 1000 {
				l.fail(o, p+".weight", "weight %d outside 0..1000", *fb.Weight)
			} else {
				b.Weight = uint32(*fb.Weight)
			}
		}
		if fb.StatelessPort != nil {
			b.StatelessPort = l.port(o, p+".stateless_port", "stateless_port", *fb.StatelessPort, 1)
		}
		lb.Backends = append(lb.Backends, b)
	}
	lb.BGP = l.lbBGP(fl.BGP)
	c := &checker{}
	lb.check(c, env)
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
	if err := finish(filename, ix, issues); err != nil {
		return nil, err
	}
	return &lb, nil
}

// Validate reports every problem in lb (env as for LoadLB).
func (lb *LB) Validate(env Env) error {
	c := &checker{}
	lb.check(c, env)
	return joinIssues(c.issues)
}

func (lb *LB) check(c *checker, env Env) {
	const obj = "lb"
	switch reason := checkIfname(lb.Interface); {
	case reason != "":
		c.report(obj, "interface "+reason, "lb.interface", "lb")
	case env != nil && !env.InterfaceExists(lb.Interface):
		c.report(obj, fmt.Sprintf("interface %q does not exist on this machine", lb.Interface), "lb.interface", "lb")
	}
	for i, name := range lb.Interfaces {
		p := fmt.Sprintf("lb.interfaces[%d]", i)
		switch reason := checkIfname(name); {
		case reason != "":
			c.report(obj, "interfaces: "+reason, p, "lb.interfaces")
		case env != nil && !env.InterfaceExists(name):
			c.report(obj, fmt.Sprintf("interfaces: %q does not exist on this machine", name), p, "lb.interfaces")
		case name == lb.Interface || slices.Contains(lb.Interfaces[:i], name):
			c.report(obj, fmt.Sprintf("interfaces: %q is listed twice", name), p, "lb.interfaces")
		}
	}
	oneOf := func(key, v string, known ...string) {
		if !slices.Contains(known, v) {
			c.report(obj, fmt.Sprintf("%s %q: want one of %v", key, v, known), "lb."+key, "lb")
		}
	}
	oneOf("attach", lb.Attach, "auto", "native", "generic")
	oneOf("mode", lb.Mode, "mac", "ipip")
	oneOf("hash", lb.Hash, "5-tuple", "addresses")
	oneOf("collision", lb.Collision, "keep", "drop")
	if msg := controlProblem(lb.Control); msg != "" {
		c.report(obj, msg, "lb.control", "lb")
	}
	if lb.Metrics != "" {
		if _, err := netip.ParseAddrPort(lb.Metrics); err != nil {
			c.report(obj, fmt.Sprintf("metrics %q: want address:port such as 127.0.0.1:9476", lb.Metrics), "lb.metrics", "lb")
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"token_unjoined", lb.TokenUnjoined}, {"token_idle", lb.TokenIdle}, {"token_closing", lb.TokenClosing}, {"sweep", lb.Sweep},
		{"health_interval", lb.HealthInterval}, {"health_timeout", lb.HealthTimeout}} {
		if d.v <= 0 {
			c.report(obj, d.key+" must be positive", "lb."+d.key, "lb")
		}
	}
	// Tables smaller than the rates need (without the factor 2 of headroom) are refused.
	if lb.TokenUnjoined > 0 && lb.TokenClosing > 0 {
		pending, joined := LBTokenSizes(lb)
		if lb.PendingTable < pending/2 {
			c.report(obj, fmt.Sprintf("pending_table %d: flood_rate %d/s would push a token out before token_unjoined %s; want at least %d (default %d)",
				lb.PendingTable, lb.FloodRate, lb.TokenUnjoined, pending/2, pending), "lb.pending_table", "lb")
		}
		if lb.TokenTable < joined/2 {
			c.report(obj, fmt.Sprintf("token_table %d: global_rate %d/s of forged joins kept for token_closing %s would leave no headroom; want at least %d (default %d)",
				lb.TokenTable, lb.GlobalRate, lb.TokenClosing, joined/2, joined), "lb.token_table", "lb")
		}
	}
	if lb.Mode == "ipip" {
		if lb.EncapSource4.IsValid() && !lb.EncapSource4.Is4() {
			c.report(obj, fmt.Sprintf("encap_source4 %s is not an IPv4 address", lb.EncapSource4), "lb.encap_source4")
		}
		if lb.EncapSource6.IsValid() && !lb.EncapSource6.Is6() {
			c.report(obj, fmt.Sprintf("encap_source6 %s is not an IPv6 address", lb.EncapSource6), "lb.encap_source6")
		}
	}
	if len(lb.Services) == 0 {
		c.report(obj, "no services: add a [[lb.service]] with vip = \"address:port\"", "lb")
	}
	if len(lb.Services) > LBMaxServices {
		c.report(obj, fmt.Sprintf("%d services: at most %d", len(lb.Services), LBMaxServices), fmt.Sprintf("lb.service[%d]", LBMaxServices))
	}
	vips := map[netip.AddrPort]bool{}
	for i, s := range lb.Services {
		p := fmt.Sprintf("lb.service[%d]", i)
		o := fmt.Sprintf("service %d", i+1)
		if !s.IsValid() || s.Port() == 0 {
			c.report(o, "vip: want address:port with a port", p+".vip", p)
			continue
		}
		if reason := checkHostAddr(s.Addr()); reason != "" {
			c.report(o, "vip "+reason, p+".vip", p)
		}
		if vips[s] {
			c.report(o, fmt.Sprintf("vip %s: another service has it", s), p+".vip", p)
		}
		vips[s] = true
	}
	if len(lb.Backends) == 0 {
		c.report(obj, "no backends: add a [[lb.backend]] for each server", "lb")
	}
	if len(lb.Backends) > LBMaxBackends {
		c.report(obj, fmt.Sprintf("%d backends: at most %d", len(lb.Backends), LBMaxBackends), "lb")
	}
	names := map[string]bool{}
	ports := map[uint16]string{}
	for i, b := range lb.Backends {
		p := fmt.Sprintf("lb.backend[%d]", i)
		o := objName("backend", b.Name, i)
		c.name(o, p, b.Name)
		if names[b.Name] && b.Name != "" {
			c.report(o, fmt.Sprintf("name %q: another backend has this name", b.Name), p+".name", p)
		}
		names[b.Name] = true
		if len(b.MAC) != 6 {
			c.report(o, "missing mac (its Ethernet address, or the next hop's)", p+".mac", p)
		}
		if b.Interface != "" {
			switch reason := checkIfname(b.Interface); {
			case reason != "":
				c.report(o, "interface "+reason, p+".interface", p)
			case env != nil && !env.InterfaceExists(b.Interface):
				c.report(o, fmt.Sprintf("interface %q does not exist on this machine", b.Interface), p+".interface", p)
			}
		}
		if lb.Mode == "ipip" {
			if reason := checkHostAddr(b.Address); reason != "" {
				c.report(o, "address "+reason+" (mode ipip encapsulates to it)", p+".address", p)
			} else if b.Address.Is4() && !lb.EncapSource4.IsValid() {
				c.report(obj, fmt.Sprintf("backend %s has an IPv4 address: set encap_source4", b.Name), "lb.encap_source4", "lb")
			} else if b.Address.Is6() && !lb.EncapSource6.IsValid() {
				c.report(obj, fmt.Sprintf("backend %s has an IPv6 address: set encap_source6", b.Name), "lb.encap_source6", "lb")
			}
		}
		if b.Health != "" {
			if _, err := netip.ParseAddrPort(b.Health); err != nil {
				c.report(o, fmt.Sprintf("health %q: want address:port of a TCP check", b.Health), p+".health", p)
			}
		}
		if b.StatelessPort != 0 {
			if other, ok := ports[b.StatelessPort]; ok {
				c.report(o, fmt.Sprintf("stateless_port %d: backend %s has it too", b.StatelessPort, other), p+".stateless_port", p)
			}
			for _, s := range lb.Services {
				if s.Port() == b.StatelessPort {
					c.report(o, fmt.Sprintf("stateless_port %d is a service's port", b.StatelessPort), p+".stateless_port", p)
				}
			}
			ports[b.StatelessPort] = b.Name
		}
	}
	lb.checkBGP(c)
}
