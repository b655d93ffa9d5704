package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"time"

	"braid/internal/config"
	"braid/internal/metrics"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
)

func init() {
	commands["pm"] = command{summary: "MPTCP path-manager daemon on the kernel's userspace PM (policies: fullmesh, amptcp, rbpm)", run: runPM}
}

const pmDoc = `Usage: braid pm --config FILE [--policy NAME] [--log-format text|json] [--verbose]
       braid pm check --config FILE
       braid pm reload [--control SOCKET]

braid pm manages the subflows of every MPTCP connection of the network namespace it runs in. It
selects the kernel's userspace path manager (sysctl net.mptcp.pm_type = 1; the previous value is
restored on exit), follows the kernel's path-manager events, polls each subflow's TCP statistics
through sock_diag, and lets a policy decide which subflows each connection should have.

Policies:
  fullmesh   one subflow from every local uplink to every address of the peer (its initial
             address and those it announces), on the connections this host opened. A subflow
             whose path stops acknowledging data for 'dead_after' (1 s) is replaced; a join not
             established within 'join_timeout' (1 s) is retried with a fresh source port, so a
             path that comes back carries a subflow again within about a second. A pair of an
             uplink and a peer address that has never come up on the connection (an ISP that
             reaches only its own customers) backs off instead: from its second failed join
             in a row it waits 2, 4, 8... join timeouts, at most 'join_backoff_max' (30 s).
  amptcp     A-MPTCP (LISP-assisted subflows, docs/amptcp.md): when a connection is
             established, looks its local and remote EID up in the LISP mapping system
             (Map-Request to 'resolvers', cached for the mapping's TTL, asked again after
             'mapping_max_age'), counts the usable RLOCs of both sites (a, b) and the host
             interfaces (l1 uplinks, l2 peer addresses), and opens N subflows:
               routing = "any"    N = max(l1*l2, a*b)   (hosts reach their ITRs freely)
               routing = "bound"  N = a*b               (interfaces bound to RLOCs)
             Each subflow's source port p is chosen so that (p + dport) mod (a*b) differs
             from every other subflow's: braid xTRs in placement mode carry each over its own
             RLOC pair. Ports in use are skipped for the next of the same residue. When a
             mapping changes, subflows are added or removed (never the last working one).
             Only destinations in 'eid_prefixes' (all when empty) and, with 'min_bytes',
             only connections that carried that much; the others, and connections whose
             lookup fails (no mapping, no answer, no usable locator), get the fullmesh
             behaviour, which is logged once per reason and destination and counted.
             The count is bounded by the kernel's subflow limit ('ip mptcp limits');
             the peer accepts joins only up to its own limit (in-kernel PM: default 2).
  rbpm       receive-buffer-based path management (docs/scheduling.md): the subflows of
             fullmesh; every poll, per connection, estimates the out-of-order data the fast
             subflows would put in the peer's receive buffer during one round trip of the
             slowest (from each subflow's RTT, min RTT, unacknowledged data and delivery
             rate, and the peer's window) and, when it exceeds the window, sets the worst
             subflow to backup (MP_PRIO), so that the kernel's scheduler stops sending on it;
             a demoted subflow is restored when the window holds twice what the set needs
             with it counted in. One change per subflow per second at most; the last active
             subflow is never demoted; connections that fell back to TCP and subflows of
             uplinks configured as backup are left alone. Run it on the sending side.
             Its timers default to poll 50 ms, dead_after 5 s, join_timeout 5 s (the
             settings its figures were measured with): a subflow over a slow path behind a
             deep queue can go more than a second without an ack, and 1 s would destroy
             and re-create it every second.

Each subflow is bound to its uplink's interface and address. On Ethernet uplinks, give each
uplink address its own routing table ('ip rule add from ADDR table N') so that replies and
joins leave through the right gateway.

The site file's [pm] section sets the policy and timers; the uplinks are those of [[pm.uplink]]
or, if there are none, of [[tunnel.uplink]]:

  [pm]
  policy = "fullmesh"
  metrics = "127.0.0.1:9475"    # GET /status (JSON) and /metrics (Prometheus)
  control = "@braid/pm"         # 'braid pm reload' and status (an abstract socket)
  backup = ["lte"]              # subflows from these uplinks are backup
  poll = "100ms"                # statistics and timers (rbpm: 50ms)
  join_timeout = "1s"           # a join not up by then is retried (rbpm: 5s)
  dead_after = "1s"             # unacked data, no ack this long: dead (rbpm: 5s)
  join_backoff_max = "30s"      # longest wait of a pair that never came up; 0: no backoff
  max_announced = 8             # peer-announced endpoints taken per connection
  join_attempts = 2             # failed joins before an announced endpoint is given up
  # amptcp only:
  resolvers = ["10.0.9.1:4342"] # map-resolvers
  routing = "any"               # or "bound"
  eid_prefixes = ["192.168.0.0/16"]
  min_bytes = 0                 # augment only connections that carried this many bytes
  mapping_max_age = "60s"       # ask the mapping again after min(TTL, this)
  subflows = 0                  # force this count instead of the formula (experiments)
  [[pm.uplink]]
  name = "fibre"
  interface = "wan0"
  address = "192.0.2.1"

A command the kernel refuses (a connection that has just closed, an address it will not use) is
logged and counted, and the daemon goes on with the other connections.

'reload' (or SIGHUP to the daemon) re-reads the site file the daemon started with and applies
the policy and its settings (fullmesh <-> rbpm; amptcp's routing, eid_prefixes, min_bytes,
subflows), join_timeout, dead_after, retry, join_backoff_max, max_announced, join_attempts,
port_base, port_span and the uplinks' backup flags
(signalled to the peer with MP_PRIO on the next poll). The connections it manages keep their
subflows; the next poll applies the new settings to them. A --policy given at start stays. A
file with a mistake is refused with its file and line, as is a change only a restart applies
(the uplinks themselves, poll, a policy change to or from amptcp, its resolvers and lookup
settings, metrics, control): then nothing changes and 'reload' exits 1. Each change is logged
on one line. It uses the 'control' socket (default @braid/pm, an abstract socket of the
network namespace).

Example:
  braid pm check --config /etc/braid/site.toml
  braid pm --config /etc/braid/site.toml --policy fullmesh
  braid pm reload
  curl -s 127.0.0.1:9475/metrics | grep braid_pm_
`

