package lb

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"time"

	"braid/internal/lb/xdp"
)

// Settings are what a reload may change besides the services and backends: the data plane's
// configuration (hashing, collisions, learning rates, encapsulation sources) and the token
// timers. The table sizes, interfaces and health-check period are fixed at start.
type Settings struct {
	Plane         xdp.Config
	TokenIdle     time.Duration
	TokenClosing  time.Duration
	HealthTimeout time.Duration
	Rise, Fall    int
}

// PlaneConfig returns the data plane's configuration in effect.
func (l *LB) PlaneConfig() xdp.Config {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.o.Plane
}

// Change is one difference a reload applied, as logged: what (e.g. "backend added"), the
// name it concerns, and the details as slog key-value pairs.
type Change struct {
	What    string
	Name    string
	Details []any
}

func (c Change) String() string {
	s := c.What + " " + c.Name
	for i := 0; i+1 < len(c.Details); i += 2 {
		s += fmt.Sprintf(" %v=%v", c.Details[i], c.Details[i+1])
	}
	return s
}

// servicePlane is what Apply needs of a data plane to take a service away; *xdp.Dataplane has it.
type servicePlane interface {
	DeleteService(vip netip.AddrPort) error
}

// Apply makes the running balancer serve services with backends under settings, touching only
// what differs: a backend that stays keeps its slot, its flows and its tokens (a new weight
// only changes the Maglev table, so its established connections go on), a service that stays
// keeps its ID and tokens; a removed backend loses its flows and tokens, a removed service
// its tokens. It returns the changes, each also logged. What it can check (service count, free
// slots, a data plane that can remove services) it checks first, so that such a refusal changes
// nothing; an error of the data plane itself stops it where it happened, with the changes
// made until then returned.
func (l *LB) Apply(services []netip.AddrPort, backends []BackendSpec, s Settings) ([]Change, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(services) == 0 || len(services) > xdp.MaxServices {
		return nil, fmt.Errorf("lb: %d services (want 1..%d)", len(services), xdp.MaxServices)
	}
	want := map[string]BackendSpec{}
	for _, b := range backends {
		want[b.Name] = b
	}
	added := 0
	for name := range want {
		if _, ok := l.backends[name]; !ok {
			added++
		}
	}
	free := 0
	for _, u := range l.used {
		if !u {
			free++
		}
	}
	// Removed backends free their slots only after the new ones took theirs: a flow of a
	// removed backend must never reach a new one through a reused slot.
	if added > free {
		return nil, fmt.Errorf("%w: %d new backends, %d free slots", ErrFull, added, free)
	}
	sp, canDelete := l.plane.(servicePlane)
	var removedSvc []int
	for id, v := range l.o.Services {
		if v.IsValid() && !slices.Contains(services, v) {
			removedSvc = append(removedSvc, id)
		}
	}
	if len(removedSvc) > 0 && !canDelete {
		return nil, fmt.Errorf("lb: this data plane cannot remove a service")
	}
	var changes []Change
	note := func(what, name string, details ...any) {
		changes = append(changes, Change{What: what, Name: name, Details: details})
		l.log.Info("reload: "+what, append([]any{"name", name}, details...)...)
	}

	// Settings first: the tables written below use them.
	if !reflect.DeepEqual(l.o.Plane, s.Plane) {
		if err := l.plane.SetConfig(s.Plane); err != nil {
			return changes, err
		}
		l.o.Plane = s.Plane
		note("data plane settings changed", "plane")
	}
	for _, t := range []struct {
		name string
		cur  *time.Duration
		new  time.Duration
	}{{"token_idle", &l.o.TokenIdle, s.TokenIdle}, {"token_closing", &l.o.TokenClosing, s.TokenClosing},
		{"health_timeout", &l.o.HealthTimeout, s.HealthTimeout}} {
		if *t.cur != t.new {
			note("setting changed", t.name, "from", *t.cur, "to", t.new)
			*t.cur = t.new
		}
	}
	if s.Rise > 0 && s.Rise != l.o.Rise {
		note("setting changed", "rise", "from", l.o.Rise, "to", s.Rise)
		l.o.Rise = s.Rise
	}
	if s.Fall > 0 && s.Fall != l.o.Fall {
		note("setting changed", "fall", "from", l.o.Fall, "to", s.Fall)
		l.o.Fall = s.Fall
	}

	// Services: those that stay keep their IDs; new ones take free IDs.
	svcs := slices.Clone(l.o.Services)
	for len(svcs) < xdp.MaxServices {
		svcs = append(svcs, netip.AddrPort{})
	}
	for _, id := range removedSvc {
		v := svcs[id]
		if err := sp.DeleteService(v); err != nil {
			return changes, fmt.Errorf("service %v: %w", v, err)
		}
		svcs[id] = netip.AddrPort{}
		if !slices.ContainsFunc(services, func(w netip.AddrPort) bool { return w.Addr() == v.Addr() }) {
			for _, b := range l.backends {
				if b.spec.StatelessPort != 0 {
					l.plane.DeleteStateless(netip.AddrPortFrom(v.Addr(), b.spec.StatelessPort))
				}
			}
		}
		if err := l.dropTokensLocked(func(t xdp.Token) bool { return t.Service == uint32(id) }); err != nil {
			return changes, err
		}
		note("service removed", v.String())
	}
	for _, v := range services {
		if slices.Contains(svcs, v) {
			continue
		}
		id := slices.Index(svcs, netip.AddrPort{})
		if err := l.plane.SetService(uint32(id), v); err != nil {
			return changes, fmt.Errorf("service %v: %w", v, err)
		}
		svcs[id] = v
		note("service added", v.String(), "id", id)
	}
	for len(svcs) > 0 && !svcs[len(svcs)-1].IsValid() {
		svcs = svcs[:len(svcs)-1]
	}
	l.o.Services = svcs
	for _, b := range l.backends {
		if b.spec.StatelessPort != 0 {
			if err := l.statelessLocked(b.spec.StatelessPort, b.index, false); err != nil {
				return changes, err
			}
		}
	}

	// Backends: new ones, then changed ones, then the table, then the removed ones.
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		spec := want[name]
		b, ok := l.backends[name]
		if !ok {
			if err := l.addLocked(spec); err != nil {
				return changes, err
			}
			note("backend added", name, "weight", spec.Weight)
			continue
		}
		if err := l.updateLocked(b, spec, note); err != nil {
			return changes, err
		}
	}
	var gone []*backend
	for name, b := range l.backends {
		if _, ok := want[name]; !ok {
			gone = append(gone, b)
			delete(l.backends, name)
		}
	}
	slices.SortFunc(gone, func(a, b *backend) int { return int(a.index) - int(b.index) })
	if err := l.rebuildLocked(); err != nil {
		return changes, err
	}
	for _, b := range gone {
		// The tables no longer name it; its slot, flows and tokens go now.
		if err := l.forgetLocked(b); err != nil {
			return changes, err
		}
		note("backend removed", b.spec.Name)
	}
	return changes, nil
}

