package config

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"braid/internal/config/tomlfile"
)

// PM is the path-manager daemon's configuration: the [pm] section of the site file, with the
// uplinks of [[pm.uplink]] or, when there are none, of [[tunnel.uplink]] (one description of
// the site's uplinks serves every role).
type PM struct {
	Policy      string
	Metrics     string // address of the status and metrics endpoint; "" for none
	Control     string // control socket ('braid pm reload'); "" for none
	Poll        time.Duration
	JoinTimeout time.Duration
	DeadAfter   time.Duration
	Retry       time.Duration
	PortBase    uint16
	PortSpan    uint16
	// What the peer's ADD_ADDRs may make this host do (core.Config): distinct endpoints taken
	// per connection, failed joins before an announced endpoint is given up, and whether
	// link-local addresses are taken.
	MaxAnnounced   int
	JoinAttempts   int
	AllowLinkLocal bool
	// JoinBackoffMax bounds the wait between joins of an uplink-remote pair that never came up
	// on a connection (core.Config.MaxJoinBackoff); 0 turns the backoff off.
	JoinBackoffMax time.Duration
	Uplinks        []PMUplink
	AMPTCP         PMAMPTCP

	// timersSet records which of poll, join_timeout and dead_after the file set, so that
	// UsePolicy changes only the others to the new policy's defaults.
	timersSet struct{ poll, join, dead bool }
}

// PMAMPTCP configures the amptcp policy (LISP-assisted subflows).
type PMAMPTCP struct {
	Routing       string           // "any" (the paper's N_a) or "bound" (N_b)
	Resolvers     []netip.AddrPort // map-resolvers (port 4342 by default)
	LookupSource  netip.Addr       // ITR-RLOC of the pm's Map-Requests; invalid: routed toward the resolver
	LookupTimeout time.Duration
	LookupRetries int
	MaxAge        time.Duration  // a mapping is asked again after min(TTL, MaxAge)
	EIDPrefixes   []netip.Prefix // destinations augmented; empty: all
	MinBytes      uint64         // augment a connection once it carried this many bytes
	Subflows      int            // force this many subflows instead of the formula; 0: formula
}

// PMUplink is one local path of MPTCP subflows.
type PMUplink struct {
	Name      string
	Interface string
	Address   netip.Addr
	Backup    bool // subflows from it are backup
}

// PMPolicies are the policies braid pm knows.
var PMPolicies = []string{"fullmesh", "amptcp", "rbpm"}

// PMDefaults returns the defaults, without uplinks, for the fullmesh policy.
func PMDefaults() PM {
	return PM{Policy: "fullmesh", Metrics: "127.0.0.1:9475", Control: DefaultPMControl, Poll: 100 * time.Millisecond, JoinTimeout: time.Second,
		DeadAfter: time.Second, Retry: 250 * time.Millisecond, PortBase: 45000, PortSpan: 5000, MaxAnnounced: 8, JoinAttempts: 2, JoinBackoffMax: 30 * time.Second,
		AMPTCP: PMAMPTCP{Routing: "any", LookupTimeout: time.Second, LookupRetries: 2, MaxAge: time.Minute}}
}

// The rbpm policy's timers, those its figures (docs/scheduling.md) were measured with. A
// subflow over a slow path behind a deep queue (1 Mbit/s, 100 packets) goes more than a second
// without an ack: with fullmesh's 1 s dead_after and join_timeout the manager would destroy and
// re-create the very subflow rbpm is meant to demote, every second. rbpm judges each poll's
// window, so it polls twice as often.
const (
	RBPMPoll        = 50 * time.Millisecond
	RBPMJoinTimeout = 5 * time.Second
	RBPMDeadAfter   = 5 * time.Second
)

// PMPolicyDefaults returns the defaults, without uplinks, for the named policy.
func PMPolicyDefaults(policy string) PM {
	pm := PMDefaults()
	pm.Policy = policy
	if policy == "rbpm" {
		pm.Poll, pm.JoinTimeout, pm.DeadAfter = RBPMPoll, RBPMJoinTimeout, RBPMDeadAfter
	}
	return pm
}

