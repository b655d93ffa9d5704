package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"braid/internal/gothreads"
	"braid/internal/lb"
	"braid/internal/lisp/mapserver"
	"braid/internal/lisp/xtr"
	"braid/internal/tunnel"
)

// The tunnel's table says what is not measured and what is down instead of showing the
// estimator's start-up guess or a dead path's last rate, and names a cleartext session.
func TestPrintTunnelStatus(t *testing.T) {
	moved := time.Date(2026, 11, 24, 21, 50, 1, 250e6, time.UTC)
	st := &tunnel.Status{PublicKey: "KEY", MTU: 1400, Uplinks: []tunnel.UplinkStatus{
		{Name: "dsl", Interface: "ppp0", Local: "192.168.1.2:4754"},
		{Name: "lte", Interface: "wwan0", Follow: true, State: "up", Local: "10.64.3.9:4754", Rebinds: 2},
		{Name: "5g", Interface: "wwan1", Follow: true, State: "absent"},
	}, Peers: []tunnel.PeerStatus{{
		Name: "b", Session: true, Cipher: "none (authenticated only, aes-256-gcm tag)", PeerBufferFree: -1,
		Paths: []tunnel.PathStatus{
			{ID: 1, State: "up", Capacity: 100e6, CapacityPhase: "startup", TxBytes: 777777, RxBytes: 888888}, // idle since start, probed
			{ID: 2, State: "down", Rate: 0, Capacity: 40e6, CapacityPhase: "cruise", CapacityMeasured: true},  // cut
			{ID: 3, State: "up", Rate: 30e6, RateMeasured: true, Capacity: 50e6, CapacityPhase: "cruise", CapacityMeasured: true, // busy, learned and moved
				Local: "198.51.100.1:4754", Remote: "203.0.113.2:50999", Origin: "learned", MovedAt: &moved, Moves: 2},
			{ID: 4, State: "up", Rate: 2e6, RateMeasured: true, Capacity: 10e6, CapacityMeasured: true},                                        // configured
			{ID: 5, State: "up", Rate: 9e6, RateMeasured: true, Capacity: 6e6, CapacityPhase: "cruise", CapacityMeasured: true, Unpaced: true}, // the one path left
		},
	}}}
	var b bytes.Buffer
	printTunnelStatus(&b, st)
	out := b.String()
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && len(f[0]) == 1 && f[0] >= "1" && f[0] <= "5" {
			rows[f[0]] = line
		}
	}
	for _, c := range []struct{ path, want, not string }{
		{"1", "unmeasured  unmeasured", "100"},
		{"2", "down", "Mbit"}, // the capacity is kept, but no rate
		{"3", "30 Mbit/s", "unmeasured"},
		{"3", "198.51.100.1:4754  203.0.113.2:50999  roamed at 21:50:01.250 (learned, 2 moves)", "unmeasured"},
		{"4", "configured 10 Mbit/s", "unmeasured"},
		{"3", "50 Mbit/s (cruise)", "unpaced"},
		{"5", "6 Mbit/s (cruise, unpaced)", "unmeasured"},
	} {
		row := rows[c.path]
		if !strings.Contains(row, c.want) || (c.path != "2" && strings.Contains(row, c.not)) {
			t.Errorf("path %s: %q, want %q and not %q", c.path, row, c.want, c.not)
		}
	}
	// Path 2 shows no local address ("-") nor origin: ID, -, state, RTT (2), loss (2), rate.
	if f := strings.Fields(rows["2"]); len(f) < 8 || f[7] != "-" {
		t.Errorf("a down path shows a rate: %q", rows["2"])
	}
	// Each uplink's address now, and how it got it.
	for _, want := range []string{
		"dsl     ppp0       192.168.1.2:4754  configured       -       0",
		"lte     wwan0      10.64.3.9:4754    the interface's  up      2",
		"5g      wwan1      -                 the interface's  absent  0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("uplinks: no %q in\n%s", want, out)
		}
	}
	if !strings.Contains(out, "cipher none (authenticated only") {
		t.Errorf("cleartext session not named:\n%s", out)
	}
	// An idle path's probes are not data: its data columns say 0.
	if strings.Contains(rows["1"], "777777") || strings.Contains(rows["1"], "888888") || !strings.Contains(rows["1"], "0 B") {
		t.Errorf("an idle path's probe bytes shown as data: %q", rows["1"])
	}
}

