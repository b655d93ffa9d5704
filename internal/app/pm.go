package app

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

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

braid pm manages the subflows of every MPTCP connection of the network namespace it runs in. It
selects the kernel's userspace path manager (sysctl net.mptcp.pm_type = 1; the previous value is
restored on exit), follows the kernel's path-manager events, polls each subflow's TCP statistics
through sock_diag, and lets a policy decide which subflows each connection should have.

Policies:
  fullmesh   one subflow from every local uplink to every address of the peer (its initial
             address and those it announces), on the connections this host opened. A subflow
             whose path stops acknowledging data for 'dead_after' (1 s) is replaced; a join not
             established within 'join_timeout' (1 s) is retried with a fresh source port, so a
             path that comes back carries a subflow again within about a second.
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
  backup = ["lte"]              # subflows from these uplinks are backup
  poll = "100ms"                # statistics and timers (rbpm: 50ms)
  join_timeout = "1s"           # a join not up by then is retried (rbpm: 5s)
  dead_after = "1s"             # unacked data, no ack this long: dead (rbpm: 5s)
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

Example:
  braid pm check --config /etc/braid/site.toml
  braid pm --config /etc/braid/site.toml --policy fullmesh
  curl -s 127.0.0.1:9475/metrics | grep braid_pm_
`

func runPM(e env, args []string) int {
	check := false
	if len(args) > 0 && args[0] == "check" {
		check, args = true, args[1:]
	}
	fs := newFlags(e, "braid pm", pmDoc)
	file := fs.String("config", "", "the site `FILE` (TOML)")
	policy := fs.String("policy", "", "the policy `NAME`, overriding the file's")
	format := fs.String("log-format", "text", "log format: text or json")
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
	pol, ok := core.Policies[cfg.Policy]
	if cfg.Policy == "amptcp" {
		pol, ok = nil, len(cfg.AMPTCP.Resolvers) > 0
	}
	if cfg.Policy == "rbpm" {
		pol, ok = core.NewRBPM(pm.RBPMHoldDown), true
	}
	if !ok {
		fmt.Fprintf(e.stderr, "braid pm: unknown policy %q, or amptcp without resolvers (known: fullmesh, amptcp, rbpm)\n", cfg.Policy)
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
	var ups []core.Uplink
	for _, u := range cfg.Uplinks {
		ifi, err := net.InterfaceByName(u.Interface)
		if err != nil {
			fmt.Fprintf(e.stderr, "braid pm: uplink %s: interface %s: %v\n", u.Name, u.Interface, err)
			return exitError
		}
		ups = append(ups, core.Uplink{Name: u.Name, Addr: u.Address.String(), IfIndex: int32(ifi.Index), Backup: u.Backup, V6: u.Address.Is6()})
	}
	var res *pm.Resolver
	if cfg.Policy == "amptcp" {
		res, err = pm.NewResolver(pm.ResolverOptions{Resolvers: cfg.AMPTCP.Resolvers, Source: cfg.AMPTCP.LookupSource,
			Timeout: cfg.AMPTCP.LookupTimeout, Retries: cfg.AMPTCP.LookupRetries, MaxAge: cfg.AMPTCP.MaxAge, Logger: log})
		if err != nil {
			fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
			return exitError
		}
		pol = amptcpPolicy(cfg.AMPTCP, res)
	}
	d, err := pm.New(pm.Options{Uplinks: ups, Policy: pol, Logger: log, Poll: cfg.Poll, Resolver: res,
		Core: core.Config{JoinTimeout: cfg.JoinTimeout, DeadAfter: cfg.DeadAfter, Retry: cfg.Retry, PortBase: cfg.PortBase, PortSpan: cfg.PortSpan,
			MaxAnnounced: cfg.MaxAnnounced, JoinAttempts: cfg.JoinAttempts, AllowLinkLocal: cfg.AllowLinkLocal}})
	if err != nil {
		if res != nil {
			res.Close()
		}
		fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
		return exitError
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
			fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
			return exitError
		}
		defer srv.Close()
		log.Info("status and metrics", "addr", srv.Addr())
	}
	ctx, cancel := daemonContext("braid pm", log, *file)
	defer cancel()
	if err := d.Run(ctx); err != nil {
		fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
		return exitError
	}
	return exitOK
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