// UsePolicy switches to the named policy (braid pm --policy): the timers the file did not set
// take that policy's defaults.
func (pm *PM) UsePolicy(name string) {
	d := PMPolicyDefaults(name)
	pm.Policy = name
	if !pm.timersSet.poll {
		pm.Poll = d.Poll
	}
	if !pm.timersSet.join {
		pm.JoinTimeout = d.JoinTimeout
	}
	if !pm.timersSet.dead {
		pm.DeadAfter = d.DeadAfter
	}
}

// pmSite is the site file as LoadPM reads it: its own section strictly, the tunnel's for the
// uplinks, the other roles' sections left alone.
type pmSite struct {
	Tunnel    *fileTunnel    `toml:"tunnel"`
	PM        *filePM        `toml:"pm"`
	Proxy     map[string]any `toml:"proxy"`
	LB        map[string]any `toml:"lb"`
	Mapserver map[string]any `toml:"mapserver"`
	XTR       map[string]any `toml:"xtr"`
}

type filePM struct {
	Policy         *string      `toml:"policy"`
	Metrics        *string      `toml:"metrics"`
	Control        *string      `toml:"control"`
	Poll           any          `toml:"poll"`
	JoinTimeout    any          `toml:"join_timeout"`
	DeadAfter      any          `toml:"dead_after"`
	Retry          any          `toml:"retry"`
	PortBase       *int64       `toml:"port_base"`
	PortSpan       *int64       `toml:"port_span"`
	MaxAnnounced   *int64       `toml:"max_announced"`
	JoinAttempts   *int64       `toml:"join_attempts"`
	JoinBackoffMax any          `toml:"join_backoff_max"`
	AllowLinkLocal *bool        `toml:"allow_link_local"`
	Backup         []string     `toml:"backup"` // names of uplinks whose subflows are backup
	Uplink         []fileUplink `toml:"uplink"`
	// amptcp
	Routing       *string  `toml:"routing"`
	Resolvers     []string `toml:"resolvers"`
	LookupSource  *string  `toml:"lookup_source"`
	LookupTimeout any      `toml:"lookup_timeout"`
	LookupRetries *int64   `toml:"lookup_retries"`
	MappingMaxAge any      `toml:"mapping_max_age"`
	EIDPrefixes   []string `toml:"eid_prefixes"`
	MinBytes      *int64   `toml:"min_bytes"`
	Subflows      *int64   `toml:"subflows"`
}

