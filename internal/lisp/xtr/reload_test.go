package xtr

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"braid/internal/wire/lisp"
)

// TestXtrSetMapping: a new EID prefix is registered at the next tick (not a register_interval
// later), a map server that stays keeps its registration state, one with a new key starts over,
// and a mapping the xTR cannot take changes nothing.
func TestXtrSetMapping(t *testing.T) {
	x, rs := testXTR(t)
	now := time.Now()
	readRegister := func() lisp.MapRegister {
		t.Helper()
		buf := make([]byte, 2048)
		rs.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := rs.conn.Read(buf)
		if err != nil {
			t.Fatalf("no Map-Register: %v", err)
		}
		var m lisp.MapRegister
		if _, err := m.Decode(buf[:n]); err != nil {
			t.Fatal(err)
		}
		return m
	}
	x.tick(now)
	m := readRegister()
	nt := lisp.MapRegister{Type: lisp.TypeMapNotify, Nonce: m.Nonce, AlgID: lisp.AlgHMACSHA1, AuthData: make([]byte, 20), Records: m.Records}
	b := make([]byte, nt.Len())
	nt.Encode(b)
	lisp.Sign(b, []byte("k"))
	x.control(now, 0, rs.addr(), b)
	if !x.Status().Registrations[0].Registered {
		t.Fatal("not registered")
	}

	eids := []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("192.168.5.0/24")}
	ms := []MapServer{{Addr: rs.addr(), Key: []byte("k"), AlgID: lisp.AlgHMACSHA1}}
	changes, err := x.SetMapping(Mapping{EIDs: eids, Resolvers: []netip.AddrPort{rs.addr()}, MapServers: ms, Locators: []Locator{{Priority: 1, Weight: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 1 || changes[0].What != "eid prefix added" || changes[0].Detail != "192.168.5.0/24" {
		t.Fatalf("changes %+v", changes)
	}
	if !x.Status().Registrations[0].Registered {
		t.Error("the map server that stayed lost its registration state")
	}
	if _, _, own := x.db.Load().eids.Lookup(netip.MustParseAddr("192.168.5.7")); !own {
		t.Error("the new EID prefix is not the site's")
	}
	x.tick(now.Add(time.Millisecond))
	if m := readRegister(); len(m.Records) != 2 {
		t.Errorf("the registration after the reload has %d records, want 2", len(m.Records))
	}

	// A new key: that map server's registration starts over.
	ms[0].Key = []byte("k2")
	changes, err = x.SetMapping(Mapping{EIDs: eids, Resolvers: []netip.AddrPort{rs.addr()}, MapServers: ms, Locators: []Locator{{Priority: 1, Weight: 1}}})
	if err != nil || len(changes) != 1 || changes[0].What != "map-server changed" {
		t.Fatalf("new key: %+v %v", changes, err)
	}
	if x.Status().Registrations[0].Registered {
		t.Error("a map server with a new key is still counted registered")
	}
	// Refused: no locator below 255, or a locator count that is not the RLOCs'.
	if _, err := x.SetMapping(Mapping{EIDs: eids[:1], Resolvers: []netip.AddrPort{rs.addr()}, Locators: []Locator{{Priority: 255}}}); !errors.Is(err, ErrLocators) {
		t.Errorf("every locator at 255: %v", err)
	}
	if _, err := x.SetMapping(Mapping{EIDs: eids[:1], Resolvers: []netip.AddrPort{rs.addr()}}); !errors.Is(err, ErrMapping) {
		t.Errorf("no locators: %v", err)
	}
	if db := x.db.Load(); len(db.EIDs) != 2 || len(db.MapServers) != 1 {
		t.Errorf("a refused mapping changed the database: %+v", db)
	}
}
