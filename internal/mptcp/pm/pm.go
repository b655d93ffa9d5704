// Package pm is the path-manager daemon: it switches a namespace to the kernel's userspace
// path manager, follows the PM events, polls the subflows' TCP statistics through sock_diag,
// lets a policy (internal/mptcp/pm/core) decide, and sends the policy's commands to the
// kernel. One command the kernel refuses (a token that has gone, an address it will not use)
// is logged and counted; the daemon goes on serving the other connections.
package pm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"braid/internal/metrics"
	"braid/internal/mptcp/info"
	"braid/internal/mptcp/pm/core"
	"braid/internal/mptcp/pmnl"
)

// Options configure a daemon.
type Options struct {
	Uplinks []core.Uplink
	Policy  core.Policy
	Core    core.Config   // timers and ports; Uplinks is taken from above
	Poll    time.Duration // statistics poll and timer tick; default 100 ms
	Logger  *slog.Logger
	// KeepPMType leaves net.mptcp.pm_type as found instead of selecting the userspace PM.
	KeepPMType bool
	// Resolver serves the amptcp policy's mapping lookups; the daemon runs and closes it.
	Resolver *Resolver
}

// ErrMPTCPDisabled is returned when net.mptcp.enabled is 0 in the namespace.
var ErrMPTCPDisabled = errors.New("pm: MPTCP is disabled in this network namespace (sysctl net.mptcp.enabled = 0)")

const sysctlDir = "/proc/sys/net/mptcp/"

// CheckMPTCP reports why MPTCP cannot be used in the calling thread's namespace, if it cannot.
func CheckMPTCP() error {
	b, err := os.ReadFile(sysctlDir + "enabled")
	if errors.Is(err, os.ErrNotExist) {
		return pmnl.ErrNoMPTCP
	}
	if err != nil {
		return fmt.Errorf("pm: read net.mptcp.enabled: %w", err)
	}
	if strings.TrimSpace(string(b)) != "1" {
		return ErrMPTCPDisabled
	}
	return nil
}

// Daemon is a running path manager.
type Daemon struct {
	o      Options
	log    *slog.Logger
	client *pmnl.Client
	stream *pmnl.Stream
	diag   *info.Diag

	restorePMType string // the pm_type found at start, written back by Close

	mu       sync.Mutex // guards mgr and the counters below; taken before the Resolver's
	mgr      *core.Manager
	failures map[string]uint64 // refused commands by errno name
	overruns uint64
	lastErr  string

	closeOnce sync.Once
}

// New opens the daemon's sockets in the calling thread's network namespace and selects the
// userspace PM there. Nothing runs until Run.
func New(o Options) (*Daemon, error) {
	if o.Policy == nil {
		return nil, errors.New("pm: no policy")
	}
	if o.Poll == 0 {
		o.Poll = 100 * time.Millisecond
	}
	d := &Daemon{o: o, log: o.Logger, failures: map[string]uint64{}}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if err := CheckMPTCP(); err != nil {
		return nil, err
	}
	var err error
	if d.stream, err = pmnl.Subscribe(pmnl.Options{}); err != nil {
		return nil, err
	}
	if d.client, err = pmnl.Dial(pmnl.Options{}); err != nil {
		d.stream.Close()
		return nil, err
	}
	if d.diag, err = info.OpenDiag(info.Options{}); err != nil {
		d.stream.Close()
		d.client.Close()
		return nil, err
	}
	if !o.KeepPMType {
		old, err := os.ReadFile(sysctlDir + "pm_type")
		if err == nil {
			err = os.WriteFile(sysctlDir+"pm_type", []byte("1"), 0o644)
		}
		if err != nil {
			d.closeSockets()
			if errors.Is(err, os.ErrPermission) {
				return nil, fmt.Errorf("pm: select the userspace path manager (net.mptcp.pm_type = 1): %w (needs CAP_NET_ADMIN in the namespace)", err)
			}
			return nil, fmt.Errorf("pm: select the userspace path manager: %w", err)
		}
		d.restorePMType = strings.TrimSpace(string(old))
	}
	if a, ok := o.Policy.(*core.AMPTCP); ok {
		d.prepareAMPTCP(a)
	}
	cfg := o.Core
	cfg.Uplinks = o.Uplinks
	d.mgr = core.New(cfg, o.Policy)
	return d, nil
}