// LoadPM reads the path manager's configuration from the site file data (named filename in
// errors). Every problem is reported with its line, as LoadTunnel does. A site file without a
// [pm] section gets the defaults and the tunnel's uplinks.
func LoadPM(filename string, data []byte, env Env) (*PM, error) {
	var f pmSite
	ix, err := tomlfile.Decode(filename, data, &f)
	if err != nil {
		return nil, err
	}
	l := &loader{env: env}
	fp := f.PM
	if fp == nil {
		fp = &filePM{}
	}
	pm := PMDefaults()
	if fp.Policy != nil {
		pm = PMPolicyDefaults(*fp.Policy)
	}
	pm.timersSet.poll, pm.timersSet.join, pm.timersSet.dead = fp.Poll != nil, fp.JoinTimeout != nil, fp.DeadAfter != nil
	prefix := "pm.uplink"
	ups := fp.Uplink
	if len(ups) == 0 && f.Tunnel != nil {
		prefix, ups = "tunnel.uplink", f.Tunnel.Uplink
	}
	for i := range ups {
		u := l.uplink(i, &ups[i])
		pm.Uplinks = append(pm.Uplinks, PMUplink{Name: u.Name, Interface: u.Interface, Address: u.Address})
	}
	if prefix == "pm.uplink" {
		// loader.uplink names the tunnel's keys; point at the pm section's instead.
		for _, is := range l.issues {
			for j, p := range is.paths {
				is.paths[j] = strings.Replace(p, "tunnel.uplink", "pm.uplink", 1)
			}
		}
	}
	if fp.Metrics != nil {
		pm.Metrics = *fp.Metrics
	}
	if fp.Control != nil {
		pm.Control = *fp.Control
	}
	l.duration("pm", "pm.poll", "poll", fp.Poll, &pm.Poll)
	l.duration("pm", "pm.join_timeout", "join_timeout", fp.JoinTimeout, &pm.JoinTimeout)
	l.duration("pm", "pm.dead_after", "dead_after", fp.DeadAfter, &pm.DeadAfter)
	l.duration("pm", "pm.retry", "retry", fp.Retry, &pm.Retry)
	l.duration("pm", "pm.join_backoff_max", "join_backoff_max", fp.JoinBackoffMax, &pm.JoinBackoffMax)
	if fp.PortBase != nil {
		pm.PortBase = l.port("pm", "pm.port_base", "port_base", *fp.PortBase, 1)
	}
	if fp.PortSpan != nil {
		pm.PortSpan = l.port("pm", "pm.port_span", "port_span", *fp.PortSpan, 1)
	}
	for _, k := range []struct {
		key string
		v   *int64
		to  *int
	}{{"max_announced", fp.MaxAnnounced, &pm.MaxAnnounced}, {"join_attempts", fp.JoinAttempts, &pm.JoinAttempts}} {
		if k.v == nil {
			continue
		}
		if *k.v < 1 || *k.v > 255 {
			l.fail("pm", "pm."+k.key, "%s %d outside 1..255", k.key, *k.v)
			continue
		}
		*k.to = int(*k.v)
	}
	if fp.AllowLinkLocal != nil {
		pm.AllowLinkLocal = *fp.AllowLinkLocal
	}
	c := &checker{}
	a := &pm.AMPTCP
	if fp.Routing != nil {
		a.Routing = *fp.Routing
	}
	for i, r := range fp.Resolvers {
		ap, err := netip.ParseAddrPort(r)
		if err != nil {
			var ad netip.Addr
			if ad, err = netip.ParseAddr(r); err == nil {
				ap = netip.AddrPortFrom(ad, 4342)
			}
		}
		if err != nil {
			c.report("pm", fmt.Sprintf("resolvers[%d] %q: want ADDR or ADDR:PORT", i, r), "pm.resolvers")
			continue
		}
		a.Resolvers = append(a.Resolvers, ap)
	}
	if fp.LookupSource != nil {
		ad, err := netip.ParseAddr(*fp.LookupSource)
		if err != nil {
			c.report("pm", fmt.Sprintf("lookup_source %q is not an address", *fp.LookupSource), "pm.lookup_source")
		}
		a.LookupSource = ad
	}
	l.duration("pm", "pm.lookup_timeout", "lookup_timeout", fp.LookupTimeout, &a.LookupTimeout)
	l.duration("pm", "pm.mapping_max_age", "mapping_max_age", fp.MappingMaxAge, &a.MaxAge)
	if fp.LookupRetries != nil {
		if *fp.LookupRetries < 0 || *fp.LookupRetries > 10 {
			c.report("pm", fmt.Sprintf("lookup_retries %d outside 0..10", *fp.LookupRetries), "pm.lookup_retries")
		}
		a.LookupRetries = int(*fp.LookupRetries)
	}
	for i, s := range fp.EIDPrefixes {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			c.report("pm", fmt.Sprintf("eid_prefixes[%d] %q is not a prefix", i, s), "pm.eid_prefixes")
			continue
		}
		a.EIDPrefixes = append(a.EIDPrefixes, p.Masked())
	}
	if fp.MinBytes != nil {
		if *fp.MinBytes < 0 {
			c.report("pm", "min_bytes must not be negative", "pm.min_bytes")
		}
		a.MinBytes = uint64(max(*fp.MinBytes, 0))
	}
	if fp.Subflows != nil {
		if *fp.Subflows < 0 || *fp.Subflows > 9 {
			c.report("pm", fmt.Sprintf("subflows %d outside 0..9 (the kernel allows 8 beside the first)", *fp.Subflows), "pm.subflows")
		}
		a.Subflows = int(*fp.Subflows)
	}
	for _, name := range fp.Backup {
		found := false
		for i := range pm.Uplinks {
			if pm.Uplinks[i].Name == name {
				pm.Uplinks[i].Backup, found = true, true
			}
		}
		if !found {
			c.report("pm", fmt.Sprintf("backup %q: no uplink has this name", name), "pm.backup")
		}
	}
	pm.check(c, prefix, env)
	issues := append(l.issues, c.issues...)
	if len(issues) == 0 {
		return &pm, nil
	}
	for _, is := range issues {
		is.err.File = filename
		is.err.Line = ix.Line(is.paths...)
	}
	slices.SortStableFunc(issues, func(a, b issue) int { return cmp.Compare(a.err.Line, b.err.Line) })
	return nil, joinIssues(issues)
}

