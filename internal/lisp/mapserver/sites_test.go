package mapserver

import (
	"net/netip"
	"slices"
	"testing"

	"braid/internal/wire/lisp"
)

// TestMapserverSetSites: a reload keeps the registrations of unchanged sites and those a
// changed site still owns, with its replay state; drops a removed site's and the prefixes a
// site no longer owns; takes a new site's; and refuses a prefix configured twice with nothing
// changed.
func TestMapserverSetSites(t *testing.T) {
	s := testServer(t)
	for _, r := range []struct {
		nonce    uint64
		key      string
		prefixes []string
	}{{1, "secret-x1", []string{"192.168.101.0/24", "fd01::/48"}}, {2, "secret-x2", []string{"192.168.102.0/24"}}, {3, "secret-x3", []string{"192.168.103.0/24"}}} {
		if out := s.Handle(t0, etr1, signed(t, r.nonce, lisp.AlgHMACSHA1, 20, r.key, 0, r.prefixes...), nil); len(out) != 1 {
			t.Fatalf("registration %v not taken", r.prefixes)
		}
	}
	if len(s.Registrations(t0)) != 4 {
		t.Fatalf("registrations %+v", s.Registrations(t0))
	}
	sites := []Site{
		{Name: "x1", Keys: map[uint8][]byte{0: []byte("secret-x1")}, Prefixes: []netip.Prefix{pfx("192.168.101.0/24")}},
		{Name: "x3", Keys: map[uint8][]byte{0: []byte("secret-x3"), 7: []byte("rollover")}, Prefixes: []netip.Prefix{pfx("192.168.103.0/24")}},
		{Name: "x4", Keys: map[uint8][]byte{0: []byte("secret-x4")}, Prefixes: []netip.Prefix{pfx("192.168.104.0/24")}},
	}
	changes, err := s.SetSites(sites)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.What+" "+c.Site)
	}
	slices.Sort(got)
	if want := []string{"site added x4", "site changed x1", "site removed x2"}; !slices.Equal(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
	for _, c := range changes {
		if c.Site == "x1" && (!slices.Equal(c.Changed, []string{"prefixes"}) || !slices.Equal(c.Dropped, []netip.Prefix{pfx("fd01::/48")})) {
			t.Errorf("x1's change %+v", c)
		}
		if c.Site == "x2" && !slices.Equal(c.Dropped, []netip.Prefix{pfx("192.168.102.0/24")}) {
			t.Errorf("x2's change %+v", c)
		}
	}
	var kept []netip.Prefix
	for _, r := range s.Registrations(t0) {
		kept = append(kept, r.Prefix)
		if !r.Registered.Equal(t0) {
			t.Errorf("registration %v replaced", r.Prefix)
		}
	}
	if !slices.Equal(kept, []netip.Prefix{pfx("192.168.101.0/24"), pfx("192.168.103.0/24")}) {
		t.Errorf("registrations after the reload: %v", kept)
	}
	// x1's replay state came along: its nonce 1 is still a replay.
	before := s.Counters()[DropReplay]
	s.Handle(t0, etr1, signed(t, 1, lisp.AlgHMACSHA1, 20, "secret-x1", 0, "192.168.101.0/24"), nil)
	if s.Counters()[DropReplay] != before+1 {
		t.Errorf("x1's old registration replayed after the reload was not refused")
	}
	// x2 is gone, x4 registers.
	if out := s.Handle(t0, etr1, signed(t, 20, lisp.AlgHMACSHA1, 20, "secret-x2", 0, "192.168.102.0/24"), nil); len(out) != 0 {
		t.Errorf("removed site x2 still registers")
	}
	if out := s.Handle(t0, etr1, signed(t, 21, lisp.AlgHMACSHA1, 20, "secret-x4", 0, "192.168.104.0/24"), nil); len(out) != 1 {
		t.Errorf("new site x4 cannot register")
	}
	// A prefix configured twice: refused, nothing changed.
	bad := append(slices.Clone(sites), Site{Name: "x5", Keys: map[uint8][]byte{0: []byte("k")}, Prefixes: []netip.Prefix{pfx("192.168.104.0/24")}})
	if _, err := s.SetSites(bad); err == nil {
		t.Errorf("a prefix of two sites was taken")
	}
	if n := s.Sites(); !slices.Equal(n, []string{"x1", "x3", "x4"}) || len(s.Registrations(t0)) != 3 {
		t.Errorf("a refused reload changed the sites %v or registrations %+v", n, s.Registrations(t0))
	}
}
