package tunnel

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"braid/internal/tunnel/session"
)

func TestReloadDiffPeers(t *testing.T) {
	k1, _ := session.GenerateKey()
	k2, _ := session.GenerateKey()
	pfx := func(s string) []netip.Prefix { return []netip.Prefix{netip.MustParsePrefix(s)} }
	fixed := func(up, remote string) PathConfig {
		return PathConfig{Uplink: up, Remote: netip.MustParseAddrPort(remote)}
	}
	base := PeerConfig{Name: "b", PublicKey: k1.Public(), Routes: pfx("10.2.0.0/16"),
		Paths: []PathConfig{fixed("a", "192.0.2.1:4754"), fixed("b", "192.0.2.2:4754")}}
	with := func(f func(*PeerConfig)) PeerConfig {
		pc := base
		pc.Routes = slices.Clone(base.Routes)
		pc.Paths = slices.Clone(base.Paths)
		f(&pc)
		return pc
	}
	for _, tc := range []struct {
		name     string
		cur      PeerConfig
		replaced map[string]bool
		want     peerAction
	}{
		{"same", base, nil, peerKeep},
		{"new key", with(func(pc *PeerConfig) { pc.PublicKey = k2.Public() }), nil, peerReplace},
		{"fixed to learned", with(func(pc *PeerConfig) { pc.Paths = []PathConfig{{Uplink: "a"}} }), nil, peerReplace},
		{"routes", with(func(pc *PeerConfig) { pc.Routes = append(pc.Routes, pfx("10.3.0.0/16")...) }), nil, peerUpdate},
		{"path added", with(func(pc *PeerConfig) { pc.Paths = append(pc.Paths, fixed("c", "192.0.2.3:4754")) }), nil, peerUpdate},
		{"path removed", with(func(pc *PeerConfig) { pc.Paths = pc.Paths[:1] }), nil, peerUpdate},
		{"capacity", with(func(pc *PeerConfig) { pc.Paths[1].Capacity = 50e6 }), nil, peerUpdate},
		{"weight", with(func(pc *PeerConfig) { pc.Paths[0].Weight = 2 }), nil, peerUpdate},
		{"keepalive", with(func(pc *PeerConfig) { pc.Keepalive = 5 * time.Second }), nil, peerUpdate},
		{"uplink replaced", base, map[string]bool{"b": true}, peerUpdate},
		{"other uplink replaced", base, map[string]bool{"z": true}, peerKeep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := diffPeers([]PeerConfig{base}, []PeerConfig{tc.cur}, tc.replaced)
			if len(got) != 1 || got[0] != (peerDiff{"b", tc.want}) {
				t.Fatalf("diffPeers = %v, want [{b %v}]", got, tc.want)
			}
		})
	}
	t.Run("added and removed", func(t *testing.T) {
		c := with(func(pc *PeerConfig) { pc.Name = "c" })
		got := diffPeers([]PeerConfig{base}, []PeerConfig{c}, nil)
		want := []peerDiff{{"c", peerAdd}, {"b", peerRemove}}
		if !slices.Equal(got, want) {
			t.Fatalf("diffPeers = %v, want %v", got, want)
		}
	})
}

func TestReloadDiffPaths(t *testing.T) {
	p := func(up, remote string) PathConfig {
		return PathConfig{Uplink: up, Remote: netip.MustParseAddrPort(remote)}
	}
	old := []PathConfig{p("a", "192.0.2.1:1"), p("b", "192.0.2.1:1"), p("a", "192.0.2.2:1")}
	for _, tc := range []struct {
		name     string
		cur      []PathConfig
		replaced map[string]bool
		want     []int
	}{
		{"same", old, nil, []int{0, 1, 2}},
		{"reordered", []PathConfig{old[2], old[0]}, nil, []int{2, 0}},
		{"weight changed keeps the path", []PathConfig{{Uplink: "a", Remote: old[0].Remote, Weight: 3}}, nil, []int{0}},
		{"new remote is a new path", []PathConfig{p("a", "192.0.2.9:1"), old[1]}, nil, []int{-1, 1}},
		{"IPv4-mapped remote is the same", []PathConfig{p("a", "[::ffff:192.0.2.1]:1")}, nil, []int{0}},
		{"replaced uplink", old, map[string]bool{"a": true}, []int{-1, 1, -1}},
		{"twice in the file: matched once", []PathConfig{old[0], old[0]}, nil, []int{0, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := diffPaths(old, tc.cur, tc.replaced); !slices.Equal(got, tc.want) {
				t.Fatalf("diffPaths = %v, want %v", got, tc.want)
			}
		})
	}
}

type nopDev struct{}

func (nopDev) Read(b []byte) (int, error)  { select {} }
func (nopDev) Write(b []byte) (int, error) { return len(b), nil }
func (nopDev) Close() error                { return nil }

type nopConn struct{}

func (nopConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) { select {} }
func (nopConn) Send(b []byte, dst netip.AddrPort) error                   { return nil }
func (nopConn) Close() error                                              { return nil }

// The lookups the packet loops make in the table a reload replaces allocate nothing, before
// and after a reload.
func TestReloadTableLookupsAllocate(t *testing.T) {
	k, _ := session.GenerateKey()
	pk, _ := session.GenerateKey()
	peerCfg := func(name, route string) PeerConfig {
		return PeerConfig{Name: name, PublicKey: pk.Public(), Routes: []netip.Prefix{netip.MustParsePrefix(route)},
			Paths: []PathConfig{{Uplink: "u", Remote: netip.MustParseAddrPort("192.0.2.1:4754")}}}
	}
	ups := []Uplink{{Name: "u", Conn: nopConn{}}}
	tn, err := New(Options{PrivateKey: k, Device: nopDev{}, Uplinks: ups, Peers: []PeerConfig{peerCfg("a", "10.1.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	dst, src := netip.MustParseAddr("10.2.0.1"), netip.MustParseAddr("10.2.0.9")
	check := func(when string) {
		t.Helper()
		var p *peer
		if n := testing.AllocsPerRun(1000, func() {
			if p = tn.lookup(dst); p != nil {
				p.accepts(src)
				p.pathList()
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations per lookup", when, n)
		}
	}
	check("before")
	if _, err := tn.Reload(Config{Uplinks: ups, Peers: []PeerConfig{peerCfg("a", "10.1.0.0/16"), peerCfg("b", "10.2.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	if p := tn.lookup(dst); p == nil || p.name != "b" {
		t.Fatalf("10.2.0.1 goes to %v after the reload, want b", p)
	}
	check("after")
}
