package mptconf

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"braid/internal/config"
)

// anyEnv is a machine with every interface and no files.
type anyEnv struct{}

func (anyEnv) InterfaceExists(string) bool { return true }

func (anyEnv) ReadFile(name string) ([]byte, error) { return nil, os.ErrNotExist }

const (
	ifcFile   = "testdata/conf/interface.conf"
	noV6File  = "testdata/conf/interface-noipv6.conf"
	siteBFile = "testdata/conf/connections/site-b.conf"
	ipv4File  = "testdata/conf/connections/ipv4.conf"
)

func readInterface(t *testing.T, name string) *Interface {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	ifc, err := ParseInterface(name, data)
	if err != nil {
		t.Fatal(err)
	}
	return ifc
}

func readConnection(t *testing.T, name string) *Connection {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConnection(name, data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// convert converts and loads the result as 'braid tunnel' would.
func convert(t *testing.T, ifc *Interface, conns ...*Connection) (*config.Tunnel, string, []Warning) {
	t.Helper()
	out, warns, err := ToSiteTOML(ifc, conns)
	if err != nil {
		t.Fatalf("ToSiteTOML: %v\n%s", err, out)
	}
	cfg, err := config.LoadTunnel("site.toml", out, anyEnv{})
	if err != nil {
		t.Fatalf("LoadTunnel: %v\n%s", err, out)
	}
	return cfg, string(out), warns
}

func hasWarning(ws []Warning, file string, line int, words ...string) bool {
	return slices.ContainsFunc(ws, func(w Warning) bool {
		if w.File != file || (line != 0 && w.Line != line) {
			return false
		}
		for _, s := range words {
			if !strings.Contains(w.Message, s) {
				return false
			}
		}
		return true
	})
}

func TestParseTestdata(t *testing.T) {
	ifc := readInterface(t, ifcFile)
	want := Tun{Name: "tun0", MTU: 1440, IPv4: netip.MustParsePrefix("10.0.0.2/24"), IPv6: netip.MustParsePrefix("fec0::2/64")}
	if ifc.TunnelNum != 1 || !ifc.AcceptRemote || ifc.CmdPortLocal != 60456 || len(ifc.Tunnels) != 1 || ifc.Tunnels[0] != want {
		t.Errorf("interface.conf: %+v", ifc)
	}
	if len(ifc.Warnings) != 0 {
		t.Errorf("interface.conf warnings: %v", ifc.Warnings)
	}

	c := readConnection(t, siteBFile)
	if c.Name != "site-b" || c.IPVer != 4 || c.IPLocal != netip.MustParseAddr("10.0.0.2") || c.IPRemote != netip.MustParseAddr("10.0.0.1") ||
		c.LocalPort != 23456 || c.RemotePort != 23456 || c.ReorderWindow != 900 || c.MaxBuffDelay != 300*time.Millisecond || c.AuthType != 2 {
		t.Errorf("site-b.conf: %+v", c)
	}
	if len(c.Paths) != 2 || len(c.Nets) != 1 {
		t.Fatalf("site-b.conf: %d paths, %d nets", len(c.Paths), len(c.Nets))
	}
	p := c.Paths[0]
	if p.InterfaceName != "eth1" || p.IPVer != 4 || p.PrivateIP != netip.MustParseAddr("192.168.1.2") || p.PublicIP != netip.MustParseAddr("192.0.2.2") ||
		p.GatewayIP != netip.MustParseAddr("192.168.1.1") || p.RemoteIP != netip.MustParseAddr("198.51.100.1") ||
		p.KeepaliveTime != 5*time.Second || p.DeadTime != 11*time.Second || p.WeightIn != 10 || p.WeightOut != 10 {
		t.Errorf("path_0: %+v", p)
	}
	if g := c.Paths[1].GatewayIP; g != netip.IPv4Unspecified() {
		t.Errorf("path_1 gateway %v", g)
	}
	if n := c.Nets[0]; n.IPVer != 4 || n.Src != netip.MustParsePrefix("0.0.0.0/0") || n.Dst != netip.MustParsePrefix("10.2.0.0/16") {
		t.Errorf("net_0: %+v", n)
	}
}

// The main test: MPT's sample configuration becomes a site file that braid loads, with the
// same paths and MPT settings.
func TestConvertLoads(t *testing.T) {
	cfg, out, warns := convert(t, readInterface(t, ifcFile), readConnection(t, siteBFile))
	if cfg.Mode != config.ModeMPT || cfg.Braid != nil || cfg.Interface != "tun0" || cfg.MTU != 1440 || cfg.Scheduler != config.SchedulerWRR {
		t.Errorf("tunnel: mode %s, interface %s, mtu %d, scheduler %s", cfg.Mode, cfg.Interface, cfg.MTU, cfg.Scheduler)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24"), netip.MustParsePrefix("fec0::2/64")}; !slices.Equal(cfg.Addresses, want) {
		t.Errorf("addresses %v, want %v", cfg.Addresses, want)
	}
	type up struct {
		name, ifname string
		socket       netip.AddrPort
		weight       int
	}
	var ups []up
	for _, u := range cfg.Uplinks {
		ups = append(ups, up{u.Name, u.Interface, u.Socket(cfg.Port), u.Weight})
	}
	wantUps := []up{
		{"eth1", "eth1", netip.MustParseAddrPort("192.168.1.2:23456"), 10},
		{"wwan0", "wwan0", netip.MustParseAddrPort("192.168.2.2:23456"), 1},
	}
	if !slices.Equal(ups, wantUps) {
		t.Errorf("uplinks %+v, want %+v", ups, wantUps)
	}
	if len(cfg.Peers) != 1 {
		t.Fatalf("%d peers", len(cfg.Peers))
	}
	pr := cfg.Peers[0]
	if pr.Name != "site-b" || !pr.PublicKey.IsZero() {
		t.Errorf("peer %q", pr.Name)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("10.0.0.1/32")}; !slices.Equal(pr.Routes, want) {
		t.Errorf("routes %v, want %v", pr.Routes, want)
	}
	wantPaths := []config.PeerPath{
		{Uplink: "eth1", Remote: netip.MustParseAddrPort("198.51.100.1:23456")},
		{Uplink: "wwan0", Remote: netip.MustParseAddrPort("198.51.100.130:23456")},
	}
	if !slices.Equal(pr.Paths, wantPaths) {
		t.Errorf("paths %+v, want %+v", pr.Paths, wantPaths)
	}
	wantMPT := config.MPTSettings{
		ReorderWindow: 900, MaxBuffDelay: 300 * time.Millisecond, Keepalive: 5 * time.Second, DeadTime: 11 * time.Second,
		LocalTunnelIP: netip.MustParseAddr("10.0.0.2"), RemoteTunnelIP: netip.MustParseAddr("10.0.0.1"),
		CmdPort: 60456, RemoteCmdPort: 60456, AuthType: 2, AuthKey: "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f",
	}
	if pr.MPT == nil || *pr.MPT != wantMPT {
		t.Errorf("mpt settings %+v, want %+v", pr.MPT, wantMPT)
	}

	// What braid cannot carry over, with the MPT file and line.
	for _, w := range []struct {
		file  string
		line  int
		words []string
	}{
		{ifcFile, 6, []string{"accept_remote"}},
		{siteBFile, 5, []string{"permission"}},
		{siteBFile, 17, []string{"auth_type", "command port", "unauthenticated", "mode = \"braid\"", "braid keygen"}},
		{siteBFile, 23, []string{"public_ipaddr", "private_ipaddr"}},
		{siteBFile, 25, []string{"gw_ipaddr 192.168.1.1", "route"}},
		{siteBFile, 29, []string{"weight_in"}},
		{siteBFile, 39, []string{"gw_ipaddr 0.0.0.0", "NetworkManager"}},
	} {
		if !hasWarning(warns, w.file, w.line, w.words...) {
			t.Errorf("no warning %s:%d about %q in %v", w.file, w.line, w.words, warns)
		}
	}
	for _, w := range warns {
		if !strings.Contains(out, "# WARNING: "+w.File+lineSuffix(w.Line)+": "+w.Message+"\n") {
			t.Errorf("warning %v is not a comment of the output", w)
		}
	}
	// The command ports and the control plane's authentication are carried over.
	for _, want := range []string{"cmd_port = 60456 ", "remote_cmd_port = 60456 ", "auth_type = 2 ", `auth_key = "000102030405060708090a0b0c0d0e0f"`} {
		if !strings.Contains(out, "\n"+want) {
			t.Errorf("the output has no %q", want)
		}
	}
	if !strings.Contains(out, "unauthenticated") && !strings.Contains(out, "no authentication") {
		t.Error("the output does not say that mpt mode is unauthenticated")
	}
}

// MPT's quirks: no ip_ver (6), the ::/0 workaround for a missing ipv6_addr, no ports, no
// keepalives; and two connections sharing an interface on different local ports.
func TestConvertQuirks(t *testing.T) {
	cfg, _, warns := convert(t, readInterface(t, noV6File), readConnection(t, ipv4File))
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24")}; !slices.Equal(cfg.Addresses, want) {
		t.Errorf("addresses %v, want %v (::/0 left out)", cfg.Addresses, want)
	}
	if !hasWarning(warns, noV6File, 9, "::/0", "workaround") {
		t.Errorf("no warning about ipv6_addr ::/0: %v", warns)
	}
	if !hasWarning(warns, ipv4File, 3, "no ip_ver", "default is 6", "IPv4") {
		t.Errorf("no warning about the default ip_ver: %v", warns)
	}
	if !hasWarning(warns, ipv4File, 3, "local_port 0", "4754") {
		t.Errorf("no warning about local_port 0: %v", warns)
	}
	pr := cfg.Peers[0]
	if pr.Name != "ipv4" || pr.MPT.Keepalive != 0 || pr.MPT.DeadTime != 0 || pr.MPT.ReorderWindow != 0 || pr.MPT.MaxBuffDelay != 100*time.Millisecond {
		t.Errorf("peer %s: %+v", pr.Name, pr.MPT)
	}
	if got := pr.Paths[0].Remote; got != netip.MustParseAddrPort("203.0.113.7:65000") {
		t.Errorf("remote %v: want MPT's default remote_port 65000", got)
	}
	if got := cfg.Uplinks[0].Socket(cfg.Port); got != netip.MustParseAddrPort("192.168.1.2:4754") {
		t.Errorf("uplink socket %v: want the tunnel's default port", got)
	}

	cfg, _, _ = convert(t, readInterface(t, ifcFile), readConnection(t, siteBFile), readConnection(t, ipv4File))
	var names []string
	for _, u := range cfg.Uplinks {
		names = append(names, u.Name+"@"+u.Socket(cfg.Port).String())
	}
	want := []string{"eth1@192.168.1.2:23456", "wwan0@192.168.2.2:23456", "eth1-2@192.168.1.2:4754"}
	if !slices.Equal(names, want) {
		t.Errorf("uplinks %v, want %v", names, want)
	}
	if len(cfg.Peers) != 2 || cfg.Peers[1].Paths[0].Uplink != "eth1-2" {
		t.Errorf("peers %+v", cfg.Peers)
	}
}

func TestParseINI(t *testing.T) {
	type kv struct{ sec, key, value string }
	for _, tc := range []struct {
		name  string
		in    string
		want  []kv
		warns []int  // lines of warnings
		err   string // "line: words"
	}{
		{name: "comments and blanks", in: "# top\n; also\n\n[a]\nx=1\n  # indented\n\t; tab\ny = two words  # trailing\nz = a#b;c\n",
			want: []kv{{"a", "x", "1"}, {"a", "y", "two words"}, {"a", "z", "a#b;c"}}},
		{name: "whitespace and CRLF", in: "\uFEFF  [ sec ]  \r\n  key\t=\t value \r\nempty =\r\n",
			want: []kv{{"sec", "key", "value"}, {"sec", "empty", ""}}},
		{name: "quotes", in: "[s]\na = \"x y\"\nb = 'z'\nc = \"\n",
			want: []kv{{"s", "a", "x y"}, {"s", "b", "z"}, {"s", "c", "\""}}},
		{name: "case-insensitive lookup", in: "[Path_0]\nInterface_Name = eth0\n",
			want: []kv{{"path_0", "interface_name", "eth0"}}},
		{name: "duplicate key: last wins", in: "[s]\nk = 1\nk = 2\n",
			want: []kv{{"s", "k", "2"}}, warns: []int{3}},
		{name: "repeated section merges", in: "[s]\na = 1\n[t]\n[s]\nb = 2\n",
			want: []kv{{"s", "a", "1"}, {"s", "b", "2"}}, warns: []int{4}},
		{name: "value with equals", in: "[s]\nk = a=b\n", want: []kv{{"s", "k", "a=b"}}},
		{name: "key outside a section", in: "# c\nname = x\n[s]\n", err: "2: outside any section"},
		{name: "malformed line", in: "[s]\na = 1\njust words\n", err: "3: malformed line"},
		{name: "unclosed header", in: "[s]\n[t\n", err: "2: malformed section header"},
		{name: "empty header", in: "[]\n", err: "1: malformed section header"},
		{name: "text after header", in: "\n[s] x\n", err: "2: after the section header"},
		{name: "no key", in: "[s]\n = 1\n", err: "2: no key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ParseINI("x.conf", []byte(tc.in))
			if tc.err != "" {
				line, words, _ := strings.Cut(tc.err, ": ")
				var e *Error
				if err == nil || !errors.As(err, &e) || !strings.HasPrefix(err.Error(), "x.conf:"+line+": ") || !strings.Contains(err.Error(), words) {
					t.Errorf("error %v, want x.conf:%s: ...%s...", err, line, words)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				k := f.Section(w.sec).Key(w.key)
				if k == nil || k.Value != w.value {
					t.Errorf("[%s] %s = %+v, want %q", w.sec, w.key, k, w.value)
				}
			}
			var lines []int
			for _, w := range f.Warnings {
				lines = append(lines, w.Line)
				if w.File != "x.conf" {
					t.Errorf("warning names %q", w.File)
				}
			}
			if !slices.Equal(lines, tc.warns) {
				t.Errorf("warnings %v, want lines %v", f.Warnings, tc.warns)
			}
		})
	}
	f, _ := ParseINI("x.conf", []byte("[s]\na = 1\n\nb = 2\n"))
	if k := f.Section("s").Key("b"); k.Line != 4 || f.Sections[0].Line != 1 {
		t.Errorf("lines: key b %d, section %d", k.Line, f.Sections[0].Line)
	}
}

func TestConnectionDefaults(t *testing.T) {
	in := "[connection]\nip_local = 10.0.0.2\nip_remote = 10.0.0.1\n[path_0]\ninterface_name = eth0\nprivate_ipaddr = 192.0.2.1\nremote_ipaddr = 198.51.100.1\n" +
		"[path_1]\ninterface_name = eth1\nkeepalive_time = 2\n[net_0]\ndst_addr = 10.9.0.0/16\n"
	c, err := ParseConnection("conf/connections/office.conf", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "office" || c.IPVer != 6 || c.LocalPort != 0 || c.RemotePort != 65000 || c.ReorderWindow != 0 ||
		c.MaxBuffDelay != 100*time.Millisecond || c.AuthType != 0 {
		t.Errorf("connection defaults: %+v", c)
	}
	p0, p1 := c.Paths[0], c.Paths[1]
	if p0.IPVer != 6 || p0.KeepaliveTime != 0 || p0.DeadTime != 0 || p0.WeightOut != 1 || p0.WeightIn != 1 {
		t.Errorf("path defaults: %+v", p0)
	}
	if p1.KeepaliveTime != 2*time.Second || p1.DeadTime != 6*time.Second {
		t.Errorf("dead_time default: %+v, want 3 × keepalive", p1)
	}
	if c.Nets[0].IPVer != 6 || c.Nets[0].Src.IsValid() {
		t.Errorf("net defaults: %+v", c.Nets[0])
	}

	c, err = ParseConnection("c.conf", []byte("[connection]\nmax_buffdelay_msec = 0\n"))
	if err != nil || c.MaxBuffDelay != 100*time.Millisecond {
		t.Errorf("max_buffdelay_msec 0: %v, %v; want 100ms", c, err)
	}
}

func TestConnectionCountsAndUnknown(t *testing.T) {
	in := "[connection]\nname = x\npath_count = 1\nnetwork_count = 0\ncolour = blue\n" +
		"[path_0]\ninterface_name = eth0\nmystery = 1\n[path_1]\ninterface_name = eth1\n[net_0]\ndst_addr = 10.0.0.0/8\n[extra]\n"
	c, err := ParseConnection("c.conf", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Paths) != 1 || len(c.Nets) != 0 {
		t.Errorf("%d paths, %d nets: want what path_count and network_count say", len(c.Paths), len(c.Nets))
	}
	for _, w := range []struct {
		line int
		word string
	}{{5, "colour"}, {8, "mystery"}, {9, "path_count"}, {11, "network_count"}, {13, "[extra]"}} {
		if !hasWarning(c.Warnings, "c.conf", w.line, w.word) {
			t.Errorf("no warning c.conf:%d about %s: %v", w.line, w.word, c.Warnings)
		}
	}
	if _, err := ParseConnection("c.conf", []byte("[connection]\npath_count = 3\n[path_0]\n")); err == nil || !strings.HasPrefix(err.Error(), "c.conf:2: ") {
		t.Errorf("path_count beyond the sections: %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"[general]\n", "c.conf: no [connection] section"},
		{"[connection]\nip_ver = 5\n", "c.conf:2: [connection] ip_ver"},
		{"[connection]\nip_remote = 10.0.0\n", "c.conf:2: [connection] ip_remote"},
		{"[connection]\nremote_port = 70000\n", "c.conf:2: [connection] remote_port"},
		{"[connection]\n[path_0]\nkeepalive_time = 1.5\n", "c.conf:3: [path_0] keepalive_time"},
		{"[connection]\n[net_0]\ndst_addr = 10.0.0.0/33\n", "c.conf:3: [net_0] dst_addr"},
	} {
		_, err := ParseConnection("c.conf", []byte(tc.in))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %s...", tc.in, err, tc.want)
		}
	}
	if _, err := ParseInterface("i.conf", []byte("[tun_0]\nmtu = big\n")); err == nil || !strings.HasPrefix(err.Error(), "i.conf:2: [tun_0] mtu") {
		t.Errorf("bad mtu: %v", err)
	}
	if _, err := ParseInterface("i.conf", []byte("[connection]\nname = x\n")); err == nil || !strings.Contains(err.Error(), "no [tun_0]") {
		t.Errorf("a connection file as interface.conf: %v", err)
	}
}

// What braid refuses is an error naming the MPT file and line; what it only cannot express is
// a warning, and the result still loads.
func TestConvertErrorsAndFixes(t *testing.T) {
	ifc := readInterface(t, ifcFile)
	base := "[connection]\nname = b\nip_ver = 4\nip_local = 10.0.0.2\nip_remote = 10.0.0.1\nlocal_port = 23456\n" +
		"[path_0]\ninterface_name = eth1\nip_ver = 4\nprivate_ipaddr = 192.168.1.2\nremote_ipaddr = 198.51.100.1\n" // path_0 at line 7
	for _, tc := range []struct {
		name, in, err string
	}{
		{"ip_local not on tun0", strings.Replace(base, "ip_local = 10.0.0.2", "ip_local = 10.0.0.9", 1), "b.conf:4: [connection] ip_local 10.0.0.9"},
		{"no ip_remote", strings.Replace(base, "ip_remote = 10.0.0.1", "", 1), "b.conf:1: [connection] has no ip_remote"},
		{"no remote_ipaddr", strings.Replace(base, "remote_ipaddr = 198.51.100.1", "", 1), "b.conf:7: [path_0] has no remote_ipaddr"},
		{"families differ", strings.Replace(base, "remote_ipaddr = 198.51.100.1", "remote_ipaddr = 2001:db8::1", 1), "b.conf:11: [path_0] remote_ipaddr"},
		{"unspecified private", strings.Replace(base, "192.168.1.2", "0.0.0.0", 1), "b.conf:10: [path_0] private_ipaddr 0.0.0.0"},
		{"reorder window", base + "[connection]\nreorder_window = 20000\n", "b.conf:13: [connection] reorder_window 20000"},
		{"no paths", base[:strings.Index(base, "[path_0]")], "b.conf:1: connection b has no [path_N]"},
		{"ip_remote is ours", strings.Replace(base, "ip_local = 10.0.0.2\nip_remote = 10.0.0.1", "ip_remote = 10.0.0.2", 1), "b.conf:4: [connection] ip_remote 10.0.0.2 is an address of this end"},
		{"bad interface name", strings.Replace(base, "= eth1", "= a very long interface", 1), "b.conf:8: [path_0] interface_name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConnection("b.conf", []byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = ToSiteTOML(ifc, []*Connection{c})
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("error %v, want %s", err, tc.err)
			}
		})
	}

	// Two connections that braid could not tell apart.
	b := readConnection(t, siteBFile)
	_, _, err := ToSiteTOML(ifc, []*Connection{b, b})
	for _, want := range []string{siteBFile + ":40: [path_1] remote_ipaddr 198.51.100.130 port 23456 is also the remote end of [path_1]", siteBFile + ":3: connection site-b routes 10.2.0.0/16"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("the same connection twice: %v, want %s", err, want)
		}
	}

	// Fixed with a warning: dead_time below 2 × keepalive, nets within nets, host bits,
	// an invalid name, weight_out 0.
	in := strings.Replace(base, "name = b", "name = my office!", 1) +
		"keepalive_time = 5\ndead_time = 6\nweight_out = 0\n[net_0]\ndst_addr = 10.2.0.0/16\n[net_1]\ndst_addr = 10.2.3.0/24\n[net_2]\ndst_addr = 10.4.1.1/16\n[net_3]\ndst_addr = 10.0.0.0/24\n"
	c, err := ParseConnection("b.conf", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, warns := convert(t, ifc, c)
	pr := cfg.Peers[0]
	if pr.Name != "my-office" || pr.MPT.DeadTime != 10*time.Second {
		t.Errorf("peer %q, dead_time %v", pr.Name, pr.MPT.DeadTime)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("10.4.0.0/16"), netip.MustParsePrefix("10.0.0.0/24")}; !slices.Equal(pr.Routes, want) {
		t.Errorf("routes %v, want %v (the tunnel address is within net_3)", pr.Routes, want)
	}
	for _, w := range []struct {
		line int
		word string
	}{{2, "not a valid braid name"}, {13, "dead_time"}, {14, "weight_out 0"}, {18, "within 10.2.0.0/16"}, {20, "host bits"}} {
		if !hasWarning(warns, "b.conf", w.line, w.word) {
			t.Errorf("no warning b.conf:%d about %q: %v", w.line, w.word, warns)
		}
	}
}

