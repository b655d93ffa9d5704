package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/tunnel/session"
)

// Keys of the example sites (testdata/site-a.toml and site-b.toml).
const (
	privA = "wB8fFB8xS3HvLMGl2t3mK483HldKDnihb0OKvvtZjE4="
	pubA  = "PgTjwh4m5XrnGURITJbyP9nYpP4LYw+2BQ0Dy4kCCy0="
	privB = "eLbs3ZmLustSI8WZ8y0risifhGH33714ZjfEQD5BoUI="
	pubB  = "kNFgvm0zohX7Tn/U2+RUgotvyA+QKhM7UUAg+OlsKxI="
	pubC  = "PgTjwh4m5XrnGURITJbyP9nYpP4LYw+2BQ0Dy4kCCyA=" // a third peer
)

// fakeEnv is a machine with a few interfaces and key files.
type fakeEnv struct {
	ifaces map[string]bool
	files  map[string]string
}

func (e *fakeEnv) InterfaceExists(name string) bool { return e.ifaces[name] }

func (e *fakeEnv) ReadFile(name string) ([]byte, error) {
	if name == "/etc/braid/unreadable.key" {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EACCES}
	}
	s, ok := e.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
	}
	return []byte(s), nil
}

func newEnv() *fakeEnv {
	return &fakeEnv{
		ifaces: map[string]bool{"wan0": true, "wan1": true, "wwan0": true, "eth0": true, "ppp0": true},
		files: map[string]string{
			"/etc/braid/site-a.key":   privA + "\n",
			"/etc/braid/site-b.key":   privB + "\n",
			"/etc/braid/garbage.key":  "not a key\n",
			"/srv/site/keys/site.key": privA + "\n",
		},
	}
}