// prepareAMPTCP bounds the policy by the kernel's subflow limit and logs its notes.
func (d *Daemon) prepareAMPTCP(a *core.AMPTCP) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if a.MaxSubflows == 0 {
		if l, err := d.client.Limits(ctx); err == nil {
			a.MaxSubflows = int(l.Subflows) + 1
		} else {
			d.log.Warn("cannot read the kernel's MPTCP limits; subflows unbounded", "err", err)
		}
	}
	if a.Note == nil {
		a.Note = func(reason, detail string) {
			d.log.Info("amptcp: connection left to the plain mesh or clamped", "reason", reason, "detail", detail)
		}
	}
}

func (d *Daemon) closeSockets() {
	d.stream.Close()
	d.client.Close()
	d.diag.Close()
	if d.o.Resolver != nil {
		d.o.Resolver.Close()
	}
}

// Close closes the sockets and puts net.mptcp.pm_type back as it was. It must run on a thread
// of the same namespace as New. Idempotent.
func (d *Daemon) Close() error {
	var err error
	d.closeOnce.Do(func() {
		d.closeSockets()
		if d.restorePMType != "" && d.restorePMType != "1" {
			err = os.WriteFile(sysctlDir+"pm_type", []byte(d.restorePMType), 0o644)
		}
	})
	return err
}

// Run follows events and applies the policy until ctx ends.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan pmnl.Event, 1024)
	readErr := make(chan error, 1)
	overrun := make(chan struct{}, 1)
	readerDone := make(chan struct{})
	defer func() { cancel(); <-readerDone }() // Run returns after its reader
	go func() {
		defer close(readerDone)
		for {
			e, err := d.stream.Next(ctx)
			switch {
			case err == nil:
				select {
				case events <- e:
				case <-ctx.Done():
					return
				}
			case ctx.Err() != nil:
				readErr <- nil
				return
			case errors.Is(err, pmnl.ErrOverrun):
				d.mu.Lock()
				d.overruns++
				d.mu.Unlock()
				d.log.Warn("path-manager events lost; taking up the namespace's connections from sock_diag")
				select {
				case overrun <- struct{}{}:
				default:
				}
			case errors.Is(err, pmnl.ErrMalformed):
				d.log.Warn("undecodable event", "err", err)
			default:
				readErr <- err
				return
			}
		}
	}()
	if r := d.o.Resolver; r != nil {
		resDone := make(chan struct{})
		go func() {
			defer close(resDone)
			if err := r.Run(ctx); err != nil {
				d.log.Warn("map-resolver client stopped", "err", err)
			}
		}()
		defer func() { cancel(); <-resDone }()
	}
	d.log.Info("path manager running", "policy", d.Policy().Name(), "uplinks", len(d.o.Uplinks))
	// Connections opened before the daemon (or while events were lost) are taken up from
	// sock_diag; the event stream is already subscribed, so none falls between the two.
	d.apply(ctx, d.resync())
	tick := time.NewTicker(d.o.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-readErr:
			if err != nil {
				return err
			}
			return nil
		case <-overrun:
			d.apply(ctx, d.resync())
		case e := <-events:
			d.log.Debug("event", "event", e.String())
			d.mu.Lock()
			acts := d.mgr.Event(time.Now(), toCore(e))
			d.mu.Unlock()
			d.apply(ctx, acts)
		case <-tick.C:
			conns := d.poll()
			d.mu.Lock()
			acts := d.mgr.Tick(time.Now())
			acts = append(acts, d.decideRBPM(time.Now(), conns)...)
			d.mu.Unlock()
			d.apply(ctx, acts)
		}
	}
}

