// Lab topology files are TOML documents, read by Parse and Load. Every problem is reported
// as "file:line: object: reason" at the line of the offending key, and an unknown key is an
// error, so a typo cannot silently leave a link unshaped.
//
// # File format
//
//	name = "two-sites"   # optional; defaults to the file's base name without extension,
//	                     # lower-cased, with other characters than [a-z0-9-] replaced by "-"
//
//	[[host]]             # one table per host (network namespace)
//	name = "r1"          # [a-z][a-z0-9-]*, at most 12 characters
//	forward = true       # optional, default false: enable IPv4 and IPv6 forwarding
//	route = [            # optional static routes; [[host.route]] tables work as well
//	  { dst = "10.2.0.0/16", via = "10.0.12.2" },
//	  { dst = "default", via = "fd00:12::2" },          # ::/0, the family of via
//	  { dst = "10.9.0.0/24", dev = "wan1", metric = 10 }, # on-link
//	]
//	nat = { outside = "wan0" }   # optional: a NAT router, below
//
//	[[link]]             # one table per point-to-point link
//	name = "r1-core"     # optional; defaults to "a-b", then "a-b-2", ... for parallel links
//	a = "r1"             # host names
//	b = "core"
//	a_ifname = "wan0"    # optional; defaults to the host's lowest free eth<N>
//	b_ifname = "r1"
//	a_addr = ["10.0.12.1/30", "fd00:12::1/64"]   # a string or a list of address/length
//	b_addr = ["10.0.12.2/30", "fd00:12::2/64"]
//	mtu = 1500           # optional, default 1500; 576..65535, at least 1280 with IPv6
//	offload = "auto"     # auto | on | off
//	# shaping for both directions; all optional, 0 means unlimited / none / default:
//	rate = "50mbit"      # or a number of bit/s
//	delay = "10ms"       # one way; or a number of milliseconds
//	jitter = "1ms"       # or a number of milliseconds
//	loss = "0.5%"        # or a number, in percent
//	queue_packets = 100  # drop-tail queue bound in packets
//	queue_bytes = "150KB" # or a number of bytes
//	[link.ab]            # overrides for the a->b direction only, same keys as above
//	rate = "100mbit"
//	[link.ba]            # overrides for the b->a direction only
//	rate = "10mbit"
//
// Instead of a fixed rate, a direction can replay recorded capacity (see Trace for the format,
// lab/traces for cellular traces):
//
//	[link.ab]
//	trace = "../traces/TMobile-LTE-short.up"   # relative to this file's directory
//	trace_offset = "30s"  # optional: start the replay 30 s into the trace (below its period)
//	[link.ba]
//	trace = "../traces/TMobile-LTE-short.down"
//
// trace may also be set on the link itself, for both directions. rate and trace in the same
// table are an error; a direction's trace replaces a rate it inherits from the link, and its
// rate a trace. trace_offset shifts the trace of its table, or in [link.ab] / [link.ba] alone
// the trace inherited from the link. delay, jitter, loss and the queue keys apply as with a
// rate; the default queue is one bandwidth-delay product of the round trip at the trace's mean
// rate, at least 64 packets. A trace that cannot be read, is empty, goes back in time or holds
// anything but whole milliseconds is reported at the trace key, naming the trace file and line.
// Each link's replay starts when the lab creates the link, and repeats after the trace's last
// timestamp. A kernel link (kernel = true) cannot replay a trace.
//
// A host with a nat table is a NAT router (see NAT; forwarding is then on): what leaves by an
// outside interface is masqueraded to that interface's address, what arrives there is forwarded
// only if it belongs to a mapping.
//
//	[host.nat]                   # or inline: nat = { outside = "wan0", random_ports = true }
//	outside = "wan0"             # required: an interface name or a list of them
//	random_ports = true          # optional, default false (the kernel keeps the inside port)
//	ipv6 = false                 # optional, default false: IPv6 is routed untranslated
//	udp_timeout = "30s"          # optional: idle lifetime of a UDP mapping, whole seconds
//	udp_stream_timeout = "120s"  # optional: of a flow with replies, if not udp_timeout
//
// Units are those of braid/internal/units (ParseRate, ParseDelay, ParseLoss, ParseSize). A route's dst is a
// prefix, a bare address (a host route), or "default", which means 0.0.0.0/0 or ::/0
// depending on the family of via and therefore requires via. A route without via needs dev.
//
// Parse reports values that do not parse (a bad address, "-5ms", "150%") first; the checks of
// Validate, which look at the topology as a whole, run once every value has parsed, so that a
// typo in one value does not also show up as a string of follow-on errors.