func mustPriv(t *testing.T, s string) session.PrivateKey {
	t.Helper()
	k, err := session.ParsePrivateKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustPub(t *testing.T, s string) session.PublicKey {
	t.Helper()
	k, err := session.ParsePublicKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pfx(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

var (
	ip = netip.MustParseAddr
	ap = netip.MustParseAddrPort
	ms = time.Millisecond
)

func loadFile(t *testing.T, path string) *Tunnel {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tun, err := LoadTunnel(path, data, newEnv())
	if err != nil {
		t.Fatalf("LoadTunnel(%s): %v", path, err)
	}
	if err := tun.Validate(newEnv()); err != nil {
		t.Errorf("Validate of the loaded %s: %v", path, err)
	}
	return tun
}

func TestLoadExamples(t *testing.T) {
	a := loadFile(t, "testdata/site-a.toml")
	wantA := &Tunnel{
		Mode:      ModeBraid,
		Interface: "braid0",
		Addresses: pfx("10.255.0.1/30", "fd00:ff::1/64"),
		Port:      4754,
		Scheduler: SchedulerPaced,
		Metrics:   ap("127.0.0.1:9473"),
		Control:   "@braid/tunnel",
		Braid: &BraidSettings{
			PrivateKey:     mustPriv(t, privA),
			PrivateKeyFile: "/etc/braid/site-a.key",
			Encryption:     true,
			LossRecovery:   true,
			SparseFlows:    true,
			ProbeInterval:  50 * ms,
			DownAfter:      300 * ms,
			Reorder:        Reorder{Enabled: true, MaxPackets: 4096, MaxBytes: 4 << 20, MaxHold: 100 * ms},
		},
		Uplinks: []Uplink{
			{Name: "fibre", Interface: "wan0", Address: ip("192.0.2.1"), Capacity: 100e6},
			{Name: "lte", Interface: "wwan0", Address: ip("203.0.113.10"), Port: 4755, Weight: 1, Capacity: 20e6},
		},
		Peers: []Peer{{
			Name:      "site-b",
			PublicKey: mustPub(t, pubB),
			Routes:    pfx("10.2.0.0/16", "fd02::/48"),
			Paths: []PeerPath{
				{Uplink: "fibre", Remote: ap("198.51.100.1:4754")},
				{Uplink: "fibre", Remote: ap("198.51.100.130:4754")},
				{Uplink: "lte", Remote: ap("198.51.100.1:4754")},
				{Uplink: "lte", Remote: ap("198.51.100.130:4754"), Weight: 2},
			},
		}},
	}
	if !reflect.DeepEqual(a, wantA) {
		t.Errorf("site-a:\n got %+v\nwant %+v", a, wantA)
	}
	if a.Braid.PrivateKey.Public() != mustPub(t, pubA) {
		t.Error("site-a's key does not match the public key that site-b lists")
	}
	if got := a.Uplinks[1].Socket(a.Port); got != ap("203.0.113.10:4755") {
		t.Errorf("lte socket = %v", got)
	}
	if got := a.Uplinks[0].Socket(a.Port); got != ap("192.0.2.1:4754") {
		t.Errorf("fibre socket = %v", got)
	}

	b := loadFile(t, "testdata/site-b.toml")
	// Spot checks: defaults, a derived default and the inline array of paths.
	if b.Mode != ModeBraid || b.Interface != "braid0" || b.Port != 4754 || b.Scheduler != SchedulerPaced || b.MTU != 1400 {
		t.Errorf("site-b tunnel defaults: %+v", b)
	}
	if b.Braid.ProbeInterval != 20*ms || b.Braid.DownAfter != 100*ms {
		t.Errorf("site-b probe %v, down after %v; want 20ms, 100ms (5 × probe_interval)", b.Braid.ProbeInterval, b.Braid.DownAfter)
	}
	if b.Braid.PrivateKey.Public() != mustPub(t, pubB) || b.Peers[0].PublicKey != mustPub(t, pubA) {
		t.Error("site-b keys")
	}
	if got := b.Uplinks[1]; got.Capacity != 16e6 || got.Weight != 1 || got.Address != ip("198.51.100.130") {
		t.Errorf("site-b dsl uplink: %+v", got)
	}
	wantPaths := []PeerPath{
		{Uplink: "fibre", Remote: ap("192.0.2.1:4754")},
		{Uplink: "fibre", Remote: ap("203.0.113.10:4755")},
		{Uplink: "dsl", Remote: ap("192.0.2.1:4754")},
		{Uplink: "dsl", Remote: ap("203.0.113.10:4755")},
	}
	if !reflect.DeepEqual(b.Peers[0].Paths, wantPaths) {
		t.Errorf("site-b paths: %+v", b.Peers[0].Paths)
	}

	// The pair matches: each site's remotes are the other's uplink sockets.
	for _, pair := range []struct{ from, to *Tunnel }{{a, b}, {b, a}} {
		sockets := map[netip.AddrPort]bool{}
		for i := range pair.to.Uplinks {
			sockets[pair.to.Uplinks[i].Socket(pair.to.Port)] = true
		}
		for _, p := range pair.from.Peers[0].Paths {
			if !sockets[p.Remote] {
				t.Errorf("remote %v is no uplink socket of the other site", p.Remote)
			}
		}
	}
}

func TestTunnelDefaults(t *testing.T) {
	d := TunnelDefaults()
	if d.Mode != ModeBraid || d.Interface != "braid0" || d.Port != 4754 || d.Scheduler != SchedulerPaced ||
		d.MTU != 0 || d.Metrics != ap("127.0.0.1:9473") || d.Control != "@braid/tunnel" {
		t.Errorf("TunnelDefaults: %+v", d)
	}
	if d.Braid == nil || d.Braid.ProbeInterval != 50*ms || d.Braid.DownAfter != 250*ms ||
		d.Braid.Reorder != (Reorder{Enabled: true, MaxPackets: 4096, MaxBytes: 4 << 20, MaxHold: 100 * ms}) {
		t.Errorf("TunnelDefaults().Braid: %+v", d.Braid)
	}
	if !d.Braid.PrivateKey.IsZero() {
		t.Error("a default key exists")
	}
	if d2 := TunnelDefaults(); d2.Braid == d.Braid {
		t.Error("TunnelDefaults shares its Braid settings between calls")
	}
	if m := MPTDefaults(); m != (MPTSettings{MaxBuffDelay: 100 * ms, Keepalive: time.Second, DeadTime: 3 * time.Second}) {
		t.Errorf("MPTDefaults: %+v", m)
	}

	// A minimal file gets the defaults.
	tun, err := LoadTunnel("min.toml", []byte(minimal), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	want := TunnelDefaults()
	want.Braid.PrivateKey = mustPriv(t, privA)
	want.Uplinks = tun.Uplinks
	want.Peers = tun.Peers
	if !reflect.DeepEqual(tun, &want) {
		t.Errorf("minimal file:\n got %+v\nwant %+v", tun, &want)
	}
}

// minimal is the smallest valid braid-mode file; the test cases below are built on it.
const minimal = `[tunnel]
private_key = "` + privA + `"
[[tunnel.uplink]]
name = "fibre"
interface = "wan0"
address = "192.0.2.1"
[[tunnel.peer]]
name = "site-b"
public_key = "` + pubB + `"
routes = ["10.2.0.0/16"]
  [[tunnel.peer.path]]
  uplink = "fibre"
  remote = "198.51.100.1:4754"
`

// minimalMPT is the smallest valid mpt-mode file.
const minimalMPT = `[tunnel]
mode = "mpt"
address = "10.255.0.1/30"
[[tunnel.uplink]]
name = "fibre"
interface = "wan0"
address = "192.0.2.1"
[[tunnel.peer]]
name = "server"
remote_tunnel_ip = "10.255.0.2"
routes = ["10.2.0.0/16"]
  [[tunnel.peer.path]]
  uplink = "fibre"
  remote = "198.51.100.1:23456"
`

// TestLoadThreads: threads is read in both modes (it is the process's, not braid mode's).
func TestLoadThreads(t *testing.T) {
	for name, doc := range map[string]string{"braid": minimal, "mpt": minimalMPT} {
		tun, err := LoadTunnel(name+".toml", []byte(strings.Replace(doc, "[tunnel]\n", "[tunnel]\nthreads = 3\n", 1)), newEnv())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if tun.Threads != 3 {
			t.Errorf("%s: threads %d, want 3", name, tun.Threads)
		}
	}
}

func TestLoadMPT(t *testing.T) {
	tun, err := LoadTunnel("mpt.toml", []byte(minimalMPT+`
[[tunnel.peer]]
name = "other"
keepalive = "2s"
max_buffdelay = 0
reorder_window = 64
local_tunnel_ip = "10.255.0.1"
remote_tunnel_ip = "10.255.0.3"
path = [{ uplink = "fibre", remote = "198.51.100.9:23456" }]
`), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	if tun.Braid != nil || tun.Scheduler != SchedulerWRR {
		t.Errorf("mpt tunnel: Braid %+v, scheduler %q; want nil, wrr", tun.Braid, tun.Scheduler)
	}
	want0 := MPTDefaults()
	want0.LocalTunnelIP, want0.RemoteTunnelIP = ip("10.255.0.1"), ip("10.255.0.2")
	if got := tun.Peers[0].MPT; got == nil || *got != want0 {
		t.Errorf("peer server: MPT %+v, want %+v", got, want0)
	}
	want1 := MPTSettings{ReorderWindow: 64, MaxBuffDelay: 100 * ms, Keepalive: 2 * time.Second, DeadTime: 6 * time.Second,
		LocalTunnelIP: ip("10.255.0.1"), RemoteTunnelIP: ip("10.255.0.3")}
	if got := tun.Peers[1].MPT; got == nil || *got != want1 {
		t.Errorf("peer other: MPT %+v, want %+v", got, want1)
	}
}

// TestOtherRoles checks that the sections of other roles are accepted and left alone, while
// a misspelt one is refused.
func TestOtherRoles(t *testing.T) {
	doc := minimal + `
[proxy]
listen = "0.0.0.0:1080"
[lb]
backends = ["10.0.0.1", "10.0.0.2"]
[mapserver]
[xtr]
[pm]
[[pm.policy]]
name = "ampt"
`
	if _, err := LoadTunnel("site.toml", []byte(doc), newEnv()); err != nil {
		t.Errorf("other roles' sections: %v", err)
	}
	_, err := LoadTunnel("site.toml", []byte(minimal+"[proxxy]\nlisten = 1\n"), newEnv())
	if err == nil || !strings.Contains(err.Error(), `site.toml:14:2: unknown key "proxxy"`) {
		t.Errorf("misspelt section: %v", err)
	}
	_, err = LoadTunnel("site.toml", []byte("[proxy]\n"), newEnv())
	if err == nil || err.Error() != "site.toml: no [tunnel] section" {
		t.Errorf("no tunnel section: %v", err)
	}
}

func TestRelativeKeyFile(t *testing.T) {
	doc := strings.Replace(minimal, `private_key = "`+privA+`"`, `private_key_file = "keys/site.key"`, 1)
	tun, err := LoadTunnel("/srv/site/site.toml", []byte(doc), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	if tun.Braid.PrivateKeyFile != "/srv/site/keys/site.key" || tun.Braid.PrivateKey != mustPriv(t, privA) {
		t.Errorf("relative key file: %q %v", tun.Braid.PrivateKeyFile, tun.Braid.PrivateKey.IsZero())
	}
}

// edit returns minimal with the first occurrence of each old replaced by the following new.
func edit(base string, oldnew ...string) string {
	for i := 0; i+1 < len(oldnew); i += 2 {
		if !strings.Contains(base, oldnew[i]) {
			panic("edit: no " + oldnew[i])
		}
		base = strings.Replace(base, oldnew[i], oldnew[i+1], 1)
	}
	return base
}

// mark is appended to the line where an error is expected.
const mark = " # <-"

// badFiles must be refused with an error at the line marked "# <-" whose message contains
// want. Each is also a seed of FuzzLoadTunnel.
var badFiles = []struct {
	name string
	doc  string
	want string
}{
	{"unknown key", edit(minimal, "[tunnel]\n", "[tunnel]\nprobe_intreval = \"50ms\""+mark+"\n"),
		`unknown key "tunnel.probe_intreval"`},
	{"unknown path key", edit(minimal, `  uplink = "fibre"`, `  uplink = "fibre"`+"\n  gateway = \"192.0.2.254\""+mark),
		`unknown key "tunnel.peer[0].path[0].gateway"`},
	{"wrong type", edit(minimal, "[tunnel]\n", "[tunnel]\nport = \"4754\""+mark+"\n"),
		`port: want an integer, not a string`},
	{"missing interface", edit(minimal, `interface = "wan0"`, `interface = "wan9"`+mark),
		`uplink fibre: interface "wan9" does not exist on this machine`},
	{"interface name too long", edit(minimal, "[tunnel]\n", "[tunnel]\ninterface = \"braid-tunnel-0123\""+mark+"\n"),
		`tunnel: interface "braid-tunnel-0123" is longer than 15 characters`},
	{"uplink is the tunnel", edit(minimal, `interface = "wan0"`, `interface = "braid0"`+mark),
		`uplink fibre: interface "braid0" is the tunnel's own device`},
	{"same socket", minimal + `[[tunnel.uplink]]
name = "fibre2"
interface = "wan1"
address = "192.0.2.1"` + mark + `
port = 4754
`, `uplink fibre2: address and port 192.0.2.1:4754: also the socket of uplink fibre`},
	{"same address, other port", minimal + `[[tunnel.uplink]]
name = "fibre2"
interface = "wan1"
address = "192.0.2.1"
port = 4755
[[tunnel.uplink]]
name = "fibre3"
interface = "wan1"
address = "192.0.2.1"` + mark + `
port = 4755
`, `uplink fibre3: address and port 192.0.2.1:4755: also the socket of uplink fibre2`},
	{"duplicate uplink name", minimal + `[[tunnel.uplink]]
name = "fibre"` + mark + `
interface = "wan1"
address = "192.0.2.2"
`, `uplink fibre: name "fibre": another uplink has this name`},
	{"identical paths", minimal + `  [[tunnel.peer.path]]
  uplink = "fibre"
  remote = "198.51.100.1:4754"` + mark + `
`, `peer site-b path 2: remote 198.51.100.1:4754 from uplink fibre: same as path 1`},
	{"unknown uplink", edit(minimal, `  uplink = "fibre"`, `  uplink = "fiber"`+mark),
		`peer site-b path 1: uplink "fiber": no tunnel.uplink has this name`},
	{"missing peer key", edit(minimal, "[[tunnel.peer]]\n", "[[tunnel.peer]]"+mark+"\n", `public_key = "`+pubB+`"`, ""),
		`peer site-b: missing public_key: run 'braid keygen --public' on the peer`},
	{"missing private key", edit(minimal, "[tunnel]\n", "[tunnel]"+mark+"\n", `private_key = "`+privA+`"`, ""),
		`tunnel: missing private_key_file (or private_key): no default key exists; run 'braid keygen'`},
	{"bad private key", edit(minimal, `private_key = "`+privA+`"`, `private_key = "c2VjcmV0"`+mark),
		`tunnel: private_key: a key is 32 bytes in standard base64`},
	{"bad public key", edit(minimal, `public_key = "`+pubB+`"`, `public_key = "`+pubB[1:]+`"`+mark),
		`peer site-b: public_key: a key is 32 bytes in standard base64`},
	{"missing key file", edit(minimal, `private_key = "`+privA+`"`, `private_key_file = "/etc/braid/missing.key"`+mark),
		`tunnel: private_key_file: cannot read /etc/braid/missing.key: no such file or directory`},
	{"unreadable key file", edit(minimal, `private_key = "`+privA+`"`, `private_key_file = "/etc/braid/unreadable.key"`+mark),
		`tunnel: private_key_file: cannot read /etc/braid/unreadable.key: permission denied`},
	{"key file without a key", edit(minimal, `private_key = "`+privA+`"`, `private_key_file = "/etc/braid/garbage.key"`+mark),
		`tunnel: private_key_file: /etc/braid/garbage.key holds no private key: a key is 32 bytes`},
	{"two private keys", edit(minimal, "[tunnel]\n", "[tunnel]\nprivate_key_file = \"/etc/braid/site-a.key\""+mark+"\n"),
		`tunnel: private_key and private_key_file are both set; keep one`},
	{"duplicate peer name", minimal + `[[tunnel.peer]]
name = "site-b"` + mark + `
public_key = "` + pubC + `"
routes = ["10.3.0.0/16"]
path = [{ uplink = "fibre", remote = "198.51.100.2:4754" }]
`, `peer site-b: name "site-b": another peer has this name`},
	{"duplicate public key", minimal + `[[tunnel.peer]]
name = "site-c"
public_key = "` + pubB + `"` + mark + `
routes = ["10.3.0.0/16"]
path = [{ uplink = "fibre", remote = "198.51.100.2:4754" }]
`, `peer site-c: public_key is also the key of peer site-b`},
	{"own public key", edit(minimal, `public_key = "`+pubB+`"`, `public_key = "`+pubA+`"`+mark),
		`peer site-b: public_key is this site's own public key`},
	{"overlapping routes", minimal + `[[tunnel.peer]]
name = "site-c"
public_key = "` + pubC + `"
routes = ["10.3.0.0/16", "10.2.128.0/17"]` + mark + `
path = [{ uplink = "fibre", remote = "198.51.100.2:4754" }]
`, `peer site-c: routes: 10.2.128.0/17 overlaps 10.2.0.0/16 of peer site-b`},
	{"route with host bits", edit(minimal, `routes = ["10.2.0.0/16"]`, `routes = ["10.2.0.1/16"]`+mark),
		`peer site-b: routes: 10.2.0.1/16 has host bits set (did you mean 10.2.0.0/16?)`},
	{"bad route", edit(minimal, `routes = ["10.2.0.0/16"]`, `routes = ["10.2.0.0/16",`+"\n  \"10.2.0.0\"]"+mark),
		`peer site-b: routes[1] "10.2.0.0": want address/length`},
	{"family mismatch", edit(minimal, `remote = "198.51.100.1:4754"`, `remote = "[2001:db8::1]:4754"`+mark),
		`peer site-b path 1: remote [2001:db8::1]:4754 is IPv6 but uplink fibre has IPv4 address 192.0.2.1`},
	{"remote of two peers", minimal + `[[tunnel.peer]]
name = "site-c"
public_key = "` + pubC + `"
routes = ["10.3.0.0/16"]
path = [{ uplink = "fibre", remote = "198.51.100.1:4754" }]` + mark + `
`, `peer site-c path 1: remote 198.51.100.1:4754 is also an address of peer site-b`},
	{"port 0 in remote", edit(minimal, `remote = "198.51.100.1:4754"`, `remote = "198.51.100.1:0"`+mark),
		`peer site-b path 1: remote 198.51.100.1:0: port 0`},
	{"remote without port", edit(minimal, `remote = "198.51.100.1:4754"`, `remote = "198.51.100.1"`+mark),
		`peer site-b path 1: remote "198.51.100.1": want address:port`},
	{"bad uplink address", edit(minimal, `address = "192.0.2.1"`, `address = "192.0.2.1/24"`+mark),
		`uplink fibre: address "192.0.2.1/24": want an IPv4 or IPv6 address`},
	{"unspecified uplink address", edit(minimal, `address = "192.0.2.1"`, `address = "0.0.0.0"`+mark),
		`uplink fibre: address 0.0.0.0: want a unicast address`},
	{"down_after too short", edit(minimal, "[tunnel]\n", "[tunnel]\nprobe_interval = 40\ndown_after = \"60ms\""+mark+"\n"),
		`tunnel: down_after 60ms is less than 2 × probe_interval (40ms)`},
	{"probe_interval 0", edit(minimal, "[tunnel]\n", "[tunnel]\nprobe_interval = \"0s\""+mark+"\n"),
		`tunnel: probe_interval 0s outside 1ms..1m`},
	{"bad duration", edit(minimal, "[tunnel]\n", "[tunnel]\nprobe_interval = \"fast\""+mark+"\n"),
		`tunnel: invalid probe_interval "fast"`},
	{"negative reorder packets", edit(minimal, "[tunnel]\n", "[tunnel]\nreorder_max_packets = -1"+mark+"\n"),
		`tunnel: reorder_max_packets -1 is negative`},
	{"negative reorder bytes", edit(minimal, "[tunnel]\n", "[tunnel]\nreorder_max_bytes = -5"+mark+"\n"),
		`tunnel: reorder_max_bytes: negative size "-5"`},
	{"negative reorder hold", edit(minimal, "[tunnel]\n", "[tunnel]\nreorder_max_hold = \"-5ms\""+mark+"\n"),
		`tunnel: negative reorder_max_hold "-5ms"`},
	{"too many shards", edit(minimal, "[tunnel]\n", "[tunnel]\nshards = 5000"+mark+"\n"),
		`tunnel: shards 5000 outside 0..1024 (0: one per CPU)`},
	{"negative threads", edit(minimal, "[tunnel]\n", "[tunnel]\nthreads = -1"+mark+"\n"),
		`tunnel: threads -1 outside 0..1024 (0: one while a core suffices, then one per CPU)`},
	{"too many threads", edit(minimal, "[tunnel]\n", "[tunnel]\nthreads = 4096"+mark+"\n"),
		`tunnel: threads 4096 outside 0..1024 (0: one while a core suffices, then one per CPU)`},
	{"mtu too small", edit(minimal, "[tunnel]\n", "[tunnel]\nmtu = 500"+mark+"\n"),
		`tunnel: mtu 500 outside 576..65535`},
	{"mtu too large", edit(minimal, "[tunnel]\n", "[tunnel]\nmtu = 65536"+mark+"\n"),
		`tunnel: mtu 65536 outside 576..65535`},
	{"mtu below IPv6 minimum", edit(minimal, "[tunnel]\n", "[tunnel]\naddress = \"fd00::1/64\"\nmtu = 1000"+mark+"\n"),
		`tunnel: mtu 1000 is below the IPv6 minimum of 1280`},
	{"port 0", edit(minimal, "[tunnel]\n", "[tunnel]\nport = 0"+mark+"\n"),
		`tunnel: port 0 outside 1..65535`},
	{"uplink port too large", edit(minimal, `address = "192.0.2.1"`, `address = "192.0.2.1"`+"\nport = 70000"+mark),
		`uplink fibre: port 70000 outside 0..65535`},
	{"negative weight", edit(minimal, `address = "192.0.2.1"`, `address = "192.0.2.1"`+"\nweight = -1"+mark),
		`uplink fibre: weight -1 outside 0..65535`},
	{"unknown scheduler", edit(minimal, "[tunnel]\n", "[tunnel]\nscheduler = \"fastest\""+mark+"\n"),
		`tunnel: scheduler "fastest": want paced, wrr, minrtt, blest, ecf or rbpm`},
	{"unknown mode", edit(minimal, "[tunnel]\n", "[tunnel]\nmode = \"gre\""+mark+"\n"),
		`tunnel: mode "gre": want braid or mpt`},
	{"bad metrics", edit(minimal, "[tunnel]\n", "[tunnel]\nmetrics = \"localhost:9473\""+mark+"\n"),
		`tunnel: metrics "localhost:9473": want address:port`},
	{"relative control", edit(minimal, "[tunnel]\n", "[tunnel]\ncontrol = \"tunnel.sock\""+mark+"\n"),
		`tunnel: control "tunnel.sock": want an absolute path, or @NAME`},
	{"abstract control without a name", edit(minimal, "[tunnel]\n", "[tunnel]\ncontrol = \"@\""+mark+"\n"),
		`tunnel: control "@": an abstract socket needs a name`},
	{"bad capacity", edit(minimal, `address = "192.0.2.1"`, `address = "192.0.2.1"`+"\ncapacity = \"100MB/s\""+mark),
		`uplink fibre: capacity: invalid rate "100MB/s"`},
	{"missing name", edit(minimal, `name = "fibre"`, "# no name", `uplink = "fibre"`, `uplink = "wan"`, "[[tunnel.uplink]]\n", "[[tunnel.uplink]]"+mark+"\n"),
		`uplink 1: missing name`},
	{"no paths", edit(minimal, "  [[tunnel.peer.path]]\n  uplink = \"fibre\"\n  remote = \"198.51.100.1:4754\"\n", "", "[[tunnel.peer]]\n", "[[tunnel.peer]]"+mark+"\n"),
		`peer site-b: no paths`},
	{"braid key in mpt mode", edit(minimalMPT, "[tunnel]\n", "[tunnel]\nprivate_key = \""+privA+"\""+mark+"\n"),
		`tunnel: private_key is a braid-mode key; mode is "mpt"`},
	{"encryption in mpt mode", edit(minimalMPT, "[tunnel]\n", "[tunnel]\nencryption = false"+mark+"\n"),
		`tunnel: encryption is a braid-mode key; mode is "mpt"`},
	{"encryption not a boolean", edit(minimal, "[tunnel]\n", "[tunnel]\nencryption = \"off\""+mark+"\n"),
		`encryption`},
	{"sparse_flows in mpt mode", edit(minimalMPT, "[tunnel]\n", "[tunnel]\nsparse_flows = false"+mark+"\n"),
		`tunnel: sparse_flows is a braid-mode key; mode is "mpt"`},
	{"sparse_flows not a boolean", edit(minimal, "[tunnel]\n", "[tunnel]\nsparse_flows = 1"+mark+"\n"),
		`sparse_flows`},
	{"probe in mpt mode", edit(minimalMPT, "[tunnel]\n", "[tunnel]\nprobe_interval = \"10ms\""+mark+"\n"),
		`tunnel: probe_interval is a braid-mode key; mode is "mpt"`},
	{"public key in mpt mode", edit(minimalMPT, `name = "server"`, `name = "server"`+"\npublic_key = \""+pubB+"\""+mark),
		`peer server: public_key is a braid-mode key; mode is "mpt"`},
	{"mpt key in braid mode", edit(minimal, `name = "site-b"`, `name = "site-b"`+"\ndead_time = \"1s\""+mark),
		`peer site-b: dead_time is an mpt-mode key; mode is "braid"`},
	{"keepalive too long", edit(minimal, `name = "site-b"`, `name = "site-b"`+"\nkeepalive = \"5m\""+mark),
		`peer site-b: keepalive 5m0s outside 10ms..2m0s`},
	{"keepalive 0 in braid mode", edit(minimal, `name = "site-b"`, `name = "site-b"`+"\nkeepalive = 0"+mark),
		`peer site-b: keepalive 0: braid mode always keeps paths alive`},
	{"max_paths with remotes", edit(minimal, `name = "site-b"`, `name = "site-b"`+"\nmax_paths = 4"+mark),
		`peer site-b: max_paths bounds learned paths`},
	{"max_paths 0", edit(minimal, `name = "site-b"`, `name = "site-b"`+"\nmax_paths = 0"+mark, "  remote = \"198.51.100.1:4754\"\n", ""),
		`peer site-b: max_paths 0 outside 1..254`},
	{"max_paths in mpt mode", edit(minimalMPT, `name = "server"`, `name = "server"`+"\nmax_paths = 4"+mark),
		`peer server: max_paths is a braid-mode key; mode is "mpt"`},
	{"some paths without remote", minimal + "  [[tunnel.peer.path]]" + mark + "\n  uplink = \"fibre\"\n",
		`peer site-b path 2: missing remote, and 1 other paths of the peer have one`},
	{"learned uplink twice", edit(minimal, "  remote = \"198.51.100.1:4754\"\n", "") + "  [[tunnel.peer.path]]\n  uplink = \"fibre\"" + mark + "\n",
		`peer site-b path 2: uplink fibre: same as path 1`},
	{"mpt uplink without address", edit(minimalMPT, "[[tunnel.uplink]]\n", "[[tunnel.uplink]]"+mark+"\n", `address = "192.0.2.1"`+"\n", ""),
		`uplink fibre: address is missing`},
	{"two uplinks follow one interface", edit(minimal, `address = "192.0.2.1"`+"\n", "") + `[[tunnel.uplink]]
name = "fibre2"
interface = "wan0"` + mark + `
`, `uplink fibre2: interface wan0, port 4754: also the socket of uplink fibre`},
	{"mpt path without remote", edit(minimalMPT, "  [[tunnel.peer.path]]", "  [[tunnel.peer.path]]"+mark, `  remote = "198.51.100.1:23456"`, "  # no remote"),
		`peer server path 1: remote`},
	{"minrtt in mpt mode", edit(minimalMPT, "[tunnel]\n", "[tunnel]\nscheduler = \"minrtt\""+mark+"\n"),
		`tunnel: scheduler minrtt needs RTT measurements`},
	{"rbpm in mpt mode", edit(minimalMPT, "[tunnel]\n", "[tunnel]\nscheduler = \"rbpm\""+mark+"\n"),
		`tunnel: scheduler rbpm needs RTT measurements`},
	{"mpt dead_time too short", edit(minimalMPT, `name = "server"`, `name = "server"`+"\nkeepalive = \"2s\"\ndead_time = \"3s\""+mark),
		`peer server: dead_time 3s is less than 2 × keepalive (2s)`},
	{"mpt dead_time without keepalive", edit(minimalMPT, `name = "server"`, `name = "server"`+"\nkeepalive = 0\ndead_time = \"3s\""+mark),
		`peer server: dead_time 3s without keepalives`},
	{"mpt negative reorder window", edit(minimalMPT, `name = "server"`, `name = "server"`+"\nreorder_window = -1"+mark),
		`peer server: reorder_window -1 is negative`},
	{"mpt missing remote tunnel ip", edit(minimalMPT, `remote_tunnel_ip = "10.255.0.2"`, "", "[[tunnel.peer]]\n", "[[tunnel.peer]]"+mark+"\n"),
		`peer server: missing remote_tunnel_ip`},
	{"mpt tunnel ip families", edit(minimalMPT, `remote_tunnel_ip = "10.255.0.2"`, `remote_tunnel_ip = "fd00::2"`, "[[tunnel.peer]]\n", "[[tunnel.peer]]"+mark+"\n"),
		`peer server: missing local_tunnel_ip, and tunnel.address has no address of remote_tunnel_ip's family`},
	{"mpt too many paths", minimalMPT + morePaths(19) +
		"  [[tunnel.peer.path]]" + mark + "\n  uplink = \"fibre\"\n  remote = \"198.51.100.2:23456\"\n",
		`peer server: 21 paths: at most 20 in mpt mode`},
}

// morePaths returns n more paths for the last peer, all to different remotes.
func morePaths(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  [[tunnel.peer.path]]\n  uplink = \"fibre\"\n  remote = \"198.51.100.1:%d\"\n", 30000+i)
	}
	return b.String()
}

// markedLine returns the 1-based line of doc that carries mark.
func markedLine(t *testing.T, doc string) int {
	t.Helper()
	for i, l := range strings.Split(doc, "\n") {
		if strings.HasSuffix(l, mark) {
			return i + 1
		}
	}
	t.Fatalf("no line marked %q in\n%s", mark, doc)
	return 0
}

// flatten returns the *Error values of a joined error, failing on anything else.
func flatten(t testing.TB, err error) []*Error {
	t.Helper()
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %T %v is not a *config.Error", err, err)
		}
		out = append(out, e)
	}
	walk(err)
	return out
}

func TestLoadTunnelErrors(t *testing.T) {
	for _, tc := range badFiles {
		t.Run(tc.name, func(t *testing.T) {
			line := markedLine(t, tc.doc)
			_, err := LoadTunnel("site.toml", []byte(tc.doc), newEnv())
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.doc)
			}
			errs := flatten(t, err)
			found := false
			for _, e := range errs {
				if e.File != "site.toml" {
					t.Errorf("error without the file name: %v", e)
				}
				if e.Line == line && strings.Contains(e.Error(), tc.want) {
					found = true
				}
			}
			if !found {
				t.Errorf("want an error at site.toml:%d containing %q; got:\n%v", line, tc.want, err)
			}
			if len(errs) > 1 {
				t.Logf("more than one error:\n%v", err) // follow-on errors should be rare
			}
		})
	}
}

