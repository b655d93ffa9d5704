package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type lispEnv struct{}

func (lispEnv) InterfaceExists(name string) bool     { return strings.HasPrefix(name, "wan") }
func (lispEnv) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

func TestLispConfigExample(t *testing.T) {
	data, err := os.ReadFile("testdata/lisp-site1.toml")
	if err != nil {
		t.Fatal(err)
	}
	x, err := LoadXTR("lisp-site1.toml", data, lispEnv{})
	if err != nil {
		t.Fatal(err)
	}
	if len(x.RLOCs) != 2 || x.RLOCs[1].Address != netip.MustParseAddr("10.0.2.1") || x.RLOCs[0].Weight != 50 ||
		x.DownAfter != 1500*time.Millisecond || !x.Placement || x.MapServers[0].Algorithm != "hmac-sha256" || x.RegisterTTL != 10 {
		t.Errorf("xtr %+v", x)
	}
	m, err := LoadMapserver("lisp-site1.toml", data)
	if err != nil {
		t.Fatal(err)
	}
	if !m.MapServer || !m.MapResolver || len(m.Sites) != 2 || m.Sites[1].Key != "site2-secret-0123456789" || m.Listen.Port() != 4342 ||
		m.Sites[0].Replay != "timestamp" {
		t.Errorf("mapserver %+v", m)
	}
}

