package core

import (
	"fmt"
	"testing"
	"time"
)

// A hostile peer announces 255 addresses of its choice and never answers a join to them (issue
// 18 item 14), for a minute, re-announcing every address every second. Before, every announced
// address became a join from every uplink, re-created each join_timeout: about 500 MP_JOINs a
// second to the attacker's chosen targets. Now at most MaxAnnounced endpoints are taken, each
// is given up after JoinAttempts joins that never came up (RFC 8684 3.4.1), and a
// re-announcement is heeded once per ReannounceAfter: the joins in a minute stay within
// MaxAnnounced x uplinks x (JoinAttempts + one per ReannounceAfter).
func TestAnnounceFloodBounded(t *testing.T) {
	m := newManager()
	established(m, t0, 1)
	creates := 0
	now := t0
	for range 60 {
		for id := 1; id <= 255; id++ {
			r := Endpoint{fmt.Sprintf("198.51.%d.%d", id/250, id%250+1), 443}
			creates += countAnnounced(m.Event(now, Event{Kind: Announced, Token: 1, RemID: uint8(id), Remote: r}))
		}
		for range 10 { // the daemon's ticks; no join to the attacker's addresses comes up
			now = now.Add(100 * time.Millisecond)
			creates += countAnnounced(m.Tick(now))
		}
	}
	cfg := m.Config()
	nUp := len(uplinks)
	bound := cfg.MaxAnnounced * nUp * (cfg.JoinAttempts + int(time.Minute/cfg.ReannounceAfter) + 1)
	t.Logf("joins in a minute of 255 addresses announced every second: %d (bound %d); counters %+v", creates, bound, m.Counters)
	if creates > bound {
		t.Errorf("%d joins in a minute to announced addresses, bound %d", creates, bound)
	}
	if m.Counters.AnnounceCapped == 0 || m.Counters.JoinsAbandoned == 0 {
		t.Errorf("counters: %+v, want announcements capped and joins abandoned", m.Counters)
	}
	// The initial remote's subflows (a path of the connection that worked) are still kept up.
	if !m.Known(1) {
		t.Fatal("the connection was forgotten")
	}
}

// countAnnounced counts the joins to other remotes than the initial one (remote0).
func countAnnounced(as []Action) int {
	n := 0
	for _, a := range as {
		if a.Kind == Create && a.Remote != remote0 {
			n++
		}
	}
	return n
}

func countCreates(as []Action) int {
	n := 0
	for _, a := range as {
		if a.Kind == Create {
			n++
		}
	}
	return n
}

// Addresses no peer can have are refused, link-local only when allowed, and an address of the
// other family; a real one is taken.
func TestAnnounceAddressFilter(t *testing.T) {
	for _, c := range []struct {
		addr      string
		linkLocal bool
		take      bool
	}{
		{"10.9.1.2", false, true},
		{"203.0.113.7", false, true},
		{"0.0.0.0", false, false},
		{"0.1.2.3", false, false},
		{"127.0.0.1", false, false},
		{"224.0.0.1", false, false},
		{"239.1.2.3", false, false},
		{"255.255.255.255", false, false},
		{"169.254.1.1", false, false},
		{"169.254.1.1", true, true},
		{"::ffff:127.0.0.1", false, false},
		{"2001:db8::1", false, false}, // IPv6 on an IPv4 connection
		{"not an address", false, false},
	} {
		m := New(Config{Uplinks: uplinks, AllowLinkLocal: c.linkLocal}, Fullmesh{})
		established(m, t0, 1)
		got := m.Event(t0, Event{Kind: Announced, Token: 1, RemID: 1, Remote: Endpoint{c.addr, 443}})
		if took := countCreates(got) > 0; took != c.take {
			t.Errorf("%s (link-local allowed %v): joined %v, want %v", c.addr, c.linkLocal, took, c.take)
		}
		if !c.take && m.Counters.AnnounceRefused != 1 {
			t.Errorf("%s: announce_refused %d, want 1", c.addr, m.Counters.AnnounceRefused)
		}
	}
	// On an IPv6 connection: loopback, multicast and link-local refused, global taken.
	v6up := []Uplink{{Name: "v6", Addr: "2001:db8:1::1", V6: true}}
	for addr, take := range map[string]bool{"::1": false, "ff02::1": false, "fe80::1": false, "::": false, "2001:db8:2::2": true} {
		m := New(Config{Uplinks: v6up}, Fullmesh{})
		l, r := Endpoint{"2001:db8:1::1", 34000}, Endpoint{"2001:db8:9::9", 443}
		m.Event(t0, Event{Kind: Created, Token: 1, Local: l, Remote: r, V6: true})
		m.Event(t0, Event{Kind: Established, Token: 1, Local: l, Remote: r, V6: true})
		if took := countCreates(m.Event(t0, Event{Kind: Announced, Token: 1, RemID: 1, Remote: Endpoint{addr, 443}})) > 0; took != take {
			t.Errorf("%s on IPv6: joined %v, want %v", addr, took, take)
		}
	}
}