func TestTOMLString(t *testing.T) {
	for in, want := range map[string]string{
		`a"b\c`:    `"a\"b\\c"`,
		"t\tn\x01": `"t\tn\u0001"`,
		"\xff":     "\"\uFFFD\"",
	} {
		if got := q(in); got != want {
			t.Errorf("q(%q) = %s, want %s", in, got, want)
		}
	}
}

func FuzzParseINI(f *testing.F) {
	for _, name := range []string{ifcFile, noV6File, siteBFile, ipv4File} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	both, _ := os.ReadFile(ifcFile)
	conn, _ := os.ReadFile(siteBFile)
	f.Add(append(both, conn...)) // parses as an interface.conf and a connection file
	f.Add([]byte("[tun_0]\nname = tun0\nipv4_addr = 10.0.0.2/24\nipv6_addr = fec0::2/64\n[connection]\nip_local = 10.0.0.2\nip_remote = 10.0.0.1\n" +
		"[path_0]\ninterface_name = eth1\nprivate_ipaddr = 192.168.1.2\nremote_ipaddr = 198.51.100.1\nkeepalive_time = 5\n" +
		"[path_1]\ninterface_name = eth3\nip_ver = 6\nprivate_ipaddr = 2001:db8::2\nremote_ipaddr = 2001:db8:1::1\ndead_time = 1\n" +
		"[net_0]\ndst_addr = 10.2.0.0/16\n[net_1]\ndst_addr = fd00::/8\nsrc_addr = ::/0\n"))
	f.Add([]byte("k = v\n"))
	f.Add([]byte("[s\n"))
	f.Add([]byte("[s]\nk = 1\nk = 2 # c\n\x00=\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.conf"
		ini, err := ParseINI(name, data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), name+":") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		for _, w := range ini.Warnings {
			if w.File != name || w.Line < 1 {
				t.Fatalf("warning %v", w)
			}
		}
		// The typed parsers and the conversion must not panic either, and their errors name
		// the file too.
		ifc, ierr := ParseInterface(name, data)
		conn, cerr := ParseConnection(name, data)
		for _, err := range []error{ierr, cerr} {
			if err != nil && !strings.HasPrefix(err.Error(), name) {
				t.Fatalf("error %q does not name the file", err)
			}
		}
		if ierr == nil && cerr == nil {
			// What braid refuses is found in the MPT file, with its name, rather than by
			// ToSiteTOML's final check of its own output.
			out, _, err := ToSiteTOML(ifc, []*Connection{conn})
			if err != nil && !strings.HasPrefix(err.Error(), name) {
				t.Fatalf("error %q does not name the file\n%s", err, out)
			}
			if err == nil {
				if _, err := config.LoadTunnel("site.toml", out, anyEnv{}); err != nil {
					t.Fatalf("ToSiteTOML's output does not load: %v\n%s", err, out)
				}
			}
		}
	})
}