// TestAllProblems checks that problems are all reported, in the order of their lines.
func TestAllProblems(t *testing.T) {
	doc := minimal + `[[tunnel.peer]]
name = "site-c"
public_key = "` + pubA + `"
routes = ["10.2.0.0/24"]
  [[tunnel.peer.path]]
  uplink = "lte"
  remote = "198.51.100.7:0"
`
	doc = edit(doc, `interface = "wan0"`, `interface = "wan7"`, "[tunnel]\n", "[tunnel]\nmtu = 100\n")
	_, err := LoadTunnel("site.toml", []byte(doc), newEnv())
	if err == nil {
		t.Fatal("accepted")
	}
	var got []string
	for _, e := range flatten(t, err) {
		got = append(got, e.Error())
	}
	want := []string{
		`site.toml:2: tunnel: mtu 100 outside 576..65535 (or 0 to derive it from the paths)`,
		`site.toml:6: uplink fibre: interface "wan7" does not exist on this machine`,
		`site.toml:17: peer site-c: public_key is this site's own public key`,
		`site.toml:18: peer site-c: routes: 10.2.0.0/24 overlaps 10.2.0.0/16 of peer site-b: a packet must have one peer`,
		`site.toml:20: peer site-c path 1: uplink "lte": no tunnel.uplink has this name`,
		`site.toml:21: peer site-c path 1: remote 198.51.100.7:0: port 0; want the peer's port, such as 198.51.100.7:4754`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestValidateGo checks configurations built in Go: no file, no line, fields still named.
func TestValidateGo(t *testing.T) {
	valid := func() Tunnel {
		tun := TunnelDefaults()
		tun.Braid.PrivateKey = mustPriv(t, privA)
		tun.Uplinks = []Uplink{{Name: "fibre", Interface: "wan0", Address: ip("192.0.2.1")}}
		tun.Peers = []Peer{{Name: "site-b", PublicKey: mustPub(t, pubB), Routes: pfx("10.2.0.0/16"),
			Paths: []PeerPath{{Uplink: "fibre", Remote: ap("198.51.100.1:4754")}}}}
		return tun
	}
	tun := valid()
	if err := tun.Validate(newEnv()); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name   string
		modify func(*Tunnel)
		want   string
	}{
		{"no key", func(t *Tunnel) { t.Braid.PrivateKey = session.PrivateKey{} }, "tunnel: missing private_key_file (or private_key): no default key exists; run 'braid keygen'"},
		{"key file", func(t *Tunnel) {
			t.Braid.PrivateKey = session.PrivateKey{}
			t.Braid.PrivateKeyFile = "/etc/braid/nope.key"
		}, "tunnel: private_key_file: cannot read /etc/braid/nope.key: no such file or directory"},
		{"own key from file", func(tn *Tunnel) {
			tn.Braid.PrivateKey = session.PrivateKey{}
			tn.Braid.PrivateKeyFile = "/etc/braid/site-b.key"
		}, "peer site-b: public_key is this site's own public key"},
		{"nil braid", func(t *Tunnel) { t.Braid = nil }, "tunnel: braid mode needs its settings"},
		{"mpt with braid", func(t *Tunnel) { t.Mode = ModeMPT }, "tunnel: mpt mode has no keys"},
		{"negative reorder bytes", func(t *Tunnel) { t.Braid.Reorder.MaxBytes = -1 }, "tunnel: reorder_max_bytes -1 is negative"},
		{"negative hold", func(t *Tunnel) { t.Braid.Reorder.MaxHold = -ms }, "tunnel: reorder_max_hold -1ms is negative"},
		{"zero packets", func(t *Tunnel) { t.Braid.Reorder.MaxPackets = 0 }, "tunnel: reorder_max_packets 0 outside 1..1048576"},
		{"metrics port 0", func(t *Tunnel) { t.Metrics = ap("127.0.0.1:0") }, "tunnel: metrics 127.0.0.1:0: want address:port with a port other than 0"},
		{"peer weight", func(t *Tunnel) { t.Peers[0].Paths[0].Weight = 70000 }, "peer site-b path 1: weight 70000 outside 0..65535"},
		{"4in6 remote", func(t *Tunnel) { t.Peers[0].Paths[0].Remote = ap("[::ffff:198.51.100.1]:4754") }, "peer site-b path 1: remote ::ffff:198.51.100.1: write IPv4 addresses as such (198.51.100.1)"},
		{"no uplinks", func(t *Tunnel) { t.Uplinks = nil }, "tunnel: no uplinks"},
		{"no peers", func(t *Tunnel) { t.Peers = nil }, "tunnel: no peers"},
		{"mpt peer in braid mode", func(t *Tunnel) { m := MPTDefaults(); t.Peers[0].MPT = &m }, "peer site-b: mpt settings in braid mode"},
	} {
		tun := valid()
		tc.modify(&tun)
		err := tun.Validate(newEnv())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
			continue
		}
		for _, e := range flatten(t, err) {
			if e.File != "" || e.Line != 0 {
				t.Errorf("%s: a Go config's error has a position: %v", tc.name, e)
			}
		}
	}

	// A nil Env skips the checks of the machine.
	tun = valid()
	tun.Uplinks[0].Interface = "wan9"
	tun.Braid.PrivateKey = session.PrivateKey{}
	tun.Braid.PrivateKeyFile = "/etc/braid/nope.key"
	if err := tun.Validate(nil); err != nil {
		t.Errorf("Validate(nil): %v", err)
	}
	if err := tun.Validate(newEnv()); err == nil {
		t.Error("Validate(env) accepted a missing interface and key file")
	}
}

