package app

import (
	"context"
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
	"braid/internal/tunnel/session"
)

// Two tunnels in two network namespaces of one machine, both with the default control socket
// and no metrics: each 'braid status' and 'braid tunnel path' without flags reaches the tunnel
// of its own namespace. With the old default (/run/braid/tunnel.sock, one file for the whole
// machine) the second tunnel took the first one's socket, and status needed metrics.
func TestTunnelDefaultsPerNamespace(t *testing.T) {
	labtest.Require(t)
	tp := &topo.Topology{Name: "tunns", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}}
	tp.Links = append(tp.Links, topo.Link{
		A:  topo.Endpoint{Host: "a", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.1/24")}},
		B:  topo.Endpoint{Host: "b", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}},
		AB: topo.Shape{Delay: 2 * time.Millisecond}, BA: topo.Shape{Delay: 2 * time.Millisecond},
	})
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	var keys [2]session.PrivateKey
	for i := range keys {
		keys[i], _ = session.GenerateKey()
	}
	hosts := []string{"a", "b"}
	logs := make([]*strings.Builder, 2)
	for side, h := range hosts {
		var b strings.Builder
		fmt.Fprintf(&b, "[tunnel]\nprivate_key = %q\ninterface = \"braid0\"\naddress = [\"10.255.0.%d/24\"]\nmetrics = \"\"\n", keys[side].String(), side+1)
		fmt.Fprintf(&b, "[[tunnel.uplink]]\nname = \"up0\"\ninterface = \"eth0\"\naddress = \"10.9.0.%d\"\n", side+1)
		fmt.Fprintf(&b, "[[tunnel.peer]]\nname = \"other\"\npublic_key = %q\nroutes = [\"10.255.0.%d/32\"]\n", keys[1-side].Public().String(), 2-side)
		fmt.Fprintf(&b, "[[tunnel.peer.path]]\nuplink = \"up0\"\nremote = \"10.9.0.%d:4754\"\n", 2-side)
		file := filepath.Join(dir, h+".toml")
		if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self, "tunnel", "--config", file)
		logs[side] = &strings.Builder{}
		cmd.Stderr = &lockedWriter{w: logs[side]}
		if err := l.Host(h).Start(cmd); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	status := func(h string) string {
		out, _ := l.Host(h).Run(ctx, self, "status")
		return string(out)
	}
	for side, h := range hosts {
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(status(h), "session ") {
			if time.Now().After(deadline) {
				t.Fatalf("no session in %s's status after 10 s:\n%s\nlog a:\n%s\nlog b:\n%s", h, status(h), logs[0], logs[1])
			}
			time.Sleep(100 * time.Millisecond)
		}
		st := status(h)
		own, other := keys[side].Public().String(), keys[1-side].Public().String()
		if !strings.Contains(st, "public key "+own) || strings.Contains(st, other) {
			t.Errorf("braid status in %s does not show %s's own tunnel (key %s):\n%s", h, h, own, st)
		}
	}
	if out, err := l.Host("a").Run(ctx, self, "tunnel", "path", "down", "other", "1"); err != nil {
		t.Fatalf("tunnel path down in a, default control socket: %v %s", err, out)
	}
	if st := status("a"); !strings.Contains(st, "admin-down") {
		t.Errorf("a's path is not admin-down after 'braid tunnel path down' in a:\n%s", st)
	}
	if st := status("b"); strings.Contains(st, "admin-down") {
		t.Errorf("'braid tunnel path down' in a changed b's tunnel:\n%s", st)
	}
}

// A map server with no status address ('metrics = ""'), in a namespace of its own: 'braid
// status' without flags finds it on its default control socket (@braid/mapserver), as it finds
// the tunnel's and the balancer's, and prints its state.
func TestStatusFindsMapServerByControl(t *testing.T) {
	labtest.Require(t)
	tp := &topo.Topology{Name: "statms", Hosts: []topo.Host{{Name: "ms"}, {Name: "x"}}}
	tp.Links = append(tp.Links, topo.Link{
		A: topo.Endpoint{Host: "ms", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.1/24")}},
		B: topo.Endpoint{Host: "x", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}},
	})
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	file := filepath.Join(t.TempDir(), "ms.toml")
	site := "[mapserver]\nlisten = \"10.9.0.1:4342\"\nmetrics = \"\"\n[[mapserver.site]]\nname = \"site1\"\nkey = \"site1-secret-0123456789\"\neid_prefixes = [\"192.168.1.0/24\"]\n"
	if err := os.WriteFile(file, []byte(site), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "mapserver", "--config", file)
	var log strings.Builder
	cmd.Stderr = &lockedWriter{w: &log}
	if err := l.Host("ms").Start(cmd); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []byte
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if out, err = l.Host("ms").Run(ctx, self, "status"); err == nil {
			break
		}
	}
	if err != nil || !strings.Contains(string(out), "map server: 0 sites registered") {
		t.Fatalf("braid status beside a map server without metrics: %v\n%s\nits log:\n%s", err, out, log.String())
	}
	// Another namespace has no braid role: status says where it looked and fails.
	out, err = l.Host("x").Run(ctx, self, "status")
	if err == nil || !strings.Contains(string(out), "@braid/mapserver") {
		t.Errorf("braid status where nothing runs: %v\n%s", err, out)
	}
}