package topo

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
	"braid/internal/units"
)

// Load reads and parses the topology file at path; see Parse.
func Load(path string) (*Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes a topology file, fills in its defaults (Normalize) and validates it. filename
// is used in error messages and for the default topology name. The error, if any, is a
// *Error or an errors.Join of *Error values sorted by line, each with File set to filename.
func Parse(filename string, data []byte) (*Topology, error) {
	var f fileTopology
	ix, err := tomlfile.Decode(filename, data, &f)
	if err != nil {
		return nil, err
	}

	t, issues := f.topology(filename)
	if len(issues) == 0 {
		issues = t.check()
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

// The file* types mirror the file format. Values with units are "any" because they may be a
// TOML string or number; they are converted with the parsers of package units so that a bad value
// is reported with its line instead of as a decoder type error.
type fileTopology struct {
	Name *string    `toml:"name"` // a pointer to tell name = "" from no name
	Host []fileHost `toml:"host"`
	Link []fileLink `toml:"link"`
}

type fileHost struct {
	Name    string      `toml:"name"`
	Forward bool        `toml:"forward"`
	Route   []fileRoute `toml:"route"`
	NAT     *fileNAT    `toml:"nat"`
}

type fileNAT struct {
	Outside          any  `toml:"outside"`
	RandomPorts      bool `toml:"random_ports"`
	IPv6             bool `toml:"ipv6"`
	UDPTimeout       any  `toml:"udp_timeout"`
	UDPStreamTimeout any  `toml:"udp_stream_timeout"`
}

type fileRoute struct {
	Dst    string `toml:"dst"`
	Via    string `toml:"via"`
	Dev    string `toml:"dev"`
	Metric int    `toml:"metric"`
}

type fileLink struct {
	Name    string `toml:"name"`
	A       string `toml:"a"`
	B       string `toml:"b"`
	AIfname string `toml:"a_ifname"`
	BIfname string `toml:"b_ifname"`
	AAddr   any    `toml:"a_addr"`
	BAddr   any    `toml:"b_addr"`
	MTU     int    `toml:"mtu"`
	Offload string `toml:"offload"`
	Kernel  bool   `toml:"kernel"`
	fileShape
	AB *fileShape `toml:"ab"`
	BA *fileShape `toml:"ba"`
}

// fileShape holds shaping keys; nil means "not set here".
type fileShape struct {
	Rate         any  `toml:"rate"`
	Delay        any  `toml:"delay"`
	Jitter       any  `toml:"jitter"`
	Loss         any  `toml:"loss"`
	QueuePackets *int `toml:"queue_packets"`
	QueueBytes   any  `toml:"queue_bytes"`
	Trace        any  `toml:"trace"`
	TraceOffset  any  `toml:"trace_offset"`
}

// topology converts the decoded file. Names and endpoints are converted and normalized first,
// so that value errors can name their link by its final name.
func (f *fileTopology) topology(filename string) (*Topology, []issue) {
	t := &Topology{Name: defaultName(filename)}
	if f.Name != nil {
		t.Name = *f.Name
	}
	for _, h := range f.Host {
		t.Hosts = append(t.Hosts, Host{Name: h.Name, Forward: h.Forward})
	}
	for _, l := range f.Link {
		t.Links = append(t.Links, Link{
			Name: l.Name,
			A:    Endpoint{Host: l.A, Ifname: l.AIfname},
			B:    Endpoint{Host: l.B, Ifname: l.BIfname},
			MTU:  l.MTU, Kernel: l.Kernel,
		})
	}
	t.Normalize()

	var issues []issue
	traces := &traceLoader{dir: filepath.Dir(filename), cache: map[string]traceResult{}}
	for i := range f.Link {
		fl, l := &f.Link[i], &t.Links[i]
		c := converter{obj: "link " + l.Name, path: fmt.Sprintf("link[%d]", i), traces: traces}
		l.A.Addrs = c.addrs("a_addr", fl.AAddr)
		l.B.Addrs = c.addrs("b_addr", fl.BAddr)
		if o, err := ParseOffload(fl.Offload); err != nil {
			c.fail(err.Error(), "offload")
		} else {
			l.Offload = o
		}
		var base Shape
		c.shape(&base, &fl.fileShape, "")
		l.AB, l.BA = base, base
		if fl.AB != nil {
			c.shape(&l.AB, fl.AB, "ab.")
		}
		if fl.BA != nil {
			c.shape(&l.BA, fl.BA, "ba.")
		}
		issues = append(issues, c.issues...)
	}
	for i, fh := range f.Host {
		for j, fr := range fh.Route {
			c := converter{
				obj:  fmt.Sprintf("host %s route %s", fh.Name, fr.Dst),
				path: fmt.Sprintf("host[%d].route[%d]", i, j),
			}
			t.Hosts[i].Routes = append(t.Hosts[i].Routes, c.route(fr))
			issues = append(issues, c.issues...)
		}
		if fh.NAT != nil {
			c := converter{obj: "host " + fh.Name + " nat", path: fmt.Sprintf("host[%d].nat", i)}
			t.Hosts[i].NAT = c.nat(fh.NAT)
			issues = append(issues, c.issues...)
		}
	}
	return t, issues
}

func (c *converter) nat(f *fileNAT) *NAT {
	n := &NAT{RandomPorts: f.RandomPorts, IPv6: f.IPv6}
	switch v := f.Outside.(type) {
	case nil: // reported by Validate
	case string:
		n.Outside = []string{v}
	case []any:
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				k := fmt.Sprintf("outside[%d]", i)
				c.fail(fmt.Sprintf("%s must be a string (an interface name), not %s", k, tomlfile.TypeName(e)), k)
				continue
			}
			n.Outside = append(n.Outside, s)
		}
	default:
		c.fail(fmt.Sprintf("outside must be an interface name or a list of them, not %s", tomlfile.TypeName(v)), "outside")
	}
	timeout := func(key string, v any, d *time.Duration) {
		if v == nil {
			return
		}
		str, ok := tomlfile.NumberText(v)
		if !ok {
			c.fail(fmt.Sprintf("%s must be a string or a number, not %s", key, tomlfile.TypeName(v)), key)
			return
		}
		var err error
		if *d, err = units.ParseDuration(key, str); err != nil {
			c.fail(err.Error(), key)
		}
	}
	timeout("udp_timeout", f.UDPTimeout, &n.UDPTimeout)
	timeout("udp_stream_timeout", f.UDPStreamTimeout, &n.UDPStreamTimeout)
	return n
}

// converter turns the values of one link or route into their Go types, collecting issues.
type converter struct {
	obj    string // e.g. "link r1-core"
	path   string // e.g. "link[2]"
	traces *traceLoader
	issues []issue
}

// traceLoader reads each trace file of a topology once; relative paths are taken from the
// topology file's directory.
type traceLoader struct {
	dir   string
	cache map[string]traceResult
}

type traceResult struct {
	t   *Trace
	err error
}

func (tl *traceLoader) load(name string) (*Trace, error) {
	path := name
	if !filepath.IsAbs(path) {
		path = filepath.Join(tl.dir, path)
	}
	r, ok := tl.cache[path]
	if !ok {
		r.t, r.err = LoadTrace(path)
		tl.cache[path] = r
	}
	return r.t, r.err
}

func (c *converter) fail(reason, key string) {
	c.issues = append(c.issues, issue{&Error{Object: c.obj, Reason: reason}, []string{c.path + "." + key}})
}

func (c *converter) addrs(key string, v any) []netip.Prefix {
	var list []any
	switch v := v.(type) {
	case nil:
		return nil
	case string:
		list = []any{v}
	case []any:
		list = v
	default:
		c.fail(fmt.Sprintf("%s must be a string or a list of strings, not %s", key, tomlfile.TypeName(v)), key)
		return nil
	}
	var out []netip.Prefix
	for i, a := range list {
		k := key
		if _, ok := v.([]any); ok {
			k = fmt.Sprintf("%s[%d]", key, i)
		}
		s, ok := a.(string)
		if !ok {
			c.fail(fmt.Sprintf("%s must be a string, not %s", k, tomlfile.TypeName(a)), k)
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			c.fail(fmt.Sprintf("invalid address %q: want address/length such as 10.0.0.1/24", s), k)
			continue
		}
		out = append(out, p)
	}
	return out
}

// shape applies the keys set in f to s. prefix is "" for the link's own keys and "ab." or
// "ba." for a direction's overrides.
func (c *converter) shape(s *Shape, f *fileShape, prefix string) {
	value := func(key string, v any, parse func(string) error) {
		if v == nil {
			return
		}
		str, ok := tomlfile.NumberText(v)
		if !ok {
			c.fail(fmt.Sprintf("%s must be a string or a number, not %s", key, tomlfile.TypeName(v)), prefix+key)
			return
		}
		if err := parse(str); err != nil {
			c.fail(err.Error(), prefix+key)
		}
	}
	value("rate", f.Rate, func(v string) (err error) { s.Rate, err = units.ParseRate(v); return })
	value("delay", f.Delay, func(v string) (err error) { s.Delay, err = units.ParseDuration("delay", v); return })
	value("jitter", f.Jitter, func(v string) (err error) { s.Jitter, err = units.ParseDuration("jitter", v); return })
	value("loss", f.Loss, func(v string) (err error) { s.Loss, err = units.ParseLoss(v); return })
	value("queue_bytes", f.QueueBytes, func(v string) (err error) { s.QueueBytes, err = units.ParseSize(v); return })
	if f.QueuePackets != nil {
		s.QueuePackets = *f.QueuePackets // a negative bound is left to Validate
	}
	c.trace(s, f, prefix)
}

// trace applies the trace keys of f to s. A section's trace replaces the rate it inherits and
// its rate replaces the trace it inherits; rate and trace in the same section conflict. A
// trace_offset shifts the trace of its section, or the one a direction inherits.
func (c *converter) trace(s *Shape, f *fileShape, prefix string) {
	if f.Rate != nil {
		s.Trace = nil
	}
	if f.Trace != nil {
		name, ok := f.Trace.(string)
		switch {
		case !ok:
			c.fail(fmt.Sprintf("trace must be a string (a file name), not %s", tomlfile.TypeName(f.Trace)), prefix+"trace")
		case name == "":
			c.fail("trace must name a file", prefix+"trace")
		case f.Rate != nil:
			c.fail("rate and trace are both set: a direction has either a fixed rate or a trace", prefix+"trace")
		default:
			t, err := c.traces.load(name)
			if err != nil {
				c.fail(err.Error(), prefix+"trace")
				break
			}
			s.Trace, s.Rate = t, 0
		}
	}
	if f.TraceOffset == nil {
		return
	}
	str, ok := tomlfile.NumberText(f.TraceOffset)
	if !ok {
		c.fail(fmt.Sprintf("trace_offset must be a string or a number, not %s", tomlfile.TypeName(f.TraceOffset)), prefix+"trace_offset")
		return
	}
	off, err := units.ParseDuration("trace_offset", str)
	switch {
	case err != nil:
		c.fail(err.Error(), prefix+"trace_offset")
	case s.Trace == nil:
		if f.Trace == nil { // else the trace's own error is reported
			c.fail("trace_offset without a trace", prefix+"trace_offset")
		}
	case off >= s.Trace.Period():
		c.fail(fmt.Sprintf("trace_offset %v is not within the trace's period of %v (%s)", off, s.Trace.Period(), s.Trace.File), prefix+"trace_offset")
	default:
		s.Trace = s.Trace.WithOffset(off)
	}
}

func (c *converter) route(f fileRoute) Route {
	r := Route{Dev: f.Dev, Metric: f.Metric}
	if f.Via != "" {
		via, err := netip.ParseAddr(f.Via)
		if err != nil {
			c.fail(fmt.Sprintf("invalid via %q: want an IPv4 or IPv6 address", f.Via), "via")
		}
		r.Via = via
	}
	switch {
	case f.Dst == "default" && !r.Via.IsValid():
		if f.Via == "" {
			c.fail(`dst "default" needs via to choose between 0.0.0.0/0 and ::/0`, "dst")
		}
	case f.Dst == "default" && r.Via.Is4():
		r.Dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	case f.Dst == "default":
		r.Dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	case f.Dst == "":
		c.fail("missing dst", "dst")
	case !strings.Contains(f.Dst, "/"):
		a, err := netip.ParseAddr(f.Dst)
		if err != nil || a.Zone() != "" {
			c.fail(fmt.Sprintf("invalid dst %q: want a prefix, an address or \"default\"", f.Dst), "dst")
			break
		}
		r.Dst = netip.PrefixFrom(a, a.BitLen())
	default:
		p, err := netip.ParsePrefix(f.Dst)
		if err != nil {
			c.fail(fmt.Sprintf("invalid dst %q: want a prefix, an address or \"default\"", f.Dst), "dst")
		}
		r.Dst = p
	}
	return r
}

// defaultName derives a topology name from a file name: "Two_Sites.toml" becomes "two-sites".
func defaultName(filename string) string {
	base := filepath.Base(filename)
	base = strings.ToLower(strings.TrimSuffix(base, filepath.Ext(base)))
	name := []byte(base)
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			name[i] = '-'
		}
	}
	s := strings.TrimLeft(string(name), "0123456789-")
	s = strings.TrimRight(s[:min(len(s), maxTopologyName)], "-")
	if s == "" {
		return "lab"
	}
	return s
}