func runPM(e env, args []string) int {
	if len(args) > 0 && args[0] == "reload" {
		return runReloadCommand(e, "pm", pmDoc, config.PMDefaults().Control, args[1:])
	}
	check := false
	if len(args) > 0 && args[0] == "check" {
		check, args = true, args[1:]
	}
	fs := newFlags(e, "braid pm", pmDoc)
	file := fs.String("config", "", "the site `FILE` (TOML)")
	policy := fs.String("policy", "", "the policy `NAME`, overriding the file's")
	format := fs.String("log-format", e.defaultLogFormat(), "log format: text or json")
	verbose := fs.Bool("verbose", false, "log debug messages too (every event and command)")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if *file == "" || fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "braid pm: expected --config FILE (see 'braid pm --help')")
		return exitUsage
	}
	data, err := os.ReadFile(*file)
	if err != nil {
		fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
		return exitError
	}
	cfg, err := config.LoadPM(*file, data, systemEnv{})
	if err != nil {
		return configFail(e, "pm", err)
	}
	if *policy != "" {
		cfg.UsePolicy(*policy)
	}
	if _, err := pmPolicy(cfg, nil); err != nil {
		fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
		return exitUsage
	}
	if check {
		fmt.Fprintf(e.stdout, "%s: valid (policy %s, %d uplinks)\n", *file, cfg.Policy, len(cfg.Uplinks))
		return exitOK
	}
	log, err := newLogger(e, *format, *verbose)
	if err != nil {
		fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
		return exitUsage
	}
	ctx, cancel := daemonContext("braid pm", log, *file)
	defer cancel()
	if err := servePM(ctx, cfg, *policy, log); err != nil {
		fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
		return exitError
	}
	return exitOK
}

// pmPolicy is the policy cfg names; res serves amptcp's lookups (nil: only checked).
func pmPolicy(cfg *config.PM, res *pm.Resolver) (core.Policy, error) {
	switch cfg.Policy {
	case "amptcp":
		if len(cfg.AMPTCP.Resolvers) == 0 {
			return nil, fmt.Errorf("policy amptcp without resolvers: set resolvers in [pm]")
		}
		if res == nil {
			return nil, nil
		}
		return amptcpPolicy(cfg.AMPTCP, res), nil
	case "rbpm":
		return core.NewRBPM(pm.RBPMHoldDown), nil
	}
	if p, ok := core.Policies[cfg.Policy]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("unknown policy %q (known: fullmesh, amptcp, rbpm)", cfg.Policy)
}

