// Package mptconf reads the configuration files of MPT, the MPT-GRE reference daemon, and
// converts them into the [tunnel] section of a braid site file in mode "mpt", for
// 'braid tunnel import-mpt'.
//
// MPT keeps its configuration in INI files (tunnels.md section 2): conf/interface.conf with a
// [general] section and one [tun_N] section per tunnel interface, and one file per connection,
// conf/connections/<name>.conf, with a [connection] section, [path_N] sections (the local and
// remote ends of each path) and [net_N] sections (prefixes routed into the connection).
//
// The INI dialect is MPT's: "key = value" lines under "[section]" headers, comments on lines of
// their own starting with '#' or ';' (and after a value, following a space or tab), keys and
// section names matched case-insensitively. A repeated key keeps its last value, with a
// warning. Keys MPT does not know are warnings, not errors, because MPT ignores them; a line
// that is neither a header, a key nor a comment, or a key before any section, is an error.
// Every error and warning names the file and line.
//
// The conversion carries over what braid's mpt mode has: the TUN device, one uplink per local
// end of the paths, one peer per connection with its paths, routes and MPT settings, and the
// command ports with the control plane's auth_type and auth_key (braid speaks MPT's path-status
// exchange). What braid cannot carry over (public and gateway addresses, remote connection
// creation, permissions, path states, weight_in) becomes a warning, both in the returned list
// and as a comment in the generated file.
package mptconf

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"braid/internal/config"
)

// Warning is something MPT accepts that braid ignores or cannot express; Line is 0 when the
// warning is about a whole file or a value without a known line.
type Warning struct {
	File    string
	Line    int
	Message string
}

// String formats w as "file:line: warning: message", as the command prints it.
func (w Warning) String() string {
	return position(w.File, w.Line) + ": warning: " + w.Message
}

// Error is a problem in an MPT file: "file:line: message".
type Error struct {
	File    string
	Line    int
	Message string
}

func (e *Error) Error() string { return position(e.File, e.Line) + ": " + e.Message }

func position(file string, line int) string {
	if file == "" {
		file = "(input)"
	}
	if line > 0 {
		return fmt.Sprintf("%s:%d", file, line)
	}
	return file
}

// INI is a parsed INI file: its sections in file order, each with its keys.
type INI struct {
	File     string
	Sections []*Section
	Warnings []Warning // repeated keys and sections
}

// Section is one [name] section; a repeated section is merged into its first occurrence.
type Section struct {
	Name string // as written
	Line int    // of the header
	Keys []*Key // in order of first occurrence
}

// Key is one "name = value" line; for a repeated key, the last one.
type Key struct {
	Name  string // as written
	Value string // without surrounding blanks, quotes or a trailing comment
	Line  int
}

// Section returns the section name (case-insensitive), or nil.
func (f *INI) Section(name string) *Section {
	for _, s := range f.Sections {
		if strings.EqualFold(s.Name, name) {
			return s
		}
	}
	return nil
}

// Key returns the key name (case-insensitive), or nil. A nil section has no keys.
func (s *Section) Key(name string) *Key {
	if s == nil {
		return nil
	}
	for _, k := range s.Keys {
		if strings.EqualFold(k.Name, name) {
			return k
		}
	}
	return nil
}

// ParseINI parses data, named filename in errors and warnings. Its error is an *Error naming
// the first line that is neither a section header, a key nor a comment, or a key outside any
// section.
func ParseINI(filename string, data []byte) (*INI, error) {
	f := &INI{File: filename}
	var cur *Section
	text := strings.TrimPrefix(string(data), "\uFEFF")
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			end := strings.IndexByte(line, ']')
			if end < 0 {
				return nil, &Error{filename, n, fmt.Sprintf("malformed section header %s: want [name]", clip(line))}
			}
			if rest := strings.TrimSpace(line[end+1:]); rest != "" && rest[0] != '#' && rest[0] != ';' {
				return nil, &Error{filename, n, fmt.Sprintf("text %s after the section header", clip(rest))}
			}
			name := strings.TrimSpace(line[1:end])
			if name == "" || strings.ContainsAny(name, "[]") {
				return nil, &Error{filename, n, fmt.Sprintf("malformed section header %s: want [name]", clip(line))}
			}
			if s := f.Section(name); s != nil {
				f.Warnings = append(f.Warnings, Warning{filename, n, fmt.Sprintf("section [%s] repeated (first at line %d): its keys are merged", name, s.Line)})
				cur = s
				continue
			}
			cur = &Section{Name: name, Line: n}
			f.Sections = append(f.Sections, cur)
			continue
		}
		eq := strings.IndexByte(line, '=')
		if eq < 0 {
			return nil, &Error{filename, n, fmt.Sprintf("malformed line %s: want key = value, [section] or a # comment", clip(line))}
		}
		name := strings.TrimSpace(line[:eq])
		if name == "" {
			return nil, &Error{filename, n, fmt.Sprintf("malformed line %s: no key before '='", clip(line))}
		}
		if cur == nil {
			return nil, &Error{filename, n, fmt.Sprintf("key %s outside any section: put it under a [section] header", clip(name))}
		}
		value := unquote(stripComment(strings.TrimSpace(line[eq+1:])))
		if k := cur.Key(name); k != nil {
			f.Warnings = append(f.Warnings, Warning{filename, n, fmt.Sprintf("[%s] %s repeated (also at line %d): the last value, %s, wins", cur.Name, name, k.Line, clip(value))})
			k.Value, k.Line = value, n
			continue
		}
		cur.Keys = append(cur.Keys, &Key{Name: name, Value: value, Line: n})
	}
	return f, nil
}

// stripComment removes a comment that follows a value after a blank.
func stripComment(v string) string {
	for i := 1; i < len(v); i++ {
		if (v[i] == '#' || v[i] == ';') && (v[i-1] == ' ' || v[i-1] == '\t') {
			return strings.TrimSpace(v[:i])
		}
	}
	if v != "" && (v[0] == '#' || v[0] == ';') {
		return ""
	}
	return v
}

func unquote(v string) string {
	if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
		return v[1 : len(v)-1]
	}
	return v
}

// clip quotes s for a message, shortened if long.
func clip(s string) string {
	const max = 40
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return strconv.Quote(s)
}

// Interface is MPT's conf/interface.conf.
type Interface struct {
	TunnelNum    int  // [general] tunnel_num (default 1)
	AcceptRemote bool // [general] accept_remote: peers may create connections
	CmdPortLocal int  // [general] cmdport_local (default 65050)
	CmdTimeout   int  // [general] cmd_timeout, seconds, for MPT's CLI
	Tunnels      []Tun

	// Warnings are the keys and sections MPT ignores, and repeated keys.
	Warnings []Warning

	file  string
	lines map[string]int // "section.key" -> line
}

// Tun is one [tun_N] section: a TUN device of MPT.
type Tun struct {
	Name string       // name
	MTU  int          // mtu; 0 when absent
	IPv4 netip.Prefix // ipv4_addr; invalid when absent
	IPv6 netip.Prefix // ipv6_addr; invalid when absent (MPT itself crashes then)
}