// The "Behind NAT" walk-through of docs/tunnel.md: a hub that learns a branch's paths, and
// the branch behind two NATs.
func TestLoadBehindNAT(t *testing.T) {
	hub := loadFile(t, "testdata/hub.toml")
	p := hub.Peers[0]
	if !p.Learned() || p.MaxPaths != 8 || p.Keepalive != 0 || len(p.Paths) != 1 || p.Paths[0].Uplink != "public" || p.Paths[0].Remote.IsValid() {
		t.Errorf("hub's branch: learned %v, %+v", p.Learned(), p)
	}
	branch := loadFile(t, "testdata/branch.toml")
	if u := branch.Uplinks[1]; u.Name != "lte" || !u.Follows() || u.Interface != "wwan0" || branch.Uplinks[0].Follows() {
		t.Errorf("branch's lte uplink should follow wwan0's address, and dsl not: %+v", branch.Uplinks)
	}
	p = branch.Peers[0]
	if p.Learned() || p.Keepalive != 15*time.Second || len(p.Paths) != 2 || p.Paths[1].Remote != ap("198.51.100.1:4754") {
		t.Errorf("branch's hub: learned %v, %+v", p.Learned(), p)
	}
	if p.PublicKey != mustPub(t, pubA) || hub.Peers[0].PublicKey != mustPub(t, pubB) {
		t.Error("the two files do not name each other's keys")
	}
}

