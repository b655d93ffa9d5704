package config

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"braid/internal/proxy/ident"
)

func proxyPeerKey(t *testing.T) string {
	k, err := ident.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public().String()
}

func TestLoadProxy(t *testing.T) {
	doc := `
[proxy]
mode = "redirect"
private_key_file = "/etc/braid/site-a.key"
pool = 3
drain_timeout = "5s"
backup = ["lte"]

[[proxy.uplink]]
name = "fibre"
interface = "wan0"
address = "192.0.2.1"

[[proxy.uplink]]
name = "lte"
interface = "wwan0"
address = "203.0.113.10"

[[proxy.tenant]]
name = "blue"
networks = ["10.1.0.0/24", "fd01::/64"]
port = 7001
peer_port = 7101
socks = "10.1.0.254:1080"
  [[proxy.tenant.peer]]
  name = "site-b"
  public_key = "` + proxyPeerKey(t) + `"
  address = ["198.51.100.1:7101", "198.51.100.9:7101"]
  networks = "10.2.0.0/24"
`
	p, err := LoadProxy("/etc/braid/site.toml", []byte(doc), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != "redirect" || !p.HasKey || p.Plaintext || p.Pool != 3 || p.DrainTimeout != 5*time.Second || p.PathManager != "braid" || p.FwMark != 0x1b5 {
		t.Errorf("proxy %+v", p)
	}
	if len(p.Uplinks) != 2 || !p.Uplinks[1].Backup {
		t.Errorf("uplinks %+v", p.Uplinks)
	}
	tn := p.Tenants[0]
	if tn.Name != "blue" || len(tn.Networks) != 2 || tn.Port != 7001 || tn.PeerPort != 7101 || tn.Socks != netip.MustParseAddrPort("10.1.0.254:1080") {
		t.Errorf("tenant %+v", tn)
	}
	if pr := tn.Peers[0]; len(pr.Addresses) != 2 || pr.Networks[0] != netip.MustParsePrefix("10.2.0.0/24") {
		t.Errorf("peer %+v", pr)
	}
}

func TestLoadProxyErrors(t *testing.T) {
	key := proxyPeerKey(t)
	doc := `
[proxy]
mode = "nat"
path_manager = "fullmesh"

[[proxy.uplink]]
name = "fibre"
interface = "nosuch0"
address = "192.0.2.1"

[[proxy.tenant]]
name = "blue"
networks = ["10.1.0.1/24"]
port = 7001
peer_port = 7001
  [[proxy.tenant.peer]]
  name = "site-b"
  address = "198.51.100.1"
  networks = ["10.1.0.0/16"]
  [[proxy.tenant.peer]]
  name = "site-c"
  public_key = "` + key + `"
  address = "198.51.100.2:7101"
  networks = ["10.3.0.0/24"]
  [[proxy.tenant.peer]]
  name = "site-d"
  public_key = "` + key + `"
  address = "198.51.100.3:7101"
  networks = ["10.4.0.0/24"]
`
	_, err := LoadProxy("site.toml", []byte(doc), newEnv())
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{
		`site.toml:3: proxy: mode "nat": known modes are tproxy, redirect, socks`,
		`site.toml:4: proxy: path_manager "fullmesh"`,
		`no private_key or private_key_file`,
		`site.toml:8: uplink fibre: interface "nosuch0" does not exist`,
		`site.toml:13: tenant blue: networks 10.1.0.1/24 has host bits set (did you mean 10.1.0.0/24?)`,
		`site.toml:15: tenant blue: peer_port 7001 is already tenant blue's port`,
		`site.toml:18: tenant blue peer site-b: address "198.51.100.1": want address:port`,
		`site.toml:19: tenant blue peer site-b: networks 10.1.0.0/16 overlaps the tenant's own 10.1.0.1/24`,
		`tenant blue peer site-b: missing public_key`,
		`site.toml:27: tenant blue peer site-d: public_key is also another peer's of this tenant`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
	if _, err := LoadProxy("site.toml", []byte("[tunnel]\n"), newEnv()); err == nil || !strings.Contains(err.Error(), "no [proxy] section") {
		t.Errorf("no section: %v", err)
	}
	// Plaintext needs no keys, and says so explicitly.
	plain := `
[proxy]
plaintext = true
path_manager = "none"
mode = "socks"
[[proxy.tenant]]
name = "t"
networks = ["10.1.0.0/24"]
peer_port = 7101
socks = "127.0.0.1:1080"
  [[proxy.tenant.peer]]
  name = "b"
  address = "10.0.0.2:7101"
  networks = ["10.2.0.0/24"]
`
	if p, err := LoadProxy("site.toml", []byte(plain), newEnv()); err != nil || !p.Plaintext {
		t.Errorf("plaintext: %v", err)
	}
}

// pm_policy picks the policy of the proxy's own path manager: fullmesh unless the file says
// otherwise; an unknown one, or one given to a path manager that has no policies, is reported
// at its line.
// proxySiteWith is a plaintext proxy site with one uplink and one tenant, lines at the top of [proxy]
// (which are lines 3 and on).
func proxySiteWith(lines string) []byte {
	return []byte("[proxy]\nplaintext = true\n" + lines + `
[[proxy.uplink]]
name = "fibre"
interface = "wan0"
address = "192.0.2.1"
[[proxy.tenant]]
name = "blue"
networks = ["10.1.0.0/24"]
port = 7001
peer_port = 7101
  [[proxy.tenant.peer]]
  name = "b"
  address = "198.51.100.1:7101"
  networks = ["10.2.0.0/24"]
`)
}

func TestLoadProxyPMPolicy(t *testing.T) {
	for _, c := range []struct{ lines, want string }{
		{"", "fullmesh"},
		{"pm_policy = \"rbpm\"\n", "rbpm"},
		{"path_manager = \"braid\"\npm_policy = \"rbpm\"\n", "rbpm"},
	} {
		p, err := LoadProxy("site.toml", proxySiteWith(c.lines), newEnv())
		if err != nil {
			t.Errorf("%q: %v", c.lines, err)
			continue
		}
		if p.PMPolicy != c.want {
			t.Errorf("%q: pm_policy %q, want %q", c.lines, p.PMPolicy, c.want)
		}
	}
	for _, c := range []struct{ lines, want string }{
		{"pm_policy = \"amptcp\"\n", `site.toml:3: proxy: pm_policy "amptcp": known policies are fullmesh, rbpm`},
		{"path_manager = \"kernel\"\npm_policy = \"rbpm\"\n", `site.toml:4: proxy: pm_policy "rbpm" is a policy of path_manager "braid", not of "kernel"`},
		{"path_manager = \"rbpm\"\n", `site.toml:3: proxy: path_manager "rbpm": known path managers are braid, kernel, none (braid's policy is pm_policy)`},
	} {
		_, err := LoadProxy("site.toml", proxySiteWith(c.lines), newEnv())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.lines, err, c.want)
		}
	}
}

