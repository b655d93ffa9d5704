package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/tunnel"
	"braid/internal/tunnel/session"
)

// The daemon with an uplink named by its interface alone: it binds to the interface's
// address, binds anew when the address changes (the peer's path roams there), and braid status
// says so, in the JSON and in the table.
func TestTunnelDaemonFollowsUplink(t *testing.T) {
	labtest.Require(t)
	pf := netip.MustParsePrefix
	tp := &topo.Topology{Name: "follow", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}, Links: []topo.Link{{Kernel: true,
		A: topo.Endpoint{Host: "a", Ifname: "tob", Addrs: []netip.Prefix{pf("10.9.1.1/24")}},
		B: topo.Endpoint{Host: "b", Ifname: "up0", Addrs: []netip.Prefix{pf("10.9.1.2/24")}}}}}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	ka, _ := session.GenerateKey()
	kb, _ := session.GenerateKey()
	siteA := fmt.Sprintf(`[tunnel]
private_key = %q
address = ["10.255.0.1/24"]
metrics = ""
[[tunnel.uplink]]
name = "tob"
interface = "tob"
address = "10.9.1.1"
[[tunnel.peer]]
name = "b"
public_key = %q
routes = ["10.255.0.2/32"]
path = [{ uplink = "tob" }]
`, ka.String(), kb.Public().String())
	siteB := fmt.Sprintf(`[tunnel]
private_key = %q
address = ["10.255.0.2/24"]
metrics = ""
[[tunnel.uplink]]
name = "wan"
interface = "up0"
[[tunnel.peer]]
name = "a"
public_key = %q
routes = ["10.255.0.1/32"]
path = [{ uplink = "wan", remote = "10.9.1.1:4754" }]
`, kb.String(), ka.Public().String())
	logs := map[string]*lockedWriter{}
	for h, site := range map[string]string{"a": siteA, "b": siteB} {
		file := filepath.Join(dir, h+".toml")
		if err := os.WriteFile(file, []byte(site), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self, "tunnel", "--config", file)
		logs[h] = &lockedWriter{w: &strings.Builder{}}
		cmd.Stderr = logs[h]
		if err := l.Host(h).Start(cmd); err != nil {
			t.Fatal(err)
		}
	}
	dump := func() string {
		var b strings.Builder
		for _, h := range []string{"a", "b"} {
			logs[h].mu.Lock()
			fmt.Fprintf(&b, "--- log of %s:\n%s\n", h, logs[h].w.String())
			logs[h].mu.Unlock()
		}
		return b.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status := func(h string) *tunnel.Status {
		out, err := l.Host(h).Run(ctx, self, "status", "--json")
		var rep statusReport
		if err != nil || json.Unmarshal(out, &rep) != nil || rep.Tunnel == nil {
			return nil // not serving yet
		}
		return rep.Tunnel
	}
	// wait until b's path is up from local, and a's path from b roamed there (or was learned).
	wait := func(local string) (*tunnel.Status, *tunnel.Status) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			sb, sa := status("b"), status("a")
			if sb != nil && sa != nil && len(sb.Peers) == 1 && len(sb.Peers[0].Paths) == 1 && len(sa.Peers[0].Paths) == 1 {
				pb, pa := sb.Peers[0].Paths[0], sa.Peers[0].Paths[0]
				if pb.State == "up" && pb.Local == local && pa.State == "up" && strings.HasPrefix(pa.Remote, strings.TrimSuffix(local, ":4754")+":") {
					return sa, sb
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("b's path not up from %s within 10 s: b %+v, a %+v\n%s", local, sb, sa, dump())
			}
		}
	}
	_, sb := wait("10.9.1.2:4754")
	if u := sb.Uplinks; len(u) != 1 || !u[0].Follow || u[0].State != "up" || u[0].Local != "10.9.1.2:4754" || u[0].Interface != "up0" {
		t.Errorf("b's uplink: %+v", u)
	}
	if err := l.Host("b").ReplaceAddr("up0", pf("10.9.1.2/24"), pf("10.9.1.20/24")); err != nil {
		t.Fatal(err)
	}
	sa, sb := wait("10.9.1.20:4754")
	if pa := sa.Peers[0].Paths[0]; pa.How != "roamed" || pa.Remote != "10.9.1.20:4754" {
		t.Errorf("a's path after b's renumbering: %s (%s), want roamed to 10.9.1.20:4754", pa.Remote, pa.How)
	}
	if sb.Counters["uplink_rebinds"] != 1 || sb.Uplinks[0].Rebinds != 1 {
		t.Errorf("b: uplink_rebinds %d, uplink's rebinds %d; want 1", sb.Counters["uplink_rebinds"], sb.Uplinks[0].Rebinds)
	}
	out, err := l.Host("b").Run(ctx, self, "status")
	if err != nil || !strings.Contains(string(out), "wan     up0        10.9.1.20:4754  the interface's  up") {
		t.Errorf("braid status in b: %v\n%s", err, out)
	}
	t.Logf("braid status in b:\n%s", out)
	out, err = l.Host("a").Run(ctx, self, "status")
	t.Logf("braid status in a:\n%s", out)
	if err != nil || !strings.Contains(string(out), "10.9.1.20:4754  roamed at") {
		t.Errorf("braid status in a: %v\n%s", err, out)
	}
}