// pmUplinks are the uplinks of cfg, with their interfaces' indexes.
func pmUplinks(cfg *config.PM) ([]core.Uplink, error) {
	var ups []core.Uplink
	for _, u := range cfg.Uplinks {
		ifi, err := net.InterfaceByName(u.Interface)
		if err != nil {
			return nil, fmt.Errorf("uplink %s: interface %s: %w", u.Name, u.Interface, err)
		}
		ups = append(ups, core.Uplink{Name: u.Name, Addr: u.Address.String(), IfIndex: int32(ifi.Index), Backup: u.Backup, V6: u.Address.Is6()})
	}
	return ups, nil
}

func pmCore(cfg *config.PM) core.Config {
	return core.Config{JoinTimeout: cfg.JoinTimeout, DeadAfter: cfg.DeadAfter, Retry: cfg.Retry, PortBase: cfg.PortBase, PortSpan: cfg.PortSpan,
		MaxAnnounced: cfg.MaxAnnounced, JoinAttempts: cfg.JoinAttempts, AllowLinkLocal: cfg.AllowLinkLocal, MaxJoinBackoff: joinBackoff(cfg.JoinBackoffMax)}
}

// joinBackoff is core's MaxJoinBackoff for the file's join_backoff_max, where 0 means off.
func joinBackoff(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// servePM runs the path manager of cfg (policy: --policy, which a reload keeps) until ctx
// ends, with its status endpoint and control socket (reload, status).
func servePM(ctx context.Context, cfg *config.PM, policy string, log *slog.Logger) error {
	ups, err := pmUplinks(cfg)
	if err != nil {
		return err
	}
	var res *pm.Resolver
	if cfg.Policy == "amptcp" {
		res, err = pm.NewResolver(pm.ResolverOptions{Resolvers: cfg.AMPTCP.Resolvers, Source: cfg.AMPTCP.LookupSource,
			Timeout: cfg.AMPTCP.LookupTimeout, Retries: cfg.AMPTCP.LookupRetries, MaxAge: cfg.AMPTCP.MaxAge, Logger: log})
		if err != nil {
			return err
		}
	}
	pol, err := pmPolicy(cfg, res)
	if err != nil {
		if res != nil {
			res.Close()
		}
		return err
	}
	d, err := pm.New(pm.Options{Uplinks: ups, Policy: pol, Logger: log, Poll: cfg.Poll, Resolver: res, Core: pmCore(cfg)})
	if err != nil {
		if res != nil {
			res.Close()
		}
		return err
	}
	defer func() {
		if err := d.Close(); err != nil {
			log.Warn("restore net.mptcp.pm_type", "err", err)
		}
	}()
	warnExposure(log, cfg.Metrics)
	if cfg.Metrics != "" {
		srv, err := metrics.Listen(cfg.Metrics, d)
		if err != nil {
			return err
		}
		defer srv.Close()
		log.Info("status and metrics", "addr", srv.Addr(), "page", srv.PageURL())
	}
	rl := newRoleReloader(ctx, "pm", log, func(file string) ([]string, error) {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		next, err := config.LoadPM(file, data, systemEnv{})
		if err != nil {
			return nil, configLines(err)
		}
		if policy != "" {
			next.UsePolicy(policy)
		}
		changes, err := reloadPM(d, res, cfg, next, log)
		if err == nil {
			cfg = next
		}
		return changes, err
	})
	if cfg.Control != "" {
		stop, err := serveReloadControl(ctx, cfg.Control, rl, d.StatusJSON)
		if err != nil {
			return err
		}
		defer stop()
	}
	return d.Run(ctx)
}

// reloadPM applies next to the daemon d, which runs cur: the policy and its settings, the
// timers and ports, the uplinks' backup flags. The uplinks, poll, map-resolvers, metrics and
// control only a restart changes; so does a change of policy to or from amptcp.
func reloadPM(d *pm.Daemon, res *pm.Resolver, cur, next *config.PM, log *slog.Logger) ([]string, error) {
	var rc restartCheck
	type uplinkID struct {
		Name, Interface string
		Address         netip.Addr
	}
	ids := func(c *config.PM) []uplinkID {
		var out []uplinkID
		for _, u := range c.Uplinks {
			out = append(out, uplinkID{u.Name, u.Interface, u.Address})
		}
		return out
	}
	rc.check("uplinks", ids(cur), ids(next))
	rc.check("poll", cur.Poll, next.Poll)
	rc.check("metrics", cur.Metrics, next.Metrics)
	rc.check("control", cur.Control, next.Control)
	if (cur.Policy == "amptcp") != (next.Policy == "amptcp") {
		rc.check("policy (to or from amptcp)", cur.Policy, next.Policy)
	}
	if cur.Policy == "amptcp" && next.Policy == "amptcp" {
		rc.check("resolvers", cur.AMPTCP.Resolvers, next.AMPTCP.Resolvers)
		rc.check("lookup_source", cur.AMPTCP.LookupSource, next.AMPTCP.LookupSource)
		rc.check("lookup_timeout", cur.AMPTCP.LookupTimeout, next.AMPTCP.LookupTimeout)
		rc.check("lookup_retries", cur.AMPTCP.LookupRetries, next.AMPTCP.LookupRetries)
		rc.check("mapping_max_age", cur.AMPTCP.MaxAge, next.AMPTCP.MaxAge)
	}
	if err := rc.err(); err != nil {
		return nil, err
	}
	ups, err := pmUplinks(next)
	if err != nil {
		return nil, err
	}
	var changes []string
	note := func(what string, args ...any) {
		s := what
		for i := 0; i+1 < len(args); i += 2 {
			s += fmt.Sprintf(" %v=%v", args[i], args[i+1])
		}
		changes = append(changes, s)
		log.Info("reload: "+what, args...)
	}
	pol := d.Policy()
	policyChanged := cur.Policy != next.Policy || !reflect.DeepEqual(cur.AMPTCP, next.AMPTCP)
	if policyChanged {
		if pol, err = pmPolicy(next, res); err != nil {
			return nil, err
		}
	}
	if err := d.Reconfigure(ups, pol, pmCore(next)); err != nil {
		return nil, err
	}
	if cur.Policy != next.Policy {
		note("policy changed", "from", cur.Policy, "to", next.Policy)
	} else if policyChanged {
		note("policy settings changed", "policy", next.Policy)
	}
	for _, t := range []struct {
		name     string
		old, new any
	}{{"join_timeout", cur.JoinTimeout, next.JoinTimeout}, {"dead_after", cur.DeadAfter, next.DeadAfter},
		{"retry", cur.Retry, next.Retry}, {"join_backoff_max", cur.JoinBackoffMax, next.JoinBackoffMax},
		{"max_announced", cur.MaxAnnounced, next.MaxAnnounced}, {"join_attempts", cur.JoinAttempts, next.JoinAttempts},
		{"port_base", cur.PortBase, next.PortBase}, {"port_span", cur.PortSpan, next.PortSpan}} {
		if t.old != t.new {
			note("setting changed", "name", t.name, "from", t.old, "to", t.new)
		}
	}
	for i, u := range next.Uplinks {
		if u.Backup != cur.Uplinks[i].Backup {
			note("uplink backup changed", "uplink", u.Name, "backup", u.Backup)
		}
	}
	return changes, nil
}

// amptcpPolicy builds the amptcp policy from its configuration over the resolver.
func amptcpPolicy(c config.PMAMPTCP, res core.MappingSource) *core.AMPTCP {
	p := &core.AMPTCP{Maps: res, MinBytes: c.MinBytes, Force: c.Subflows, ClientOnly: true}
	if c.Routing == "bound" {
		p.Routing = core.RoutingBound
	}
	if len(c.EIDPrefixes) > 0 {
		prefixes := slices.Clone(c.EIDPrefixes)
		p.InScope = func(remote string) bool {
			a, err := netip.ParseAddr(remote)
			if err != nil {
				return false
			}
			for _, q := range prefixes {
				if q.Contains(a.Unmap()) {
					return true
				}
			}
			return false
		}
	}
	return p
}