// Connection is one of MPT's conf/connections/<name>.conf, with MPT's defaults applied.
type Connection struct {
	Name          string     // name; default: the file name without .conf
	IPVer         int        // ip_ver, 4 or 6 (default 6)
	IPLocal       netip.Addr // ip_local: this end's tunnel address
	IPRemote      netip.Addr // ip_remote: the peer's tunnel address
	LocalPort     int        // local_port (default 0: an ephemeral port)
	RemotePort    int        // remote_port (default 65000)
	RemoteCmdPort int        // remote_cmd_port (default 65050)
	Permission    int        // permission: 0 none, 1 send, 2 receive, 3 both
	Status        int        // status
	ReorderWindow int        // reorder_window, packets (default 0: off)
	MaxBuffDelay  time.Duration
	AuthType      int    // auth_type: 0 none, 1 random token, 2 SHA-256
	AuthKey       string // auth_key (hex), written out for auth_type 2 only
	Paths         []Path
	Nets          []Net

	// Warnings are the keys and sections MPT ignores, and repeated keys.
	Warnings []Warning

	file  string
	lines map[string]int
}

// Path is one [path_N] section of a connection.
type Path struct {
	Section       string // e.g. "path_0"
	InterfaceName string
	IPVer         int // default 6
	PrivateIP     netip.Addr
	PublicIP      netip.Addr
	GatewayIP     netip.Addr
	RemoteIP      netip.Addr
	KeepaliveTime time.Duration // default 0: none
	DeadTime      time.Duration // default 3 × KeepaliveTime
	WeightIn      int           // default 1
	WeightOut     int           // default 1
	Status        int
}

// Net is one [net_N] section of a connection.
type Net struct {
	Section string // e.g. "net_0"
	IPVer   int    // default 6
	Src     netip.Prefix
	Dst     netip.Prefix
}

// MPT's defaults (tunnels.md section 2).
const (
	defaultRemotePort    = 65000
	defaultCmdPort       = 65050
	defaultIPVer         = 6
	defaultMaxBuffDelay  = 100 * time.Millisecond
	defaultWeight        = 1
	defaultTunnelNum     = 1
	maxInt               = math.MaxInt32 // MPT reads C ints
	defaultDeadPerKeepal = 3
)

// reader reads the keys of one section, collecting errors and the keys it did not read.
type reader struct {
	file  string
	sec   *Section
	errs  *[]error
	lines map[string]int
	known map[string]bool
}

func newReader(f *INI, sec *Section, errs *[]error, lines map[string]int) *reader {
	lines[strings.ToLower(sec.Name)] = sec.Line
	return &reader{file: f.File, sec: sec, errs: errs, lines: lines, known: map[string]bool{}}
}

func (r *reader) fail(k *Key, format string, args ...any) {
	*r.errs = append(*r.errs, &Error{r.file, k.Line, fmt.Sprintf("[%s] %s: ", r.sec.Name, k.Name) + fmt.Sprintf(format, args...)})
}

// get marks name as known and returns its key, if present and not empty.
func (r *reader) get(name string) *Key {
	r.known[name] = true
	k := r.sec.Key(name)
	if k == nil {
		return nil
	}
	r.lines[strings.ToLower(r.sec.Name)+"."+name] = k.Line
	if k.Value == "" {
		return nil
	}
	return k
}

func (r *reader) str(name, def string) string {
	if k := r.get(name); k != nil {
		return k.Value
	}
	return def
}

func (r *reader) int(name string, def, lo, hi int) int {
	k := r.get(name)
	if k == nil {
		return def
	}
	n, err := strconv.Atoi(k.Value)
	if err != nil || n < lo || n > hi {
		r.fail(k, "%s: want a whole number in %d..%d", clip(k.Value), lo, hi)
		return def
	}
	return n
}

func (r *reader) ipVer(name string) int {
	k := r.get(name)
	if k == nil {
		return defaultIPVer
	}
	if k.Value != "4" && k.Value != "6" {
		r.fail(k, "%s: want 4 or 6", clip(k.Value))
		return defaultIPVer
	}
	return int(k.Value[0] - '0')
}