// braid status shows each role's own state, not just its name.
func TestPrintStatusRoles(t *testing.T) {
	lbDoc := lb.Status{Role: "lb", Services: []netip.AddrPort{netip.MustParseAddrPort("203.0.113.80:443")}, Mode: "mac", Aware: true,
		Backends: []lb.BackendStatus{{Name: "web1", State: "active", Weight: 1, Tokens: 3}}, Counters: map[string]uint64{"join_steered": 7}}
	msDoc := mapserverStatus{Role: "mapserver", Registrations: []mapserver.Registration{
		{Site: "site1", Prefix: netip.MustParsePrefix("192.168.1.0/24"), ETR: "10.0.1.1"},
		{Site: "site1", Prefix: netip.MustParsePrefix("fd00:1::/64"), ETR: "10.0.1.1"}},
		Counters: map[string]uint64{mapserver.CountRegistered: 5, mapserver.DropBadAuth: 2, mapserver.DropNotOwned: 1}}
	xtrDoc := xtrStatus{Role: "xtr", XTR: xtr.Status{
		Cache:    []xtr.EntryStatus{{Prefix: netip.MustParsePrefix("192.168.2.0/24"), TTL: 10}},
		Pairs:    []xtr.PairStatus{{Local: netip.MustParseAddr("10.0.1.1"), Remote: netip.MustParseAddr("10.0.2.1"), Up: true, RTT: time.Millisecond}},
		Counters: map[string]uint64{"encapsulated": 11}}}
	for _, c := range []struct {
		role string
		doc  any
		want []string
	}{
		{"lb", lbDoc, []string{"load balancer", "203.0.113.80:443", "web1", "active", "3 tokens", "join_steered"}},
		{"mapserver", msDoc, []string{"1 sites registered, 2 EID prefixes", "accepted 5, refused 3", "192.168.1.0/24"}},
		{"xtr", xtrDoc, []string{"1 map-cache entries, 1 RLOC pairs (1 up)", "192.168.2.0/24", "10.0.2.1", "encapsulated"}},
	} {
		body, _ := json.Marshal(c.doc)
		var o, e bytes.Buffer
		if code := printStatus(env{stdout: &o, stderr: &e}, c.role, body, false); code != exitOK {
			t.Errorf("%s: exit %d: %s", c.role, code, e.String())
		}
		for _, w := range c.want {
			if !strings.Contains(o.String(), w) {
				t.Errorf("%s status lacks %q:\n%s", c.role, w, o.String())
			}
		}
	}
}

// The control socket answers status requests, refuses a second server on its name, and an
// abstract one needs no file.
func TestControlStatus(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, sock := range []string{fmt.Sprintf("@braid-test/%x", rand.Uint64()), filepath.Join(t.TempDir(), "ctl.sock")} {
		applied := ""
		stop, err := serveControl(ctx, sock, func(r pathRequest) error { applied = r.Action; return nil },
			func() any { return statusReport{Role: "tunnel", Tunnel: &tunnel.Status{PublicKey: "KEY"}} })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := serveControl(ctx, sock, func(pathRequest) error { return nil }, nil); err == nil || !strings.Contains(err.Error(), "another") {
			t.Errorf("%s: a second role took the socket over: %v", sock, err)
		}
		body, err := controlStatus(sock)
		if err != nil || !strings.Contains(string(body), `"KEY"`) {
			t.Errorf("%s: status %s, %v", sock, body, err)
		}
		if _, err := callControl(sock, pathRequest{Action: "down", Peer: "b", Path: 1}); err != nil || applied != "down" {
			t.Errorf("%s: request not applied: %v %q", sock, err, applied)
		}
		code, out, errOut := run("status", "--control", sock)
		if code != exitOK || !strings.Contains(out, "public key KEY") {
			t.Errorf("braid status --control %s: %d %q %q", sock, code, out, errOut)
		}
		stop()
		if _, err := controlStatus(sock); err == nil {
			t.Errorf("%s still answers after stop", sock)
		}
	}
}

// A path of mode mpt that is down says why (the peer announced it, its interface is down, …).
func TestPrintMPTStatusReason(t *testing.T) {
	var b bytes.Buffer
	printMPTStatus(env{stdout: &b}, &tunnel.MPTStatus{IPVersion: 4, Paths: []tunnel.MPTPathStatus{
		{ID: 1, State: "up", Status: "ok"},
		{ID: 2, State: "down", Status: "peer_down"},
	}})
	out := b.String()
	if !strings.Contains(out, "down (peer_down)") || strings.Contains(out, "up (ok)") {
		t.Errorf("mpt status:\n%s", out)
	}
}

// TestPrintThreads: braid status says how many Go threads the tunnel runs on and why.
func TestPrintThreads(t *testing.T) {
	for _, c := range []struct {
		st   gothreads.Status
		want string
	}{
		{gothreads.Status{Setting: "auto", Threads: 1, Max: 2, Busy: 0.42, Changes: 3}, "Go threads: 1 (auto: one while a core suffices, up to 2; changed 3 times); the process used 0.42 cores over the last 500ms"},
		{gothreads.Status{Setting: "4", Threads: 4, Max: 2, Busy: 1.5}, "Go threads: 4 (threads = 4); the process used 1.50 cores"},
		{gothreads.Status{Setting: "environment", Threads: 2, Max: 2}, "Go threads: 2 (GOMAXPROCS from the environment)"},
	} {
		var b bytes.Buffer
		printThreads(&b, &c.st)
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("%+v: printed %q, want %q in it", c.st, b.String(), c.want)
		}
	}
}