// resync feeds the manager the established connections it does not know, as sock_diag shows
// them: a connection is the server side when its local port is an MPTCP listener's.
func (d *Daemon) resync() []core.Action {
	conns, err := d.diag.Dump()
	if err != nil {
		d.noteErr("sock_diag", err)
		return nil
	}
	lns, err := d.diag.Listeners()
	if err != nil {
		d.noteErr("sock_diag", err)
		return nil
	}
	const tcpEstablished = 1
	now := time.Now()
	var acts []core.Action
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range conns {
		if c.State != tcpEstablished || d.mgr.Known(c.Info.Token) {
			continue
		}
		server := false
		for _, ln := range lns {
			server = server || ln.Port() == c.Local.Port() && (ln.Addr().IsUnspecified() || ln.Addr().Unmap() == c.Local.Addr().Unmap())
		}
		v6 := !c.Local.Addr().Unmap().Is4()
		for _, s := range c.Subflows {
			if endpoint(s.Local) == endpoint(c.Local) && endpoint(s.Remote) == endpoint(c.Remote) {
				continue // the initial subflow: Established below records it
			}
			d.mgr.Event(now, core.Event{Kind: core.Created, Token: c.Info.Token, Local: endpoint(c.Local), Remote: endpoint(c.Remote), ServerSide: server, V6: v6})
			d.mgr.Event(now, core.Event{Kind: core.SubEstablished, Token: c.Info.Token, Local: endpoint(s.Local), Remote: endpoint(s.Remote), LocID: s.LocID, RemID: s.RemID, V6: v6})
		}
		d.log.Info("taking up a connection", "token", fmt.Sprintf("%08x", c.Info.Token), "local", c.Local, "remote", c.Remote, "server_side", server)
		acts = append(acts, d.mgr.Event(now, core.Event{Kind: core.Established, Token: c.Info.Token, Local: endpoint(c.Local), Remote: endpoint(c.Remote), ServerSide: server, V6: v6})...)
	}
	return acts
}

// poll feeds the subflows' statistics to the manager and returns them (nil on failure).
func (d *Daemon) poll() []info.Conn {
	conns, err := d.diag.Dump()
	if err != nil {
		d.noteErr("sock_diag", err)
		return nil
	}
	var st []core.Stats
	d.mu.Lock()
	for _, c := range conns {
		_, acked, received := c.SubflowBytes()
		d.mgr.ObserveBytes(c.Info.Token, acked+received)
	}
	d.mu.Unlock()
	for _, c := range conns {
		for _, s := range c.Subflows {
			st = append(st, core.Stats{Token: c.Info.Token, Local: endpoint(s.Local), Remote: endpoint(s.Remote),
				Unacked: s.TCP.Unacked, LastAckRecv: s.TCP.LastAckRecv})
		}
	}
	d.mu.Lock()
	d.mgr.Observe(st)
	d.mu.Unlock()
	return conns
}

func (d *Daemon) noteErr(what string, err error) {
	name := what
	var errno syscall.Errno
	if errors.As(err, &errno) {
		name = what + ":" + errnoName(errno)
	}
	d.mu.Lock()
	d.failures[name]++
	d.lastErr = err.Error()
	d.mu.Unlock()
	d.log.Warn("kernel refused", "what", what, "err", err)
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.EINVAL:
		return "EINVAL"
	case syscall.ESRCH:
		return "ESRCH"
	case syscall.EADDRINUSE:
		return "EADDRINUSE"
	case syscall.ENOTCONN:
		return "ENOTCONN"
	case syscall.EPERM:
		return "EPERM"
	}
	return strconv.Itoa(int(e))
}

func (d *Daemon) apply(ctx context.Context, acts []core.Action) {
	for _, a := range acts {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		sf := pmnl.Subflow{Token: a.Token, Local: pmnl.Addr{ID: a.LocalID, Addr: addr(a.Local.Addr), Port: a.Local.Port, IfIndex: a.IfIndex},
			Remote: netip.AddrPortFrom(addr(a.Remote.Addr), a.Remote.Port)}
		if a.Backup {
			sf.Local.Flags = pmnl.FlagBackup
		}
		var err error
		switch a.Kind {
		case core.Create:
			err = d.client.CreateSubflow(cctx, sf)
		case core.Destroy:
			sf.Local.ID = 0
			err = d.client.DestroySubflow(cctx, sf)
		case core.SetBackup:
			err = d.client.SetSubflowFlags(cctx, sf)
		}
		cancel()
		if err == nil {
			d.log.Debug("applied", "action", a.String())
			continue
		}
		if ctx.Err() != nil {
			return
		}
		d.noteErr(a.Kind.String(), err)
		if a.Kind == core.Create && errors.Is(err, syscall.EADDRINUSE) {
			d.mu.Lock()
			d.mgr.PortInUse(time.Now(), a)
			d.mu.Unlock()
			continue
		}
		var pe *pmnl.Error
		// A token the kernel no longer knows is a connection that has closed; a connection
		// created under the in-kernel PM keeps it for life (the PM type is latched at creation)
		// and cannot be managed. Either way it is forgotten.
		gone := errors.As(err, &pe) && (strings.Contains(pe.Message, "invalid token") || strings.Contains(pe.Message, "userspace PM not selected"))
		d.mu.Lock()
		d.mgr.Failed(time.Now(), a, gone)
		d.mu.Unlock()
	}
}