func TestLispConfigErrors(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		want       []string
	}{
		{"xtr", `
[xtr]
eid_prefixes = ["192.168.1.0/24"]
map_resolvers = ["10.0.9.1"]
probe_interval = "1s"
down_after = "1s"
  [[xtr.rloc]]
  address = "10.0.1.1"
  interface = "eth9"
  priority = 300
  [[xtr.map_server]]
  address = "10.0.9.1:4342"
  algorithm = "md5"
`, []string{
			`x.toml:4: xtr: map_resolvers "10.0.9.1": want address:port`,
			`x.toml:6: xtr: down_after 1s: at least 2 × probe_interval = 2s`,
			`x.toml:9: rloc 1: interface "eth9" does not exist on this machine`,
			`x.toml:10: rloc 1: priority 300 outside 0..255`,
			`x.toml:11: map_server 1: key or key_file is required`,
			`x.toml:13: map_server 1: algorithm "md5": want hmac-sha1 or hmac-sha256`,
		}},
		{"mapserver", `
[mapserver]
roles = ["map-resolver"]
  [[mapserver.site]]
  name = "a"
  key = "short"
  eid_prefixes = ["10.1.0.1/24"]
  [[mapserver.site]]
  name = "a"
  eid_prefixes = ["10.1.0.0/24"]
  replay = "never"
`, []string{
			`x.toml:3: mapserver: a map-resolver without the map-server role needs forward = [map servers]`,
			`x.toml:6: site a: key is 5 bytes: at least 16`,
			`x.toml:7: site a: 10.1.0.1/24 has host bits set (did you mean 10.1.0.0/24?)`,
			`x.toml:9: site a: name "a" is used by another site`,
			`x.toml:10: site a: 10.1.0.0/24 is also configured for site a`,
			`x.toml:11: site a: replay "never": want "timestamp"`,
		}},
		{"xtr redundant", `
[xtr]
eid_prefixes = ["192.168.1.0/24"]
map_resolvers = [
  "10.0.9.1:4342",
  "10.0.9.5:4342",
  "10.0.9.1:4342",
]
request_timeout = "500ms"
resolver_timeout = "600ms"
resolver_backoff = "100ms"
  [[xtr.rloc]]
  address = "10.0.1.1"
  [[xtr.map_server]]
  address = "10.0.9.1:4342"
  key = "site1-secret-0123456789"
  [[xtr.map_server]]
  address = "10.0.9.1:4342"
  key = "site1-secret-0123456789"
`, []string{
			`x.toml:7: xtr: map_resolvers lists 10.0.9.1:4342 twice`,
			`x.toml:10: xtr: resolver_timeout 600ms: at most request_timeout (500ms)`,
			`x.toml:11: xtr: resolver_backoff 100ms: at least 1s`,
			`x.toml:18: map_server 2: map server 10.0.9.1:4342 is listed twice`,
		}},
		{"typo", "[mapserver]\nlisten_addr = \"1.2.3.4:1\"\n", []string{"listen_addr"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if strings.HasPrefix(tt.name, "xtr") {
				_, err = LoadXTR("x.toml", []byte(tt.file), lispEnv{})
			} else {
				_, err = LoadMapserver("x.toml", []byte(tt.file))
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestLispKeyFile: keys can live in their own file (relative to the site file), the default
// algorithm is HMAC-SHA-256, and short keys are refused wherever they come from.
func TestLispKeyFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "good.key"), []byte("0123456789abcdefXYZ\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "short.key"), []byte("0123\n"), 0o600)
	text := func(kf string) []byte {
		return []byte(`
[xtr]
eid_prefixes = ["192.168.1.0/24"]
map_resolvers = ["10.0.9.1:4342"]
  [[xtr.rloc]]
  address = "10.0.1.1"
  [[xtr.map_server]]
  address = "10.0.9.1:4342"
  key_file = "` + kf + `"
[mapserver]
  [[mapserver.site]]
  name = "s1"
  key_file = "` + kf + `"
  eid_prefixes = ["192.168.1.0/24"]
`)
	}
	site := filepath.Join(dir, "site.toml")
	x, err := LoadXTR(site, text("good.key"), lispEnv{})
	if err != nil {
		t.Fatal(err)
	}
	if x.MapServers[0].Key != "0123456789abcdefXYZ" || x.MapServers[0].Algorithm != "hmac-sha256" {
		t.Errorf("map server %+v", x.MapServers[0])
	}
	m, err := LoadMapserver(site, text("good.key"))
	if err != nil || m.Sites[0].Key != "0123456789abcdefXYZ" {
		t.Fatalf("mapserver: %v %+v", err, m)
	}
	_, err = LoadMapserver(site, text("short.key"))
	if err == nil || !strings.Contains(err.Error(), "the key in short.key is 4 bytes: at least 16") {
		t.Errorf("short key file: %v", err)
	}
	_, err = LoadXTR(site, text("missing.key"), lispEnv{})
	if err == nil || !strings.Contains(err.Error(), "key_file") {
		t.Errorf("missing key file: %v", err)
	}
}

// TestLispConfigRedundantMapping: several map resolvers (in order) and map servers are taken;
// resolver_timeout defaults to 300 ms and never exceeds request_timeout.
func TestLispConfigRedundantMapping(t *testing.T) {
	base := `
[xtr]
eid_prefixes = ["192.168.1.0/24"]
map_resolvers = ["10.0.9.5:4342", "[2001:db8::9]:4342", "10.0.9.1:4342"]
%s
  [[xtr.rloc]]
  address = "10.0.1.1"
  [[xtr.map_server]]
  address = "10.0.9.1:4342"
  key = "site1-secret-0123456789"
  [[xtr.map_server]]
  address = "10.0.9.5:4342"
  key = "site1-secret-0123456789"
`
	x, err := LoadXTR("x.toml", []byte(strings.Replace(base, "%s", "", 1)), lispEnv{})
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Resolvers) != 3 || x.Resolvers[0] != netip.MustParseAddrPort("10.0.9.5:4342") || x.Resolvers[1].Addr().Is4() ||
		len(x.MapServers) != 2 || x.MapServers[1].Address != netip.MustParseAddrPort("10.0.9.5:4342") ||
		x.ResolverTimeout != 300*time.Millisecond || x.ResolverBackoff != 30*time.Second {
		t.Errorf("xtr %+v", x)
	}
	x, err = LoadXTR("x.toml", []byte(strings.Replace(base, "%s", "request_timeout = \"200ms\"\nresolver_backoff = \"1m\"", 1)), lispEnv{})
	if err != nil {
		t.Fatal(err)
	}
	if x.ResolverTimeout != 200*time.Millisecond || x.ResolverBackoff != time.Minute {
		t.Errorf("resolver_timeout %v (want request_timeout 200ms), backoff %v", x.ResolverTimeout, x.ResolverBackoff)
	}
}