// dropTokensLocked deletes the tokens (joined and pending) that match; it counts them as
// removed with their backend or service.
func (l *LB) dropTokensLocked(match func(xdp.Token) bool) error {
	toks, err := l.plane.Tokens()
	if err != nil {
		return err
	}
	pend, err := l.plane.PendingTokens()
	if err != nil {
		return err
	}
	for _, t := range append(toks, pend...) {
		if match(t) {
			l.plane.DeleteToken(t.Service, t.Token)
			l.removed++
		}
	}
	return nil
}

// statelessLocked points (the address of every service, port) at backend index, or deletes
// those entries (del).
func (l *LB) statelessLocked(port uint16, index uint32, del bool) error {
	for _, v := range l.o.Services {
		if !v.IsValid() {
			continue
		}
		k := netip.AddrPortFrom(v.Addr(), port)
		if del {
			l.plane.DeleteStateless(k)
		} else if err := l.plane.SetStateless(k, index); err != nil {
			return err
		}
	}
	return nil
}

// updateLocked changes a backend that stays to spec, noting each difference.
func (l *LB) updateLocked(b *backend, spec BackendSpec, note func(string, string, ...any)) error {
	old := b.spec
	if !reflect.DeepEqual(old.Target, spec.Target) {
		// Same slot: its pinned flows follow it to the new address.
		if err := l.plane.SetBackend(b.index, spec.Target); err != nil {
			return err
		}
		note("backend target changed", spec.Name, "mac", spec.Target.MAC.String(), "address", spec.Target.Addr, "ifindex", spec.Target.IfIndex)
	}
	if old.StatelessPort != spec.StatelessPort {
		if old.StatelessPort != 0 {
			l.statelessLocked(old.StatelessPort, b.index, true)
		}
		if spec.StatelessPort != 0 {
			if err := l.statelessLocked(spec.StatelessPort, b.index, false); err != nil {
				return err
			}
		}
		note("backend stateless port changed", spec.Name, "from", old.StatelessPort, "to", spec.StatelessPort)
	}
	if old.Health != spec.Health {
		b.up, b.ok, b.fail, b.lastErr = spec.Health == "", 0, 0, ""
		note("backend health check changed", spec.Name, "from", old.Health, "to", spec.Health)
	}
	if old.Weight != spec.Weight {
		what := "backend weight changed"
		if spec.Weight == 0 {
			what = "backend drained"
		}
		note(what, spec.Name, "from", old.Weight, "to", spec.Weight)
	}
	b.spec = spec
	return nil
}