// An uplink without address follows its interface's, which may appear after start.
func TestLoadFollowingUplink(t *testing.T) {
	doc := edit(minimal, `interface = "wan0"`+"\n"+`address = "192.0.2.1"`, `interface = "wwan9"`)
	cfg, err := LoadTunnel("site.toml", []byte(doc), newEnv())
	if err != nil {
		t.Fatalf("an uplink following an interface not there yet: %v", err)
	}
	if u := cfg.Uplinks[0]; !u.Follows() || u.Interface != "wwan9" || u.Socket(cfg.Port).Port() != DefaultTunnelPort {
		t.Errorf("uplink %+v", u)
	}
}

func TestValidateDoesNotModify(t *testing.T) {
	tun := loadFile(t, "testdata/site-a.toml")
	tun.Braid.PrivateKey = session.PrivateKey{}
	tun.Braid.PrivateKeyFile = "/etc/braid/site-a.key"
	_ = tun.Validate(newEnv())
	if !tun.Braid.PrivateKey.IsZero() {
		t.Error("Validate filled in the private key")
	}
}

func FuzzLoadTunnel(f *testing.F) {
	for _, p := range []string{"testdata/site-a.toml", "testdata/site-b.toml", "testdata/hub.toml", "testdata/branch.toml"} {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(minimal))
	f.Add([]byte(minimalMPT))
	for _, tc := range badFiles {
		f.Add([]byte(tc.doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env := newEnv()
		tun, err := LoadTunnel("fuzz.toml", data, env)
		if err != nil {
			if tun != nil {
				t.Fatal("both a tunnel and an error")
			}
			for _, e := range flatten(t, err) {
				if e.File != "fuzz.toml" || e.Reason == "" {
					t.Fatalf("error without file or reason: %#v", e)
				}
				if e.Line == 0 && !strings.HasPrefix(e.Reason, "no [tunnel] section") && strings.Contains(string(data), "[tunnel") {
					t.Fatalf("error without a line: %v", e)
				}
			}
			return
		}
		if err := tun.Validate(env); err != nil {
			t.Fatalf("loaded, but Validate fails: %v", err)
		}
		if tun.Mode == ModeBraid && (tun.Braid == nil || tun.Braid.PrivateKey.IsZero()) {
			t.Fatal("braid mode without a key")
		}
		for i := range tun.Peers {
			if (tun.Peers[i].MPT != nil) != (tun.Mode == ModeMPT) {
				t.Fatalf("peer %d: MPT settings %v in mode %s", i, tun.Peers[i].MPT, tun.Mode)
			}
		}
	})
}

// The braid-mode switches that are on by default turn off in the site file.
func TestSwitchesOff(t *testing.T) {
	for _, key := range []struct {
		name string
		get  func(*BraidSettings) bool
	}{
		{"encryption", func(b *BraidSettings) bool { return b.Encryption }},
		{"sparse_flows", func(b *BraidSettings) bool { return b.SparseFlows }},
		{"loss_recovery", func(b *BraidSettings) bool { return b.LossRecovery }},
	} {
		for _, tc := range []struct {
			file string
			want bool
		}{{minimal, true}, {edit(minimal, "[tunnel]\n", "[tunnel]\n"+key.name+" = false\n"), false}} {
			tun, err := LoadTunnel("site.toml", []byte(tc.file), newEnv())
			if err != nil {
				t.Fatal(err)
			}
			if got := key.get(tun.Braid); got != tc.want {
				t.Errorf("%s %v, want %v", key.name, got, tc.want)
			}
		}
	}
}