// RFC 8684 3.4.1: joins to an announced endpoint stop after they fail; a join that came up once
// makes the endpoint a path like the initial one, retried when it breaks; a new announcement
// after ReannounceAfter gets one more attempt.
func TestFailedJoinsStop(t *testing.T) {
	m := New(Config{Uplinks: uplinks[:1]}, Fullmesh{})
	established(m, t0, 1)
	bad, good := Endpoint{"203.0.113.1", 5000}, Endpoint{"203.0.113.2", 5000}
	now := t0
	joins := map[Endpoint]int{}
	count := func(as []Action) {
		for _, a := range as {
			if a.Kind == Create {
				joins[a.Remote]++
			}
		}
	}
	count(m.Event(now, Event{Kind: Announced, Token: 1, RemID: 1, Remote: bad}))
	count(m.Event(now, Event{Kind: Announced, Token: 1, RemID: 2, Remote: good}))
	var goodLocal Endpoint
	for _, s := range m.Status()[0].Subflows {
		if s.Remote == good.String() {
			fmt.Sscanf(s.Local, "10.9.0.1:%d", &goodLocal.Port)
		}
	}
	goodLocal.Addr = "10.9.0.1"
	m.Event(now, Event{Kind: SubEstablished, Token: 1, Local: goodLocal, Remote: good})
	for range 100 { // 10 s
		now = now.Add(100 * time.Millisecond)
		count(m.Tick(now))
	}
	if joins[bad] != m.Config().JoinAttempts {
		t.Errorf("%d joins to an endpoint that never answers, want %d (join_attempts)", joins[bad], m.Config().JoinAttempts)
	}
	// The good path breaks: it is joined again, however often.
	m.Event(now, Event{Kind: SubClosed, Token: 1, Local: goodLocal, Remote: good})
	before := joins[good]
	for range 50 {
		now = now.Add(100 * time.Millisecond)
		count(m.Tick(now))
	}
	if joins[good] <= before+1 {
		t.Errorf("a path that worked was joined %d times in 5 s after it broke, want retries", joins[good]-before)
	}
	// Announced again too soon: ignored; after ReannounceAfter: one more attempt.
	n := joins[bad]
	count(m.Event(now, Event{Kind: Announced, Token: 1, RemID: 1, Remote: bad}))
	if joins[bad] != n {
		t.Errorf("a re-announcement %v after giving up made a join", now.Sub(t0))
	}
	now = now.Add(m.Config().ReannounceAfter)
	count(m.Event(now, Event{Kind: Announced, Token: 1, RemID: 1, Remote: bad}))
	for range 30 {
		now = now.Add(100 * time.Millisecond)
		count(m.Tick(now))
	}
	if joins[bad] != n+1 {
		t.Errorf("after a re-announcement: %d more joins, want 1", joins[bad]-n)
	}
}
