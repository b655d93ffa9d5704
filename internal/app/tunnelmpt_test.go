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
)

// mpt mode's command port through the command line: two braid endpoints with cmd_port and
// auth_type 2; 'braid tunnel path down' on one takes the path down on the other through MPT's
// path-status exchange, and 'path up' brings it back.
func TestTunnelCommandMPTPathStatus(t *testing.T) {
	labtest.Require(t)
	tp := &topo.Topology{Name: "tunmptcmd", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}}
	for i := range 2 {
		tp.Links = append(tp.Links, topo.Link{
			A: topo.Endpoint{Host: "a", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.1/24", i))}},
			B: topo.Endpoint{Host: "b", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.2/24", i))}},
		})
	}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	sockets := map[string]string{}
	for side, h := range []string{"a", "b"} {
		sockets[h] = filepath.Join(dir, h+".sock")
		var b strings.Builder
		fmt.Fprintf(&b, "[tunnel]\nmode = \"mpt\"\naddress = [\"10.255.0.%d/24\"]\ncontrol = %q\nmetrics = \"\"\n", side+1, sockets[h])
		for i := range 2 {
			fmt.Fprintf(&b, "[[tunnel.uplink]]\nname = \"up%d\"\ninterface = \"eth%d\"\naddress = \"10.9.%d.%d\"\n", i, i, i, side+1)
		}
		fmt.Fprintf(&b, "[[tunnel.peer]]\nname = \"other\"\nroutes = [\"10.255.0.%d/32\"]\nkeepalive = \"100ms\"\nremote_tunnel_ip = \"10.255.0.%d\"\n", 2-side, 2-side)
		b.WriteString("cmd_port = 60456\nremote_cmd_port = 60456\nauth_type = 2\nauth_key = \"00112233445566778899aabbccddeeff\"\n")
		for i := range 2 {
			fmt.Fprintf(&b, "[[tunnel.peer.path]]\nuplink = \"up%d\"\nremote = \"10.9.%d.%d:4754\"\n", i, i, 2-side)
		}
		file := filepath.Join(dir, h+".toml")
		os.WriteFile(file, []byte(b.String()), 0o600)
		if err := l.Host(h).Start(exec.Command(self, "tunnel", "--config", file)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	paths := func(h string) []tunnel.MPTPathStatus {
		out, err := l.Host(h).Run(ctx, self, "status", "--control", sockets[h], "--json")
		if err != nil {
			return nil
		}
		var doc struct{ MPT *tunnel.MPTStatus }
		if json.Unmarshal(out, &doc) != nil || doc.MPT == nil {
			return nil
		}
		return doc.MPT.Paths
	}
	status := func(h string, i int) string {
		if ps := paths(h); len(ps) > i {
			return ps[i].Status
		}
		return ""
	}
	wait := func(h string, i int, want string) bool {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if status(h, i) == want {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		return false
	}
	if !wait("a", 1, "ok") || !wait("b", 1, "ok") {
		t.Fatalf("path 2 not up: a %q, b %q", status("a", 1), status("b", 1))
	}
	if out, err := l.Host("a").Run(ctx, self, "tunnel", "path", "down", "other", "2", "--control", sockets["a"]); err != nil {
		t.Fatalf("path down: %v: %s", err, out)
	}
	if !wait("a", 1, "path_down_manual") || !wait("b", 1, "peer_down") {
		t.Errorf("after path down on a: a %q, b %q; want path_down_manual and peer_down", status("a", 1), status("b", 1))
	}
	if out, err := l.Host("a").Run(ctx, self, "tunnel", "path", "up", "other", "2", "--control", sockets["a"]); err != nil {
		t.Fatalf("path up: %v: %s", err, out)
	}
	if !wait("a", 1, "ok") || !wait("b", 1, "ok") {
		t.Errorf("after path up on a: a %q, b %q; want ok on both", status("a", 1), status("b", 1))
	}
	if out, err := l.Host("a").Run(ctx, self, "tunnel", "path", "weight", "other", "2", "3", "--control", sockets["a"]); err == nil {
		t.Errorf("path weight in mode mpt succeeded: %s", out)
	}
}