func addr(s string) netip.Addr {
	a, _ := netip.ParseAddr(s)
	return a
}

func endpoint(ap netip.AddrPort) core.Endpoint {
	return core.Endpoint{Addr: ap.Addr().Unmap().String(), Port: ap.Port()}
}

// toCore translates a kernel event.
func toCore(e pmnl.Event) core.Event {
	kinds := map[pmnl.EventType]core.EventKind{
		pmnl.EventCreated: core.Created, pmnl.EventEstablished: core.Established, pmnl.EventClosed: core.Closed,
		pmnl.EventAnnounced: core.Announced, pmnl.EventRemoved: core.Removed, pmnl.EventSubEstablished: core.SubEstablished,
		pmnl.EventSubClosed: core.SubClosed, pmnl.EventSubPriority: core.SubPriority,
	}
	ce := core.Event{Kind: kinds[e.Type], Token: e.Token, LocID: e.LocID, RemID: e.RemID, Backup: e.Backup, ServerSide: e.ServerSide}
	if e.Local.IsValid() || e.Local.Addr().IsValid() {
		ce.Local = endpoint(e.Local)
	}
	if e.Remote.Addr().IsValid() {
		ce.Remote = endpoint(e.Remote)
	}
	a := e.Local.Addr()
	if !a.IsValid() {
		a = e.Remote.Addr()
	}
	ce.V6 = a.IsValid() && !a.Unmap().Is4()
	return ce
}

// Status is what /status shows.
type Status struct {
	Policy      string            `json:"policy"`
	Uplinks     []core.Uplink     `json:"uplinks"`
	Connections []core.ConnStatus `json:"connections"`
	Counters    core.Counters     `json:"counters"`
	Refused     map[string]uint64 `json:"refused"`
	Overruns    uint64            `json:"event_overruns"`
	LastError   string            `json:"last_error,omitempty"`
	AMPTCP      *AMPTCPStatus     `json:"amptcp,omitempty"`
	RBPM        *RBPMStatus       `json:"rbpm,omitempty"`
}

// AMPTCPStatus is the amptcp policy's part of the status.
type AMPTCPStatus struct {
	Decisions core.AMPTCPCounters `json:"decisions"`
	Lookups   ResolverCounters    `json:"lookups"`
}

// Status returns the daemon's state.
func (d *Daemon) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	ref := make(map[string]uint64, len(d.failures))
	for k, v := range d.failures {
		ref[k] = v
	}
	st := Status{Policy: d.o.Policy.Name(), Uplinks: d.o.Uplinks, Connections: d.mgr.Status(), Counters: d.mgr.Counters,
		Refused: ref, Overruns: d.overruns, LastError: d.lastErr, RBPM: d.rbpmStatus()}
	if a, ok := d.o.Policy.(*core.AMPTCP); ok {
		st.AMPTCP = &AMPTCPStatus{Decisions: a.Counters}
		if d.o.Resolver != nil {
			st.AMPTCP.Lookups = d.o.Resolver.Counters()
		}
	}
	return st
}

// StatusJSON implements metrics.Source.
func (d *Daemon) StatusJSON() any {
	return struct {
		Role string `json:"role"`
		PM   Status `json:"pm"`
	}{"pm", d.Status()}
}

