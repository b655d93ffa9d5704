package app

import (
	"fmt"
	"net"
	"os"

	"braid/internal/config"
	"braid/internal/metrics"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
)

func init() {
	commands["pm"] = command{summary: "MPTCP path-manager daemon on the kernel's userspace PM (policy: fullmesh)", run: runPM}
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

Each subflow is bound to its uplink's interface and address. On Ethernet uplinks, give each
uplink address its own routing table ('ip rule add from ADDR table N') so that replies and
joins leave through the right gateway.

The site file's [pm] section sets the policy and timers; the uplinks are those of [[pm.uplink]]
or, if there are none, of [[tunnel.uplink]]:

  [pm]
  policy = "fullmesh"
  metrics = "127.0.0.1:9475"    # GET /status (JSON) and /metrics (Prometheus)
  backup = ["lte"]              # subflows from these uplinks are backup
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
		cfg.Policy = *policy
	}
	pol, ok := core.Policies[cfg.Policy]
	if !ok {
		fmt.Fprintf(e.stderr, "braid pm: unknown policy %q (known: fullmesh)\n", cfg.Policy)
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
	d, err := pm.New(pm.Options{Uplinks: ups, Policy: pol, Logger: log, Poll: cfg.Poll,
		Core: core.Config{JoinTimeout: cfg.JoinTimeout, DeadAfter: cfg.DeadAfter, Retry: cfg.Retry, PortBase: cfg.PortBase, PortSpan: cfg.PortSpan}})
	if err != nil {
		fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
		return exitError
	}
	defer func() {
		if err := d.Close(); err != nil {
			log.Warn("restore net.mptcp.pm_type", "err", err)
		}
	}()
	if cfg.Metrics != "" {
		srv, err := metrics.Listen(cfg.Metrics, d)
		if err != nil {
			fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
			return exitError
		}
		defer srv.Close()
		log.Info("status and metrics", "addr", srv.Addr())
	}
	ctx, cancel := signalContext()
	defer cancel()
	if err := d.Run(ctx); err != nil {
		fmt.Fprintf(e.stderr, "braid pm: %v\n", err)
		return exitError
	}
	return exitOK
}
