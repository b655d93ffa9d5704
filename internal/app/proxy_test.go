package app

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"braid/internal/config"
	"braid/internal/experiment/federation"
	"braid/internal/proxy"
	"braid/internal/proxy/ident"
)

func TestProxyHelpKeygenCheck(t *testing.T) {
	code, out, _ := run("proxy", "--help")
	if code != 0 || !strings.Contains(out, "braid proxy --cleanup") || !strings.Contains(out, "Example:") {
		t.Errorf("help: %d %q", code, out)
	}
	if code, _, errOut := run("proxy"); code != exitUsage || !strings.Contains(errOut, "--config") {
		t.Errorf("no config: %d %q", code, errOut)
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "p.key")
	code, out, errOut := run("proxy", "keygen", "--out", keyFile)
	if code != 0 || !strings.Contains(out, "public key") {
		t.Fatalf("keygen: %d %q %q", code, out, errOut)
	}
	if code, _, _ := run("proxy", "keygen", "--out", keyFile); code == 0 {
		t.Error("keygen overwrote a key file")
	}
	data, _ := os.ReadFile(keyFile)
	var o, e bytes.Buffer
	if code := Main([]string{"proxy", "keygen", "--public"}, bytes.NewReader(data), &o, &e); code != 0 || !strings.Contains(out, strings.TrimSpace(o.String())) {
		t.Errorf("--public: %d %q, keygen said %q", code, o.String(), out)
	}
	k, _ := ident.ParsePrivateKey(strings.TrimSpace(string(data)))
	peer, _ := ident.Generate()
	site := federation.FedSite{Side: 1, Links: 1, Key: k, PeerKey: peer.Public(), PM: "none", Mode: "redirect"}.Bytes()
	// The uplink interface wan0 does not exist here; the check says so with its line.
	file := filepath.Join(dir, "site.toml")
	os.WriteFile(file, site, 0o600)
	code, _, errOut = run("proxy", "check", "--config", file)
	if code != exitError || !strings.Contains(errOut, `interface "wan0" does not exist`) || !strings.Contains(errOut, "site.toml:") {
		t.Errorf("check: %d %q", code, errOut)
	}
	good := strings.Replace(string(site), `interface = "wan0"`, `interface = "lo"`, 1)
	os.WriteFile(file, []byte(good), 0o600)
	if code, out, errOut := run("proxy", "check", "--config", file); code != 0 || !strings.Contains(out, "valid (mode redirect, 2 tenants") {
		t.Errorf("check of a good file: %d %q %q", code, out, errOut)
	}
}

func TestProxyStatusTable(t *testing.T) {
	st := proxy.Status{Uptime: 90 * time.Second, Encrypted: true, Unauthenticated: 3, MaxUnauthenticated: 256, Tenants: []proxy.TenantStatus{{Name: "blue", Out: 3, In: 1, Active: 1,
		PoolReady: map[string]int{"site2": 2}, Refused: map[string]uint64{"auth_failed": 4}}},
		Connections: []proxy.ConnStatus{{ID: 7, Tenant: "blue", Role: "out", Peer: "site2", Src: netip.MustParseAddrPort("10.1.0.1:4000"),
			Dst: netip.MustParseAddrPort("10.2.0.1:80"), BytesUp: 10, Down: 20, MPTCP: true, Unacked: 2270000, Undelivered: 2230000, LastAck: 16 * time.Millisecond,
			Subflows: []proxy.SubflowStatus{{Local: netip.MustParseAddrPort("10.9.0.1:45000"), Remote: netip.MustParseAddrPort("10.9.1.2:7101"), RTT: 2 * time.Millisecond,
				Unacked: 31, NotSent: 20016, LastAck: 236 * time.Millisecond, TCPState: 1},
				{Local: netip.MustParseAddrPort("10.9.0.1:38034"), Remote: netip.MustParseAddrPort("10.9.0.2:7101"), NotSent: 18051634, TCPState: 7}}}}}
	body, _ := json.Marshal(map[string]any{"role": "proxy", "proxy": st, "path_manager": "braid", "announced": 1})
	var o, e bytes.Buffer
	if code := printProxyStatus(env{stdout: &o, stderr: &e}, body, false); code != 0 {
		t.Fatalf("code %d: %s", code, e.String())
	}
	for _, want := range []string{"TLS 1.3", "auth_failed=4", "10.1.0.1:4000", "10.9.1.2:7101", "rtt 2.0 ms", "blue", "3/256 peer connections unauthenticated",
		"UNACKED", "2270000 B (2230000 B delivered by subflows), last ack 16ms ago", "in flight 31, unsent 20016 B, last ack 236ms ago", "not established (TCP state 7)"} {
		if !strings.Contains(o.String(), want) {
			t.Errorf("missing %q in:\n%s", want, o.String())
		}
	}
	// A closed subflow's stale counters are not shown as data waiting.
	if strings.Contains(o.String(), "18051634") {
		t.Errorf("a closed subflow shown with its unsent bytes:\n%s", o.String())
	}
}

// A reload refuses what only a restart applies and names the file's keys; the path manager's
// pm_ settings reload while path_manager stays "braid".
func TestProxyRestartOnly(t *testing.T) {
	base := config.ProxyDefaults()
	for _, c := range []struct {
		name   string
		change func(*config.Proxy)
		want   string // "" for a change a reload applies
	}{
		{"tenants", func(p *config.Proxy) { p.Tenants = []config.ProxyTenant{{Name: "blue"}} }, ""},
		{"pm_policy", func(p *config.Proxy) { p.PMPolicy = "rbpm" }, ""},
		{"pm joins", func(p *config.Proxy) { p.PMJoinTimeout, p.PMJoinBackoffMax = 2*time.Second, 0 }, ""},
		{"pool", func(p *config.Proxy) { p.Pool = 8 }, "pool changed"},
		{"timeouts", func(p *config.Proxy) { p.ConnectTimeout, p.DrainTimeout = time.Second, time.Second }, "connect_timeout, drain_timeout changed"},
		{"key", func(p *config.Proxy) { p.HasKey = true }, "private_key changed"},
		{"path manager", func(p *config.Proxy) { p.PathManager, p.PMPolicy = "kernel", "rbpm" }, "path_manager, pm_policy changed"},
	} {
		cur := base
		c.change(&cur)
		err := proxyRestartOnly(&base, &cur)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want+":")):
			t.Errorf("%s: error %v, want it to begin %q", c.name, err, c.want)
		}
	}
}