func (pm *PM) check(c *checker, prefix string, env Env) {
	if !slices.Contains(PMPolicies, pm.Policy) {
		known := slices.Clone(PMPolicies)
		sort.Strings(known)
		c.report("pm", fmt.Sprintf("policy %q: known policies are %s", pm.Policy, strings.Join(known, ", ")), "pm.policy", "pm")
	}
	if msg := controlProblem(pm.Control); msg != "" {
		c.report("pm", msg, "pm.control", "pm")
	}
	if pm.Metrics != "" {
		if _, err := netip.ParseAddrPort(pm.Metrics); err != nil {
			c.report("pm", fmt.Sprintf("metrics %q: want address:port such as 127.0.0.1:9475", pm.Metrics), "pm.metrics", "pm")
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"poll", pm.Poll}, {"join_timeout", pm.JoinTimeout}, {"dead_after", pm.DeadAfter}, {"retry", pm.Retry}} {
		if d.v <= 0 {
			c.report("pm", d.key+" must be positive", "pm."+d.key, "pm")
		}
	}
	if pm.JoinBackoffMax > 0 && pm.JoinBackoffMax < pm.JoinTimeout {
		c.report("pm", fmt.Sprintf("join_backoff_max %v is shorter than join_timeout %v: give at least join_timeout, or 0 to turn the backoff off", pm.JoinBackoffMax, pm.JoinTimeout), "pm.join_backoff_max", "pm")
	}
	if int(pm.PortBase)+int(pm.PortSpan) > 65536 {
		c.report("pm", fmt.Sprintf("port_base %d + port_span %d go past port 65535", pm.PortBase, pm.PortSpan), "pm.port_span", "pm")
	}
	if pm.AMPTCP.Routing != "any" && pm.AMPTCP.Routing != "bound" {
		c.report("pm", fmt.Sprintf("routing %q: want \"any\" (hosts reach their ITRs non-deterministically, N_a) or \"bound\" (interfaces bound to RLOCs, N_b)", pm.AMPTCP.Routing), "pm.routing", "pm")
	}
	if pm.Policy == "amptcp" && len(pm.AMPTCP.Resolvers) == 0 {
		c.report("pm", "policy amptcp needs resolvers (the LISP map-resolvers to look EIDs up in)", "pm.policy", "pm")
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"lookup_timeout", pm.AMPTCP.LookupTimeout}, {"mapping_max_age", pm.AMPTCP.MaxAge}} {
		if d.v <= 0 {
			c.report("pm", d.key+" must be positive", "pm."+d.key, "pm")
		}
	}
	if len(pm.Uplinks) == 0 {
		c.report("pm", "no uplinks: add a [[pm.uplink]] (or [[tunnel.uplink]]) for each local path", "pm")
	}
	seen := map[string]bool{}
	for i, u := range pm.Uplinks {
		obj := objName("uplink", u.Name, i)
		p := fmt.Sprintf("%s[%d]", prefix, i)
		c.name(obj, p, u.Name)
		if seen[u.Name] && u.Name != "" {
			c.report(obj, fmt.Sprintf("name %q: another uplink has this name", u.Name), p+".name", p)
		}
		seen[u.Name] = true
		switch reason := checkIfname(u.Interface); {
		case reason != "":
			c.report(obj, "interface "+reason, p+".interface", p)
		case env != nil && !env.InterfaceExists(u.Interface):
			c.report(obj, fmt.Sprintf("interface %q does not exist on this machine", u.Interface), p+".interface", p)
		}
		if reason := checkHostAddr(u.Address); reason != "" {
			c.report(obj, "address "+reason, p+".address", p)
		}
	}
}