func (r *reader) addr(name string) netip.Addr {
	k := r.get(name)
	if k == nil {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(k.Value)
	if err != nil {
		r.fail(k, "%s: want an IPv4 or IPv6 address", clip(k.Value))
	}
	return a
}

// prefix reads address/length; a bare address gets the full length.
func (r *reader) prefix(name string) netip.Prefix {
	k := r.get(name)
	if k == nil {
		return netip.Prefix{}
	}
	if !strings.Contains(k.Value, "/") {
		a, err := netip.ParseAddr(k.Value)
		if err == nil {
			return netip.PrefixFrom(a, a.BitLen())
		}
	}
	p, err := netip.ParsePrefix(k.Value)
	if err != nil {
		r.fail(k, "%s: want address/length such as 10.0.0.2/24", clip(k.Value))
	}
	return p
}

// seconds reads a whole number of seconds.
func (r *reader) seconds(name string, def time.Duration) (time.Duration, bool) {
	k := r.get(name)
	if k == nil {
		return def, false
	}
	n, err := strconv.Atoi(k.Value)
	if err != nil || n < 0 || n > maxInt {
		r.fail(k, "%s: want a whole number of seconds", clip(k.Value))
		return def, false
	}
	return time.Duration(n) * time.Second, true
}

// unknown warns about the keys of the section that were not read.
func (r *reader) unknown(ws *[]Warning) {
	for _, k := range r.sec.Keys {
		if !r.known[strings.ToLower(k.Name)] {
			*ws = append(*ws, Warning{r.file, k.Line, fmt.Sprintf("unknown key %q in [%s]: MPT ignores it, and so does the conversion", k.Name, r.sec.Name)})
		}
	}
}

var numberedRE = regexp.MustCompile(`^(?i)(tun|path|net)_([0-9]{1,6})$`)

// numbered returns the sections kind_N in order of N.
func numbered(f *INI, kind string) []*Section {
	type ns struct {
		n int
		s *Section
	}
	var list []ns
	for _, s := range f.Sections {
		m := numberedRE.FindStringSubmatch(s.Name)
		if m != nil && strings.EqualFold(m[1], kind) {
			n, _ := strconv.Atoi(m[2])
			list = append(list, ns{n, s})
		}
	}
	slices.SortStableFunc(list, func(a, b ns) int { return a.n - b.n })
	out := make([]*Section, len(list))
	for i, x := range list {
		out[i] = x.s
	}
	return out
}

// ParseInterface parses MPT's interface.conf, named filename in errors. The error, if any, is
// an *Error or an errors.Join of them.
func ParseInterface(filename string, data []byte) (*Interface, error) {
	f, err := ParseINI(filename, data)
	if err != nil {
		return nil, err
	}
	var errs []error
	ifc := &Interface{Warnings: f.Warnings, file: filename, lines: map[string]int{}, TunnelNum: defaultTunnelNum, CmdPortLocal: defaultCmdPort}
	if g := f.Section("general"); g != nil {
		r := newReader(f, g, &errs, ifc.lines)
		ifc.TunnelNum = r.int("tunnel_num", defaultTunnelNum, 0, maxInt)
		ifc.AcceptRemote = r.int("accept_remote", 0, 0, 1) == 1
		ifc.CmdPortLocal = r.int("cmdport_local", defaultCmdPort, 0, 65535)
		ifc.CmdTimeout = r.int("cmd_timeout", 0, 0, maxInt)
		r.unknown(&ifc.Warnings)
	}
	for _, s := range numbered(f, "tun") {
		r := newReader(f, s, &errs, ifc.lines)
		t := Tun{Name: r.str("name", ""), MTU: r.int("mtu", 0, 0, 65535), IPv4: r.prefix("ipv4_addr"), IPv6: r.prefix("ipv6_addr")}
		if k := s.Key("ipv4_addr"); k != nil && t.IPv4.IsValid() && !t.IPv4.Addr().Is4() {
			r.fail(k, "%s is not an IPv4 address", t.IPv4)
		}
		if k := s.Key("ipv6_addr"); k != nil && t.IPv6.IsValid() && !t.IPv6.Addr().Is6() {
			r.fail(k, "%s is not an IPv6 address", t.IPv6)
		}
		r.unknown(&ifc.Warnings)
		ifc.Tunnels = append(ifc.Tunnels, t)
	}
	for _, s := range f.Sections {
		if !strings.EqualFold(s.Name, "general") && !isNumbered(s.Name, "tun") {
			ifc.Warnings = append(ifc.Warnings, Warning{filename, s.Line, fmt.Sprintf("unknown section [%s]: MPT's interface.conf has [general] and [tun_N]; ignored", s.Name)})
		}
	}
	if len(ifc.Tunnels) == 0 && len(errs) == 0 {
		errs = append(errs, &Error{filename, 0, "no [tun_0] section: not an MPT interface.conf"})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ifc, nil
}

func isNumbered(name, kind string) bool {
	m := numberedRE.FindStringSubmatch(name)
	return m != nil && strings.EqualFold(m[1], kind)
}

// ParseConnection parses one of MPT's connection files, named filename in errors, and applies
// MPT's defaults: ip_ver 6, local_port 0, remote_port 65000, reorder_window 0,
// max_buffdelay_msec 0 = 100 ms, keepalive_time 0 (none), dead_time 3 × keepalive_time,
// weight_in and weight_out 1. If path_count or network_count is given, MPT reads only that many
// [path_N] or [net_N] sections, and so does ParseConnection. The error, if any, is an *Error or
// an errors.Join of them.
func ParseConnection(filename string, data []byte) (*Connection, error) {
	f, err := ParseINI(filename, data)
	if err != nil {
		return nil, err
	}
	cs := f.Section("connection")
	if cs == nil {
		return nil, &Error{filename, 0, "no [connection] section: not an MPT connection file"}
	}
	var errs []error
	c := &Connection{Warnings: f.Warnings, file: filename, lines: map[string]int{}}
	r := newReader(f, cs, &errs, c.lines)
	base := strings.TrimSuffix(filepath.Base(filename), ".conf")
	c.Name = r.str("name", base)
	c.IPVer = r.ipVer("ip_ver")
	c.IPLocal = r.addr("ip_local")
	c.IPRemote = r.addr("ip_remote")
	c.LocalPort = r.int("local_port", 0, 0, 65535)
	c.RemotePort = r.int("remote_port", defaultRemotePort, 1, 65535)
	c.RemoteCmdPort = r.int("remote_cmd_port", defaultCmdPort, 0, 65535)
	c.Permission = r.int("permission", 0, 0, 3)
	c.Status = r.int("status", 0, 0, 255)
	c.ReorderWindow = r.int("reorder_window", 0, 0, maxInt)
	if ms := r.int("max_buffdelay_msec", 0, 0, maxInt); ms == 0 {
		c.MaxBuffDelay = defaultMaxBuffDelay
	} else {
		c.MaxBuffDelay = time.Duration(ms) * time.Millisecond
	}
	c.AuthType = r.int("auth_type", 0, 0, 2)
	c.AuthKey = r.str("auth_key", "")
	pathCount := r.int("path_count", -1, 0, maxInt)
	netCount := r.int("network_count", -1, 0, maxInt)
	r.unknown(&c.Warnings)

	paths := counted(f, "path", pathCount, cs.Key("path_count"), &errs, &c.Warnings)
	for _, s := range paths {
		r := newReader(f, s, &errs, c.lines)
		p := Path{Section: s.Name, InterfaceName: r.str("interface_name", "")}
		p.IPVer = r.ipVer("ip_ver")
		p.PrivateIP = r.addr("private_ipaddr")
		p.PublicIP = r.addr("public_ipaddr")
		p.GatewayIP = r.addr("gw_ipaddr")
		p.RemoteIP = r.addr("remote_ipaddr")
		p.KeepaliveTime, _ = r.seconds("keepalive_time", 0)
		var set bool
		if p.DeadTime, set = r.seconds("dead_time", 0); !set {
			p.DeadTime = defaultDeadPerKeepal * p.KeepaliveTime
		}
		p.WeightIn = r.int("weight_in", defaultWeight, 0, maxInt)
		p.WeightOut = r.int("weight_out", defaultWeight, 0, maxInt)
		p.Status = r.int("status", 0, 0, 255)
		r.get("window_size") // parsed by MPT, unused
		r.get("cmd_default")
		r.unknown(&c.Warnings)
		c.Paths = append(c.Paths, p)
	}
	for _, s := range counted(f, "net", netCount, cs.Key("network_count"), &errs, &c.Warnings) {
		r := newReader(f, s, &errs, c.lines)
		n := Net{Section: s.Name, IPVer: r.ipVer("ip_ver"), Src: r.prefix("src_addr"), Dst: r.prefix("dst_addr")}
		r.unknown(&c.Warnings)
		c.Nets = append(c.Nets, n)
	}
	for _, s := range f.Sections {
		if !strings.EqualFold(s.Name, "connection") && !isNumbered(s.Name, "path") && !isNumbered(s.Name, "net") {
			c.Warnings = append(c.Warnings, Warning{filename, s.Line, fmt.Sprintf("unknown section [%s]: MPT's connection files have [connection], [path_N] and [net_N]; ignored", s.Name)})
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// counted returns the kind_N sections MPT reads: the first count of them when count >= 0.
func counted(f *INI, kind string, count int, countKey *Key, errs *[]error, ws *[]Warning) []*Section {
	secs := numbered(f, kind)
	if count < 0 {
		return secs
	}
	if len(secs) < count {
		*errs = append(*errs, &Error{f.File, countKey.Line, fmt.Sprintf("[connection] %s: %d, but the file has %d [%s_N] sections", countKey.Name, count, len(secs), kind)})
		return secs
	}
	for _, s := range secs[count:] {
		*ws = append(*ws, Warning{f.File, s.Line, fmt.Sprintf("[%s] is beyond %s = %d: MPT does not read it, and neither does the conversion", s.Name, countKey.Name, count)})
	}
	return secs[:count]
}

// line returns the line of key in section (or of the section header when key is ""), or 0.
func line(lines map[string]int, section, key string) int {
	k := strings.ToLower(section)
	if key != "" {
		k += "." + key
	}
	return lines[k]
}

// at returns the line of key in section, or of the section header when the key is absent.
func at(lines map[string]int, section, key string) int {
	if n := line(lines, section, key); n > 0 {
		return n
	}
	return line(lines, section, "")
}

// braid's limits that MPT's files may exceed (config/tunnel.go).
const (
	maxReorderWindow = 10000
	maxWeight        = 65535
	maxName          = 32
)

// converter builds the site file, collecting warnings by the object they concern.
type converter struct {
	warns []Warning
	errs  []error
}

// note is a warning attached to an object of the output; it is also in converter.warns.
type notes []Warning

func (c *converter) warn(to *notes, file string, ln int, format string, args ...any) {
	w := Warning{file, ln, fmt.Sprintf(format, args...)}
	c.warns = append(c.warns, w)
	*to = append(*to, w)
}

func (c *converter) fail(file string, ln int, format string, args ...any) {
	c.errs = append(c.errs, &Error{file, ln, fmt.Sprintf(format, args...)})
}

type uplinkKey struct {
	addr netip.Addr
	port int
}

type outUplink struct {
	name, ifname string
	addr         netip.Addr
	port         int // 0: tunnel.port
	weight       int // 0: not written
	from         string
	comment      string
	notes        notes
}

type outPath struct {
	uplink string
	remote netip.AddrPort
	weight int // 0: the uplink's
	from   string
	notes  notes
}

type outPeer struct {
	name              string
	from              string
	routes            []netip.Prefix
	reorderWindow     int
	maxBuffDelay      time.Duration
	keepalive, dead   time.Duration
	localIP, remoteIP netip.Addr
	cmdPort           int // cmdport_local of interface.conf
	remoteCmdPort     int
	authType          int
	authKey           string // hex
	paths             []outPath
	notes             notes
}

// ToSiteTOML converts MPT's interface.conf and connection files into a site file with a
// complete, commented [tunnel] section in mode "mpt": the TUN device of [tun_0], one uplink per
// local end of the paths (interface_name, private_ipaddr and local_port), and one peer per
// connection with its paths, routes and MPT settings. warnings lists what braid cannot carry
// over, and the warnings of the parsed files; each is also a "WARNING" comment in toml. The
// result is checked with config.LoadTunnel (on a machine that has every interface); err, an
// *Error or an errors.Join of them, names the MPT file and line of what braid refuses.
func ToSiteTOML(ifc *Interface, conns []*Connection) (toml []byte, warnings []Warning, err error) {
	if ifc == nil {
		return nil, nil, errors.New("no interface.conf")
	}
	if len(conns) == 0 {
		return nil, nil, errors.New("no connection files: give at least one conf/connections/<name>.conf")
	}
	c := &converter{}
	var tunNotes notes
	for _, w := range ifc.Warnings {
		c.warn(&tunNotes, w.File, w.Line, "%s", w.Message)
	}
	f, ln := ifc.file, ifc.lines
	if ifc.CmdPortLocal == 0 {
		c.warn(&tunNotes, f, line(ln, "general", "cmdport_local"), "cmdport_local 0: no command port, so braid does not exchange path status changes with the peer (paths are judged by keepalives alone)")
	}
	if line(ln, "general", "cmd_timeout") > 0 {
		c.warn(&tunNotes, f, line(ln, "general", "cmd_timeout"), "cmd_timeout is a setting of MPT's CLI; not carried over")
	}
	if ifc.AcceptRemote {
		c.warn(&tunNotes, f, line(ln, "general", "accept_remote"), "accept_remote = 1: braid does not let peers create connections (MPT's CONNECTION_CREATE, authenticated with a hard-coded default key); every peer must be in the site file")
	}
	var tun Tun
	if len(ifc.Tunnels) > 0 {
		tun = ifc.Tunnels[0]
	}
	if len(ifc.Tunnels) > 1 || ifc.TunnelNum > 1 {
		c.warn(&tunNotes, f, line(ln, "general", "tunnel_num"), "tunnel_num %d with %d [tun_N] sections: only the first, [tun_0], is converted; braid runs one TUN device per site file", ifc.TunnelNum, len(ifc.Tunnels))
	}
	ifname := tun.Name
	if ifname == "" {
		ifname = config.TunnelDefaults().Interface
		c.warn(&tunNotes, f, line(ln, "tun_0", ""), "[tun_0] has no name: using braid's default %q", ifname)
	}
	if reason := checkIfname(ifname); reason != "" && tun.Name != "" {
		c.fail(f, line(ln, "tun_0", "name"), "[tun_0] name %s", reason)
	}
	var addrs []netip.Prefix
	var tunComments []string
	if tun.IPv4.IsValid() {
		if tun.IPv4.Addr().IsUnspecified() {
			c.warn(&tunNotes, f, line(ln, "tun_0", "ipv4_addr"), "ipv4_addr %s is no address of the device; left out", tun.IPv4)
		} else {
			addrs = append(addrs, tun.IPv4)
		}
	}
	switch {
	case !tun.IPv6.IsValid():
		tunComments = append(tunComments, "[tun_0] has no ipv6_addr (MPT crashes at start without one; braid does not need it)")
	case tun.IPv6.Addr().IsUnspecified():
		c.warn(&tunNotes, f, line(ln, "tun_0", "ipv6_addr"), "ipv6_addr %s is MPT's workaround for its crash without an IPv6 address, not an address of the device; left out", tun.IPv6)
	default:
		addrs = append(addrs, tun.IPv6)
	}
	hasV6 := slices.ContainsFunc(addrs, func(p netip.Prefix) bool { return p.Addr().Is6() })
	switch {
	case tun.MTU == 0:
	case tun.MTU < 576:
		c.fail(f, line(ln, "tun_0", "mtu"), "[tun_0] mtu %d: braid needs at least 576 (or no mtu, to derive it from the paths)", tun.MTU)
	case hasV6 && tun.MTU < 1280:
		c.fail(f, line(ln, "tun_0", "mtu"), "[tun_0] mtu %d is below the IPv6 minimum of 1280, and the device has an IPv6 address", tun.MTU)
	}

	uplinks := []*outUplink{}
	byKey := map[uplinkKey]*outUplink{}
	uplinkNames := map[string]bool{}
	var peers []*outPeer
	peerNames := map[string]bool{}
	type owner struct {
		what string // the MPT section that has it
		conn int
	}
	remotes := map[netip.AddrPort]owner{}
	var routes []netip.Prefix
	routeOwners := []owner{}
	for ci, conn := range conns {
		pr := c.peer(conn, ci, addrs, peerNames)
		if pr == nil {
			continue
		}
		pr.cmdPort = ifc.CmdPortLocal
		cf, cl := conn.file, conn.lines
		port := conn.LocalPort
		seen := map[string]string{} // uplink + remote -> the path that has it
		for _, p := range conn.Paths {
			op := outPath{from: fmt.Sprintf("[%s] of %s", p.Section, position(cf, line(cl, p.Section, "")))}
			if !c.pathAddrs(conn, &p, ifname, &op.notes) {
				continue
			}
			k := uplinkKey{p.PrivateIP, port}
			if port == 0 {
				k.port = config.DefaultTunnelPort
			}
			u := byKey[k]
			switch {
			case u == nil:
				u = &outUplink{name: uniqueName(sanitize(p.InterfaceName, "uplink"), uplinkNames), ifname: p.InterfaceName, addr: p.PrivateIP, port: port, weight: p.WeightOut,
					from: op.from}
				if s := sanitize(p.InterfaceName, "uplink"); s != p.InterfaceName {
					c.warn(&u.notes, cf, line(cl, p.Section, "interface_name"), "uplink named %q: interface_name %q is not a valid braid name", u.name, p.InterfaceName)
				} else if u.name != s {
					u.comment = fmt.Sprintf("named %s: uplink %s is interface %s with another address or local port", u.name, s, s)
				}
				if p.WeightOut == 0 {
					c.warn(&u.notes, cf, line(cl, p.Section, "weight_out"), "weight_out 0: MPT never sends on this path; braid's weight 0 means the default (1 without a capacity), so the path carries traffic; take it out with 'braid tunnel path down'")
				}
				byKey[k] = u
				uplinks = append(uplinks, u)
			case u.ifname != p.InterfaceName:
				c.fail(cf, line(cl, p.Section, "interface_name"), "[%s] interface_name %q: private_ipaddr %s port %d is also the local end of %s on interface %q; one socket has one interface", p.Section, p.InterfaceName, p.PrivateIP, k.port, u.from, u.ifname)
				continue
			}
			op.uplink = u.name
			op.remote = netip.AddrPortFrom(p.RemoteIP, uint16(conn.RemotePort))
			rl := line(cl, p.Section, "remote_ipaddr")
			if other, dup := seen[u.name+" "+op.remote.String()]; dup {
				c.fail(cf, rl, "[%s] is the same path as %s: private_ipaddr %s to remote_ipaddr %s", p.Section, other, p.PrivateIP, p.RemoteIP)
				continue
			}
			seen[u.name+" "+op.remote.String()] = op.from
			if other, dup := remotes[op.remote]; dup && other.conn != ci {
				c.fail(cf, rl, "[%s] remote_ipaddr %s port %d is also the remote end of %s, another connection: braid tells peers apart by address and port", p.Section, p.RemoteIP, conn.RemotePort, other.what)
				continue
			}
			remotes[op.remote] = owner{op.from, ci}
			if p.WeightOut != u.weight && p.WeightOut != 0 {
				op.weight = p.WeightOut
			}
			if p.WeightOut > maxWeight {
				c.fail(cf, line(cl, p.Section, "weight_out"), "[%s] weight_out %d: braid's weights are at most %d", p.Section, p.WeightOut, maxWeight)
			}
			c.pathWarnings(conn, &p, &op.notes)
			pr.paths = append(pr.paths, op)
		}
		for _, r := range pr.routes {
			for i, o := range routes {
				if o.Overlaps(r) {
					c.fail(cf, line(cl, "connection", ""), "connection %s routes %s, which overlaps %s of %s: a packet must have one peer", conn.Name, r, o, routeOwners[i].what)
					break
				}
			}
		}
		for _, r := range pr.routes {
			routes = append(routes, r)
			routeOwners = append(routeOwners, owner{position(cf, 0), ci})
		}
		peers = append(peers, pr)
	}
	if len(c.errs) > 0 {
		return nil, c.warns, errors.Join(c.errs...)
	}

	out := write(ifc, conns, ifname, addrs, tun.MTU, tunComments, tunNotes, uplinks, peers, len(c.warns))
	if _, err := config.LoadTunnel("converted site file", out, anyMachine{}); err != nil {
		return out, c.warns, fmt.Errorf("the converted site file does not pass braid's checks: %w", err)
	}
	return out, c.warns, nil
}

// anyMachine is a machine that has every interface and no files: the converted file is for the
// site's machine, which 'braid tunnel check' checks there.
type anyMachine struct{}

func (anyMachine) InterfaceExists(string) bool { return true }

func (anyMachine) ReadFile(name string) ([]byte, error) {
	return nil, fmt.Errorf("%s: no files during conversion", name)
}

// peer converts a connection's own settings; nil after an error that leaves no peer.
func (c *converter) peer(conn *Connection, ci int, addrs []netip.Prefix, names map[string]bool) *outPeer {
	f, ln := conn.file, conn.lines
	pr := &outPeer{from: position(f, 0)}
	for _, w := range conn.Warnings {
		c.warn(&pr.notes, w.File, w.Line, "%s", w.Message)
	}
	pr.name = uniqueName(sanitize(conn.Name, fmt.Sprintf("connection-%d", ci+1)), names)
	if pr.name != conn.Name {
		c.warn(&pr.notes, f, line(ln, "connection", "name"), "peer named %q: connection name %q is not a valid braid name (letters, digits, '.', '_', '-', at most %d) or is taken", pr.name, conn.Name, maxName)
	}
	if len(conn.Paths) == 0 {
		c.fail(f, line(ln, "connection", ""), "connection %s has no [path_N] sections", conn.Name)
	} else if len(conn.Paths) > 20 {
		c.fail(f, line(ln, conn.Paths[20].Section, ""), "connection %s has %d paths; MPT and braid's mpt mode allow at most 20", conn.Name, len(conn.Paths))
	}

	// Tunnel addresses and ip_ver.
	rem, loc := conn.IPRemote.Unmap(), conn.IPLocal.Unmap()
	switch {
	case !rem.IsValid():
		c.fail(f, line(ln, "connection", ""), "[connection] has no ip_remote: braid needs the peer's tunnel address (remote_tunnel_ip)")
	case rem.IsUnspecified() || rem.IsMulticast():
		c.fail(f, line(ln, "connection", "ip_remote"), "[connection] ip_remote %s: want the peer's tunnel address", rem)
	}
	if loc.IsValid() && rem.IsValid() && loc.Is4() != rem.Is4() {
		c.fail(f, line(ln, "connection", "ip_local"), "[connection] ip_local %s and ip_remote %s are of different families", loc, rem)
	}
	if loc.IsValid() && len(addrs) > 0 && !slices.ContainsFunc(addrs, func(p netip.Prefix) bool { return p.Addr() == loc }) {
		c.fail(f, line(ln, "connection", "ip_local"), "[connection] ip_local %s is not an address of [tun_0] (ipv4_addr, ipv6_addr)", loc)
	}
	if !loc.IsValid() && rem.IsValid() && !slices.ContainsFunc(addrs, func(p netip.Prefix) bool { return p.Addr().Is4() == rem.Is4() }) {
		c.fail(f, line(ln, "connection", ""), "[connection] has no ip_local, and [tun_0] has no %s address to use instead", family(rem))
	}
	switch {
	case loc == rem && loc.IsValid():
		c.fail(f, line(ln, "connection", "ip_remote"), "[connection] ip_remote %s is also ip_local", rem)
	case rem.IsValid() && slices.ContainsFunc(addrs, func(p netip.Prefix) bool { return p.Addr() == rem }):
		c.fail(f, line(ln, "connection", "ip_remote"), "[connection] ip_remote %s is an address of this end's [tun_0]; want the peer's tunnel address", rem)
	}
	if rem.IsValid() {
		if v := ipVer(rem); v != conn.IPVer {
			how := fmt.Sprintf("ip_ver = %d", conn.IPVer)
			if line(ln, "connection", "ip_ver") == 0 {
				how = "no ip_ver (MPT's default is 6)"
			}
			c.warn(&pr.notes, f, at(ln, "connection", "ip_ver"), "%s, but the tunnel addresses are %s: MPT would misread them and label data with the wrong GRE Protocol Type; braid has no ip_ver and uses remote_tunnel_ip's family (%d). Set ip_ver = %d on the MPT peer", how, family(rem), v, v)
		}
	}
	pr.localIP, pr.remoteIP = loc, rem

	// Reordering and keepalives.
	pr.reorderWindow = conn.ReorderWindow
	if conn.ReorderWindow > maxReorderWindow {
		c.fail(f, line(ln, "connection", "reorder_window"), "[connection] reorder_window %d: MPT's buffer and braid allow at most %d", conn.ReorderWindow, maxReorderWindow)
	}
	pr.maxBuffDelay = conn.MaxBuffDelay
	if pr.maxBuffDelay == 0 {
		pr.maxBuffDelay = defaultMaxBuffDelay
	}
	if pr.maxBuffDelay > 10*time.Second {
		c.fail(f, line(ln, "connection", "max_buffdelay_msec"), "[connection] max_buffdelay_msec %d: braid waits at most 10000 ms for a gap", pr.maxBuffDelay.Milliseconds())
	}
	if len(conn.Paths) > 0 {
		p0 := conn.Paths[0]
		pr.keepalive, pr.dead = p0.KeepaliveTime, p0.DeadTime
		for _, p := range conn.Paths[1:] {
			if p.KeepaliveTime != p0.KeepaliveTime || p.DeadTime != p0.DeadTime {
				c.warn(&pr.notes, f, at(ln, p.Section, "keepalive_time"), "[%s] keepalive_time %v / dead_time %v differ from [%s]'s %v / %v: braid's keepalive and dead_time are per peer; using [%s]'s",
					p.Section, p.KeepaliveTime, p.DeadTime, p0.Section, p0.KeepaliveTime, p0.DeadTime, p0.Section)
			}
		}
		kl, dl := at(ln, p0.Section, "keepalive_time"), at(ln, p0.Section, "dead_time")
		switch {
		case pr.keepalive == 0 && pr.dead != 0:
			c.warn(&pr.notes, f, dl, "dead_time %v without keepalives: no path could come back up; dead_time 0 written", pr.dead)
			pr.dead = 0
		case pr.keepalive == 0:
			c.warn(&pr.notes, f, kl, "keepalive_time 0 (MPT's default): no keepalives, so a failed path is never noticed; consider keepalive_time = 1 and dead_time = 3 on both ends (braid: keepalive = \"1s\", dead_time = \"3s\")")
		case pr.dead < 2*pr.keepalive:
			c.warn(&pr.notes, f, dl, "dead_time %v is less than 2 × keepalive_time (%v): one late keepalive would take a path down; braid requires at least %v, written instead", pr.dead, pr.keepalive, 2*pr.keepalive)
			pr.dead = 2 * pr.keepalive
		}
	}

	// Ports.
	if conn.LocalPort == 0 {
		c.warn(&pr.notes, f, at(ln, "connection", "local_port"), "local_port 0 (MPT's default): MPT sends from an ephemeral port; braid binds tunnel.port %d, so set remote_port = %d for this connection on the MPT peer", config.DefaultTunnelPort, config.DefaultTunnelPort)
	}
	pr.remoteCmdPort = conn.RemoteCmdPort
	if conn.RemoteCmdPort == 0 {
		c.warn(&pr.notes, f, line(ln, "connection", "remote_cmd_port"), "remote_cmd_port 0: MPT's default, 65050, is written instead")
		pr.remoteCmdPort = defaultCmdPort
	}

	// Control plane: braid speaks the path-status exchange with MPT's authentication.
	pr.authType = conn.AuthType
	if conn.AuthType == 2 {
		if _, err := hex.DecodeString(conn.AuthKey); err != nil || conn.AuthKey == "" {
			c.fail(f, line(ln, "connection", "auth_key"), "auth_type 2 needs auth_key in hex; %q is not", conn.AuthKey)
		}
		pr.authKey = strings.ToLower(conn.AuthKey)
	} else if conn.AuthKey != "" {
		c.warn(&pr.notes, f, line(ln, "connection", "auth_key"), "auth_key without auth_type 2 is unused, by MPT too; not carried over")
	}
	if conn.AuthType != 0 {
		kind := map[int]string{1: "a random token", 2: "SHA-256 of message and key"}[conn.AuthType]
		c.warn(&pr.notes, f, line(ln, "connection", "auth_type"), "auth_type %d (%s) covers only the command port (path status changes); mode \"mpt\" carries data unauthenticated and unencrypted, like MPT. Where both ends run braid, use mode = \"braid\" with keys from 'braid keygen'", conn.AuthType, kind)
	}
	if conn.Permission != 0 {
		c.warn(&pr.notes, f, line(ln, "connection", "permission"), "permission %d: braid neither sends nor accepts connection updates; change the site file on both ends instead", conn.Permission)
	}
	if conn.Status != 0 {
		c.warn(&pr.notes, f, line(ln, "connection", "status"), "status %d: braid keeps no saved state; the connection starts up", conn.Status)
	}

	// Routes: the [net_N] destinations and the peer's tunnel address.
	var routes []netip.Prefix
	for _, n := range conn.Nets {
		nl := line(ln, n.Section, "dst_addr")
		if !n.Dst.IsValid() {
			c.warn(&pr.notes, f, line(ln, n.Section, ""), "[%s] has no dst_addr; ignored", n.Section)
			continue
		}
		dst := n.Dst
		if dst.Addr().Is4In6() {
			dst = netip.PrefixFrom(dst.Addr().Unmap(), max(dst.Bits()-96, 0))
		}
		if ipVer(dst.Addr()) != n.IPVer && line(ln, n.Section, "ip_ver") > 0 {
			c.warn(&pr.notes, f, line(ln, n.Section, "ip_ver"), "[%s] ip_ver %d, but dst_addr %s is %s; using the address's family", n.Section, n.IPVer, dst, family(dst.Addr()))
		}
		if dst.Masked() != dst {
			c.warn(&pr.notes, f, nl, "[%s] dst_addr %s has host bits set; routed as %s", n.Section, dst, dst.Masked())
			dst = dst.Masked()
		}
		if n.Src.IsValid() && n.Src.Bits() != 0 {
			c.warn(&pr.notes, f, line(ln, n.Section, "src_addr"), "[%s] src_addr %s: braid routes by destination only; every source reaches %s through this peer", n.Section, n.Src, dst)
		}
		routes = addRoute(c, pr, f, nl, routes, dst, "["+n.Section+"] dst_addr")
	}
	if rem.IsValid() && !rem.IsUnspecified() {
		host := netip.PrefixFrom(rem, rem.BitLen())
		if !slices.ContainsFunc(routes, func(p netip.Prefix) bool { return p.Contains(rem) }) {
			routes = append(routes, host)
		}
	}
	pr.routes = routes
	return pr
}

// addRoute adds dst unless a route of the peer covers it; it replaces routes dst covers.
func addRoute(c *converter, pr *outPeer, f string, ln int, routes []netip.Prefix, dst netip.Prefix, what string) []netip.Prefix {
	for _, r := range routes {
		if r.Overlaps(dst) && r.Bits() <= dst.Bits() {
			c.warn(&pr.notes, f, ln, "%s %s is within %s, routed already", what, dst, r)
			return routes
		}
	}
	kept := routes[:0]
	for _, r := range routes {
		if dst.Overlaps(r) {
			c.warn(&pr.notes, f, ln, "%s %s covers %s, which is left out", what, dst, r)
			continue
		}
		kept = append(kept, r)
	}
	return append(kept, dst)
}

// pathAddrs checks and normalises the addresses of a path; false after an error.
func (c *converter) pathAddrs(conn *Connection, p *Path, tunName string, n *notes) bool {
	f, ln := conn.file, conn.lines
	ok := true
	switch reason := checkIfname(p.InterfaceName); {
	case p.InterfaceName == "":
		c.fail(f, line(ln, p.Section, ""), "[%s] has no interface_name: braid binds each uplink to its interface", p.Section)
		ok = false
	case reason != "":
		c.fail(f, line(ln, p.Section, "interface_name"), "[%s] interface_name %s", p.Section, reason)
		ok = false
	case p.InterfaceName == tunName:
		c.fail(f, line(ln, p.Section, "interface_name"), "[%s] interface_name %q is the tunnel's own device: the tunnel would carry itself", p.Section, p.InterfaceName)
		ok = false
	}
	for _, a := range []struct {
		key  string
		addr *netip.Addr
	}{{"private_ipaddr", &p.PrivateIP}, {"remote_ipaddr", &p.RemoteIP}} {
		kl := line(ln, p.Section, a.key)
		switch v := *a.addr; {
		case !v.IsValid():
			c.fail(f, line(ln, p.Section, ""), "[%s] has no %s", p.Section, a.key)
			ok = false
		case v.Is4In6():
			c.warn(n, f, kl, "[%s] %s %s is IPv4-mapped; written as %s", p.Section, a.key, v, v.Unmap())
			*a.addr = v.Unmap()
		case v.IsUnspecified() || v.IsMulticast() || v.Zone() != "":
			c.fail(f, kl, "[%s] %s %s: braid needs a unicast address without a zone", p.Section, a.key, v)
			ok = false
		}
	}
	if !ok {
		return false
	}
	if p.PrivateIP.Is4() != p.RemoteIP.Is4() {
		c.fail(f, line(ln, p.Section, "remote_ipaddr"), "[%s] remote_ipaddr %s is %s but private_ipaddr %s is %s", p.Section, p.RemoteIP, family(p.RemoteIP), p.PrivateIP, family(p.PrivateIP))
		return false
	}
	if v := ipVer(p.PrivateIP); v != p.IPVer {
		how := fmt.Sprintf("ip_ver = %d", p.IPVer)
		if line(ln, p.Section, "ip_ver") == 0 {
			how = "no ip_ver (MPT's default is 6)"
		}
		c.warn(n, f, at(ln, p.Section, "ip_ver"), "[%s] %s, but its addresses are %s: MPT would misread them; braid uses the addresses' family. Set ip_ver = %d on the MPT side", p.Section, how, family(p.PrivateIP), v)
	}
	return true
}

// pathWarnings reports the keys of a path that braid does not carry over.
func (c *converter) pathWarnings(conn *Connection, p *Path, n *notes) {
	f, ln := conn.file, conn.lines
	if p.PublicIP.IsValid() {
		c.warn(n, f, line(ln, p.Section, "public_ipaddr"), "[%s] public_ipaddr %s: braid binds private_ipaddr and needs no public address; the NAT in front of it is the operator's (the peer's remote must be %s)", p.Section, p.PublicIP, p.PublicIP)
	}
	switch {
	case p.GatewayIP.IsValid() && p.GatewayIP.IsUnspecified():
		c.warn(n, f, line(ln, p.Section, "gw_ipaddr"), "[%s] gw_ipaddr %s: MPT asks NetworkManager for the gateway; braid installs no routes: make sure %s is reached through %s (e.g. a policy route from %s)", p.Section, p.GatewayIP, p.RemoteIP, p.InterfaceName, p.PrivateIP)
	case p.GatewayIP.IsValid():
		c.warn(n, f, line(ln, p.Section, "gw_ipaddr"), "[%s] gw_ipaddr %s: braid installs no routes: route %s via %s on %s yourself (e.g. a policy route from %s)", p.Section, p.GatewayIP, p.RemoteIP, p.GatewayIP, p.InterfaceName, p.PrivateIP)
	}
	if line(ln, p.Section, "weight_in") > 0 {
		c.warn(n, f, line(ln, p.Section, "weight_in"), "[%s] weight_in %d only tells the peer its weight_out; braid does not send weights: set the weight on the peer's side", p.Section, p.WeightIn)
	}
	if p.Status != 0 {
		c.warn(n, f, line(ln, p.Section, "status"), "[%s] status %d: braid keeps no saved path state; the path starts up ('braid tunnel path down' takes it out)", p.Section, p.Status)
	}
	if l := line(ln, p.Section, "window_size"); l > 0 {
		c.warn(n, f, l, "[%s] window_size is unused by MPT too; not carried over", p.Section)
	}
	if l := line(ln, p.Section, "cmd_default"); l > 0 {
		c.warn(n, f, l, "[%s] cmd_default: MPT's reference gives it no meaning braid could follow; not carried over", p.Section)
	}
}

// checkIfname returns why name cannot be a network interface name, or "" (as config does).
func checkIfname(name string) string {
	switch {
	case !utf8.ValidString(name):
		return fmt.Sprintf("%q is not UTF-8, which a site file cannot hold", name)
	case len(name) > 15:
		return fmt.Sprintf("%q is longer than 15 characters", name)
	case name == "." || name == ".." || strings.ContainsAny(name, "/:% \t\n\r\v\f\x00"):
		return fmt.Sprintf("%q is not a valid interface name", name)
	}
	return ""
}

func ipVer(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// sanitize makes s a valid braid name: letters, digits, '.', '_', '-', at most 32, starting
// with a letter or digit; fallback if nothing is left.
func sanitize(s, fallback string) string {
	if len(s) <= maxName && nameRE.MatchString(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'):
			b.WriteRune(r)
		case r == '.' || r == '_' || r == '-':
			if b.Len() > 0 {
				b.WriteRune(r)
			}
		default:
			if b.Len() > 0 {
				b.WriteByte('-')
			}
		}
	}
	out := strings.TrimRight(b.String(), "-")
	if len(out) > maxName {
		out = out[:maxName]
	}
	if out == "" {
		return fallback
	}
	return out
}

// uniqueName returns name, or name-2, name-3, ... if taken, and marks it taken.
func uniqueName(name string, taken map[string]bool) string {
	out := name
	for i := 2; taken[out]; i++ {
		suffix := fmt.Sprintf("-%d", i)
		out = name[:min(len(name), maxName-len(suffix))] + suffix
	}
	taken[out] = true
	return out
}

// q writes s as a TOML basic string.
func q(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func qList[T fmt.Stringer](list []T) string {
	parts := make([]string, len(list))
	for i, x := range list {
		parts[i] = q(x.String())
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func dur(d time.Duration) string {
	if d == 0 {
		return `"0"`
	}
	return q(d.String())
}

// comment makes s safe for a one-line TOML comment.
func comment(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// write produces the site file.
func write(ifc *Interface, conns []*Connection, ifname string, addrs []netip.Prefix, mtu int, tunComments []string, tunNotes notes,
	uplinks []*outUplink, peers []*outPeer, nwarn int) []byte {
	var b strings.Builder
	kv := func(indent, key, value, note string) {
		l := indent + key + " = " + value
		if note != "" {
			l = fmt.Sprintf("%-38s # %s", l, comment(note))
		}
		b.WriteString(l + "\n")
	}
	notesOut := func(indent string, ns notes) {
		for _, w := range ns {
			b.WriteString(indent + "# WARNING: " + comment(w.File+lineSuffix(w.Line)+": "+w.Message) + "\n")
		}
	}
	b.WriteString("# braid site file converted from MPT's configuration by 'braid tunnel import-mpt':\n")
	b.WriteString("#   " + comment(position(ifc.file, 0)) + "\n")
	for _, c := range conns {
		b.WriteString("#   " + comment(position(c.file, 0)) + "\n")
	}
	b.WriteString(`#
# Mode "mpt" speaks MPT-GRE, so that this site interoperates with MPT peers. Like MPT's data
# plane it has no authentication, integrity or encryption: anyone who can send from a peer's
# address can inject packets. Once both ends run braid, switch to mode = "braid" with keys from
# 'braid keygen' (authenticated, encrypted, probed paths; see internal/config/testdata).
#
# Check this file on the site's machine: braid tunnel check --config FILE
`)
	if nwarn > 0 {
		fmt.Fprintf(&b, "#\n# %d warning(s): what braid does not carry over is marked WARNING below.\n", nwarn)
	}
	b.WriteString("\n[tunnel]\n")
	kv("", "mode", q(string(config.ModeMPT)), "MPT-GRE framing and keepalives; no keys, no crypto")
	kv("", "interface", q(ifname), "TUN device: [tun_0] name")
	for _, s := range tunComments {
		b.WriteString("# " + comment(s) + "\n")
	}
	kv("", "address", qList(addrs), "[tun_0] ipv4_addr, ipv6_addr")
	if mtu == 0 {
		kv("", "mtu", "0", "[tun_0] has no mtu: derived from the paths")
	} else {
		kv("", "mtu", strconv.Itoa(mtu), "[tun_0] mtu")
	}
	kv("", "port", strconv.Itoa(config.DefaultTunnelPort), "local UDP port of the uplinks with port 0")
	kv("", "scheduler", q(string(config.SchedulerWRR)), "MPT's smooth weighted round robin over weight_out")
	d := config.TunnelDefaults()
	kv("", "metrics", q(d.Metrics.String()), "status and Prometheus endpoint ('braid status'); \"\" disables")
	kv("", "control", q(d.Control), "'braid tunnel path up|down|weight' (MPT's 'path up|down')")
	notesOut("", tunNotes)

	for _, u := range uplinks {
		b.WriteString("\n[[tunnel.uplink]]\n")
		b.WriteString("# from " + comment(u.from) + "\n")
		if u.comment != "" {
			b.WriteString("# " + comment(u.comment) + "\n")
		}
		kv("", "name", q(u.name), "")
		kv("", "interface", q(u.ifname), "interface_name")
		kv("", "address", q(u.addr.String()), "private_ipaddr")
		if u.port == 0 {
			kv("", "port", "0", "local_port 0: tunnel.port")
		} else {
			kv("", "port", strconv.Itoa(u.port), "local_port")
		}
		if u.weight > 0 {
			kv("", "weight", strconv.Itoa(u.weight), "weight_out")
		}
		notesOut("", u.notes)
	}

	for _, p := range peers {
		b.WriteString("\n[[tunnel.peer]]\n")
		b.WriteString("# from " + comment(p.from) + "\n")
		kv("", "name", q(p.name), "[connection] name")
		kv("", "routes", qList(p.routes), "[net_N] dst_addr and ip_remote")
		note := "reorder_window: 0 = off (no GRE sequence numbers)"
		if p.reorderWindow > 0 {
			note = "reorder_window: both ends must have reordering on"
		}
		kv("", "reorder_window", strconv.Itoa(p.reorderWindow), note)
		kv("", "max_buffdelay", dur(p.maxBuffDelay), "max_buffdelay_msec (0 = 100ms)")
		kv("", "keepalive", dur(p.keepalive), "keepalive_time; \"0\" = none")
		kv("", "dead_time", dur(p.dead), "dead_time")
		if p.localIP.IsValid() {
			kv("", "local_tunnel_ip", q(p.localIP.String()), "ip_local")
		}
		kv("", "remote_tunnel_ip", q(p.remoteIP.String()), "ip_remote")
		kv("", "cmd_port", strconv.Itoa(p.cmdPort), "cmdport_local; 0 = none")
		if p.cmdPort != 0 {
			kv("", "remote_cmd_port", strconv.Itoa(p.remoteCmdPort), "remote_cmd_port")
			if p.authType != 0 {
				kv("", "auth_type", strconv.Itoa(p.authType), "auth_type")
			}
			if p.authType == 2 {
				b.WriteString("# auth_key is a secret: keep this file readable by root only\n")
				kv("", "auth_key", q(p.authKey), "auth_key")
			}
		}
		if p.reorderWindow > 0 && p.maxBuffDelay > 20*time.Millisecond {
			b.WriteString("# MPT waits max_buffdelay for every lost packet: with 900 packets / 300ms a TCP flow\n" +
				"# falls to some 40 Mbit/s (tunnels.md section 3); braid mode adapts the wait to the RTTs.\n")
		}
		notesOut("", p.notes)
		for _, pp := range p.paths {
			b.WriteString("\n  [[tunnel.peer.path]]\n")
			b.WriteString("  # from " + comment(pp.from) + "\n")
			kv("  ", "uplink", q(pp.uplink), "interface_name")
			kv("  ", "remote", q(pp.remote.String()), "remote_ipaddr, remote_port")
			if pp.weight > 0 {
				kv("  ", "weight", strconv.Itoa(pp.weight), "weight_out")
			}
			notesOut("  ", pp.notes)
		}
	}
	return []byte(b.String())
}

func lineSuffix(n int) string {
	if n > 0 {
		return ":" + strconv.Itoa(n)
	}
	return ""
}