// The security keys: the SOCKS5 allow-list, sourceless requests, plaintext peers' sources,
// the cap on unauthenticated connections and the control socket; plaintext peers of a tenant
// that share a source are refused with the line.
func TestLoadProxySecurity(t *testing.T) {
	doc := `
[proxy]
mode = "socks"
plaintext = true
path_manager = "none"
max_unauthenticated = 32
control = "@braid/proxy-a"

[[proxy.tenant]]
name = "blue"
networks = ["10.1.0.0/24"]
peer_port = 7101
socks = "127.0.0.1:1080"
socks_clients = ["127.0.0.1/32", "10.1.0.0/24"]
allow_sourceless = true
  [[proxy.tenant.peer]]
  name = "site-b"
  address = ["198.51.100.1:7101"]
  networks = ["10.2.0.0/24"]
  sources = ["198.51.100.0/29"]
  [[proxy.tenant.peer]]
  name = "site-c"
  address = ["198.51.100.20:7101"]
  networks = ["10.3.0.0/24"]
`
	p, err := LoadProxy("site.toml", []byte(doc), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	tn := p.Tenants[0]
	if p.MaxUnauthenticated != 32 || p.Control != "@braid/proxy-a" || len(tn.SocksClients) != 2 || !tn.AllowSourceless ||
		len(tn.Peers[0].Sources) != 1 || tn.Peers[0].Sources[0] != netip.MustParsePrefix("198.51.100.0/29") {
		t.Errorf("proxy %+v", p)
	}
	if d := ProxyDefaults(); d.MaxUnauthenticated != 256 || d.Control != DefaultProxyControl {
		t.Errorf("defaults: max_unauthenticated %d, control %q", d.MaxUnauthenticated, d.Control)
	}
	// site-c's address falls into site-b's sources: two peers could not be told apart.
	bad := strings.Replace(doc, `address = ["198.51.100.20:7101"]`, `address = ["198.51.100.5:7101"]`, 1)
	bad = strings.Replace(bad, "max_unauthenticated = 32", "max_unauthenticated = 0", 1)
	_, err = LoadProxy("site.toml", []byte(bad), newEnv())
	if err == nil {
		t.Fatal("overlapping plaintext sources accepted")
	}
	for _, want := range []string{"site.toml:6: ", "max_unauthenticated 0", "site.toml:23: ", "overlaps peer site-b's 198.51.100.0/29"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// sources without plaintext is a mistake.
	withKey := strings.Replace(doc, "plaintext = true", `private_key = "`+mustKey(t)+`"`, 1)
	withKey = strings.ReplaceAll(withKey, `  networks = ["10.2.0.0/24"]`, `  networks = ["10.2.0.0/24"]`+"\n  public_key = \""+proxyPeerKey(t)+"\"")
	withKey = strings.ReplaceAll(withKey, `  networks = ["10.3.0.0/24"]`, `  networks = ["10.3.0.0/24"]`+"\n  public_key = \""+proxyPeerKey(t)+"\"")
	if _, err := LoadProxy("site.toml", []byte(withKey), newEnv()); err == nil || !strings.Contains(err.Error(), "sources is for plaintext only") {
		t.Errorf("sources with keys: %v", err)
	}
}

func mustKey(t *testing.T) string {
	k, err := ident.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k.String()
}

// pm_join_timeout and pm_join_backoff_max reach the proxy's path manager; a backoff shorter
// than the join timeout, a join timeout of 0, and either key with another path manager are
// refused with their line.
func TestLoadProxyPMJoin(t *testing.T) {
	for _, c := range []struct {
		lines         string
		join, backoff time.Duration
	}{
		{"", time.Second, 30 * time.Second},
		{"pm_join_timeout = \"2s\"\npm_join_backoff_max = \"1m\"\n", 2 * time.Second, time.Minute},
		{"pm_join_backoff_max = \"0\"\n", time.Second, 0},
		{"pm_join_timeout = 500\npm_join_backoff_max = \"500ms\"\n", 500 * time.Millisecond, 500 * time.Millisecond},
	} {
		p, err := LoadProxy("site.toml", proxySiteWith(c.lines), newEnv())
		if err != nil {
			t.Errorf("%q: %v", c.lines, err)
			continue
		}
		if p.PMJoinTimeout != c.join || p.PMJoinBackoffMax != c.backoff {
			t.Errorf("%q: pm_join_timeout %v, pm_join_backoff_max %v; want %v and %v", c.lines, p.PMJoinTimeout, p.PMJoinBackoffMax, c.join, c.backoff)
		}
	}
	for _, c := range []struct{ lines, want string }{
		{"pm_join_timeout = \"2s\"\npm_join_backoff_max = \"1s\"\n", `site.toml:4: proxy: pm_join_backoff_max 1s is shorter than pm_join_timeout 2s`},
		{"pm_join_backoff_max = \"500ms\"\n", `site.toml:3: proxy: pm_join_backoff_max 500ms is shorter than pm_join_timeout 1s`},
		{"pm_join_timeout = \"0\"\n", `site.toml:3: proxy: pm_join_timeout must be positive`},
		{"pm_join_backoff_max = \"-1s\"\n", `site.toml:3: proxy: negative pm_join_backoff_max "-1s"`},
		{"pm_join_backoff_max = \"soon\"\n", `site.toml:3: proxy: invalid pm_join_backoff_max "soon"`},
		{"path_manager = \"kernel\"\npm_join_backoff_max = \"1m\"\n", `site.toml:4: proxy: pm_join_backoff_max is a setting of path_manager "braid", not of "kernel"`},
		{"path_manager = \"none\"\npm_join_timeout = \"2s\"\n", `site.toml:4: proxy: pm_join_timeout is a setting of path_manager "braid", not of "none"`},
	} {
		_, err := LoadProxy("site.toml", proxySiteWith(c.lines), newEnv())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.lines, err, c.want)
		}
	}
}