// WriteMetrics implements metrics.Source.
func (d *Daemon) WriteMetrics(w *metrics.Writer) {
	st := d.Status()
	c := st.Counters
	for _, m := range []struct {
		name, help string
		v          uint64
	}{
		{"braid_pm_events_total", "Path-manager events received from the kernel.", c.Events},
		{"braid_pm_subflow_creates_total", "Subflows the path manager asked the kernel to create.", c.Creates},
		{"braid_pm_subflow_create_failures_total", "Subflow creations the kernel refused.", c.CreateFailures},
		{"braid_pm_subflow_destroys_total", "Subflows the path manager destroyed (stuck joins, dead paths).", c.Destroys},
		{"braid_pm_join_timeouts_total", "Joins that were not established in time.", c.JoinTimeouts},
		{"braid_pm_dead_subflows_total", "Subflows found dead (unacknowledged data, no ack).", c.DeadSubflows},
		{"braid_pm_subflows_established_total", "Subflows that came up.", c.Established},
		{"braid_pm_event_overruns_total", "Times the kernel dropped events for a full buffer.", st.Overruns},
		{"braid_pm_announce_refused_total", "ADD_ADDRs refused: an address no peer can have (loopback, multicast, link-local...) or of the other family.", c.AnnounceRefused},
		{"braid_pm_announce_capped_total", "ADD_ADDRs of a new endpoint beyond the connection's max_announced.", c.AnnounceCapped},
		{"braid_pm_joins_abandoned_total", "Announced endpoints given up after join_attempts failed joins (RFC 8684 3.4.1).", c.JoinsAbandoned},
		{"braid_pm_join_backoffs_total", "Failed joins of an uplink-remote pair that never came up, after which the pair waits (2, 4, 8... join timeouts, at most join_backoff_max) before its next join.", c.JoinBackoffs},
	} {
		w.Sample(m.name, metrics.Counter, m.help, float64(m.v))
	}
	w.Sample("braid_pm_connections", metrics.Gauge, "MPTCP connections followed.", float64(len(st.Connections)))
	for _, cs := range st.Connections {
		up := 0
		for _, s := range cs.Subflows {
			if s.State == "up" {
				up++
			}
		}
		w.Sample("braid_pm_connection_subflows_up", metrics.Gauge, "Subflows up per connection.", float64(up), "token", fmt.Sprintf("%08x", cs.Token))
	}
	if a := st.AMPTCP; a != nil {
		for _, m := range []struct {
			name, help string
			v          uint64
		}{
			{"braid_pm_amptcp_placed_total", "Connections given one subflow per RLOC pair.", a.Decisions.Placed},
			{"braid_pm_amptcp_fallbacks_total", "Connections left to the plain mesh (no mapping, no answer, no usable locator, closed in lookup).", a.Decisions.FallbackToKernel},
			{"braid_pm_amptcp_no_mapping_total", "Connections whose end had a negative mapping.", a.Decisions.NoMapping},
			{"braid_pm_amptcp_resolver_no_answer_total", "Connections whose lookup no map-resolver answered.", a.Decisions.NoAnswer},
			{"braid_pm_amptcp_no_usable_locator_total", "Connections whose mapping had no usable locator.", a.Decisions.NoLocator},
			{"braid_pm_amptcp_closed_during_lookup_total", "Connections closed while their lookup was in flight.", a.Decisions.ClosedInLookup},
			{"braid_pm_amptcp_clamped_total", "Connections given fewer subflows than the formula for the kernel limit.", a.Decisions.Clamped},
			{"braid_pm_amptcp_mapping_changes_total", "Placed connections whose subflow count followed a mapping change.", a.Decisions.MappingChanges},
			{"braid_pm_amptcp_out_of_scope_total", "Connections to destinations outside the configured EID prefixes.", a.Decisions.OutOfScope},
			{"braid_pm_amptcp_short_flows_total", "Connections closed before carrying the configured bytes.", a.Decisions.ShortFlows},
			{"braid_pm_map_requests_total", "Map-Requests sent to map-resolvers.", a.Lookups.Requests},
			{"braid_pm_map_replies_total", "Map-Replies received.", a.Lookups.Replies},
			{"braid_pm_map_lookups_unanswered_total", "Lookups no map-resolver answered.", a.Lookups.Timeouts},
			{"braid_pm_map_cache_hits_total", "Mapping lookups answered from the cache.", a.Lookups.Hits},
		} {
			w.Sample(m.name, metrics.Counter, m.help, float64(m.v))
		}
		w.Sample("braid_pm_map_cache_entries", metrics.Gauge, "Mappings in the cache.", float64(a.Lookups.Cached))
	}
	writeRBPMMetrics(w, st.RBPM)
	for _, k := range metrics.SortedKeys(st.Refused) {
		w.Sample("braid_pm_refused_total", metrics.Counter, "Commands the kernel refused, by command and errno.", float64(st.Refused[k]), "reason", k)
	}
}
