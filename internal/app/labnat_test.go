package app

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/labtest"
)

const natCLITopology = `name = "cli-nat"
[[host]]
name = "site"
route = [ { dst = "default", via = "192.168.1.1" } ]
[[host]]
name = "cpe"
nat = { outside = "wan", random_ports = true, udp_timeout = "20s" }
[[host]]
name = "public"
[[link]]
a = "site"
b = "cpe"
a_ifname = "up1"
a_addr = "192.168.1.2/24"
b_addr = "192.168.1.1/24"
[[link]]
name = "wan"
a = "cpe"
b = "public"
a_ifname = "wan"
a_addr = "198.51.100.2/24"
b_addr = "198.51.100.1/24"
`

// The NAT events from the command line: braid lab nat, iface, link --if-down, against a lab
// started with lab up --detach.
func TestLabNATCommandLine(t *testing.T) {
	labtest.Require(t)
	if _, ok := labtest.Tool(t, "nft"); !ok {
		labtest.Skip(t, "NAT needs nft (Debian package nftables)")
	}
	self, _ := os.Executable()
	file := filepath.Join(t.TempDir(), "nat.toml")
	os.WriteFile(file, []byte(natCLITopology), 0o644)
	out, err := braidCmd(self, "lab", "up", file, "--detach").CombinedOutput()
	m := regexp.MustCompile(`lab ([0-9a-f]{6}) is up in the background`).FindStringSubmatch(string(out))
	if err != nil || m == nil {
		lab.ReapStale(nil)
		t.Fatalf("lab up --detach: %v\n%s", err, out)
	}
	id := m[1]
	t.Cleanup(func() { lab.Down(lab.DownOptions{ID: id, Wait: 5 * time.Second}) })
	if !strings.Contains(string(out), "host cpe is a NAT: outside wan, random ports, UDP mappings expire after 20s idle") {
		t.Errorf("lab up does not describe the NAT:\n%s", out)
	}
	braid := func(args ...string) (string, error) {
		out, err := braidCmd(self, append([]string{"lab"}, args...)...).CombinedOutput()
		return string(out), err
	}

	// A mapping made by a datagram from the site (the machine may have no ping).
	send := []string{"exec", "--lab", id, "site", "--", "bash", "-c", "echo hello > /dev/udp/198.51.100.1/7000"}
	if out, err := braid(send...); err != nil {
		t.Fatalf("a datagram through the NAT: %v\n%s", err, out)
	}
	if out, err := braid("nat", "--lab", id); err != nil || !regexp.MustCompile(`udp\s+192\.168\.1\.2:\d+\s+198\.51\.100\.1:7000\s+198\.51\.100\.2:\d+\s+(19|20)s`).MatchString(out) {
		t.Errorf("lab nat: %v\n%s", err, out)
	}
	if out, err := braid("nat", "--lab", id, "cpe", "--flush"); err != nil || !regexp.MustCompile(`flushed [1-9]\d* entries`).MatchString(out) || !strings.Contains(out, "no mappings") {
		t.Errorf("lab nat cpe --flush: %v\n%s", err, out)
	}
	if out, err := braid("nat", "--lab", id, "site"); err == nil || !strings.Contains(out, "not a NAT host: host site") {
		t.Errorf("lab nat site: %v\n%s", err, out)
	}

	if out, err := braid("iface", "--lab", id, "cpe", "wan", "--del", "198.51.100.2/24", "--add", "198.51.100.3/24"); err != nil || !strings.Contains(out, "cpe wan: up, addresses 198.51.100.3/24") {
		t.Errorf("lab iface --del --add: %v\n%s", err, out)
	}
	if out, err := braid("iface", "--lab", id, "site", "up1", "--down"); err != nil || !strings.Contains(out, "site up1: DOWN") {
		t.Errorf("lab iface --down: %v\n%s", err, out)
	}
	if out, err := braid(send...); err == nil || !strings.Contains(out, "unreachable") {
		t.Errorf("a datagram with the site's uplink down: %v\n%s", err, out)
	}
	if out, err := braid("iface", "--lab", id, "site", "up1", "--up"); err != nil || !strings.Contains(out, "site up1: up, addresses 192.168.1.2/24") {
		t.Errorf("lab iface --up: %v\n%s", err, out)
	}
	if out, err := braid(send...); err != nil {
		t.Errorf("a datagram after the uplink came back (its default route restored): %v\n%s", err, out)
	}
	if out, err := braid("nat", "--lab", id); err != nil || !strings.Contains(out, "198.51.100.3:") {
		t.Errorf("lab nat after the new outside address: %v\n%s", err, out)
	}
	if out, err := braid("iface", "--lab", id, "site", "up1", "--add", "10.0.0.1"); err == nil || !strings.Contains(out, "address/length") {
		t.Errorf("lab iface --add without a length: %v\n%s", err, out)
	}

	if out, err := braid("link", "--lab", id, "--name", "wan", "--if-down"); err != nil || !strings.Contains(out, "DOWN") {
		t.Errorf("lab link --if-down: %v\n%s", err, out)
	}
	if out, err := braid("status", "--lab", id); err != nil || !strings.Contains(out, "DOWN") {
		t.Errorf("lab status after --if-down: %v\n%s", err, out)
	}
	if out, err := braid("link", "--lab", id, "--name", "wan", "--if-up"); err != nil || strings.Contains(out, "DOWN") {
		t.Errorf("lab link --if-up: %v\n%s", err, out)
	}
}
