package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"braid/internal/config"
	"braid/internal/lb"
	"braid/internal/lb/xdp"
	"braid/internal/metrics"
)

func init() {
	commands["lb"] = command{summary: "MPTCP-aware layer-4 load balancer with an XDP data plane", run: runLB}
}

const lbDoc = `Usage: braid lb --config FILE [--log-format text|json] [--verbose]
       braid lb check --config FILE
       braid lb status|backends|tokens [--addr HOST:PORT] [--json]
       braid lb weight NAME WEIGHT [--control SOCKET]
       braid lb drain NAME [--control SOCKET]
       braid lb remove NAME [--control SOCKET]
       braid lb add NAME --mac MAC [--interface IF] [--address ADDR] [--weight W] [--stateless-port P] [--control SOCKET]
       braid lb reload [--control SOCKET]

braid lb balances TCP connections to virtual services (VIP:port) over backends that hold the
VIP themselves and answer clients directly (direct server return). It is MPTCP-aware: every
subflow of an MPTCP connection reaches the same backend. An XDP program on the 'interface'
does the work per packet:

  - a first subflow (a SYN without MP_JOIN) goes to the backend that Maglev consistent hashing
    picks for its 5-tuple, and the flow is pinned in a connection table;
  - the server's token is learned from the key in the client's MP_CAPABLE (third ACK or first
    data; SHA-256 for MPTCP v1, SHA-1 for v0), in the XDP program itself, so a join that
    follows within microseconds is already steered;
  - an MP_JOIN SYN goes to the backend that owns its token; a join with a token nobody owns is
    dropped and counted (a backend that does not know the token would reset it, and clients do
    not retry);
  - a backend's 'stateless_port' sends (VIP, that port) to it with no state: for backends that
    set the MPTCP C flag (net.mptcp.allow_join_initial_addr_port = 0) and announce the VIP
    with their own port (ip mptcp endpoint add VIP dev IF port P signal).

Backends are reached by rewriting the destination MAC (mode "mac", backends on the segment of
their 'interface') or by IP-in-IP encapsulation to their 'address' (mode "ipip", backends
anywhere; they decapsulate with an ipip/ip6tnl device and hold the VIP).

A live token is never overwritten: a second backend claiming it is a collision, counted, and
with collision = "drop" its joins are dropped. Tokens are learned only on flows whose MP_CAPABLE
SYN the balancer placed, at most learn_rate per second per client /24 or /64, into a pending
table (an LRU: forged handshakes push out only other pending tokens) where a token steers joins
for token_unjoined; its first join moves it to the joined table, which nothing evicts, at most
global_rate per second over all CPUs. Joined tokens expire after token_idle without traffic
(token_closing when the table is 3/4 full), token_closing after the client's DATA_FIN, at once
on the client's MP_FASTCLOSE, and with their backend. Flows seen only by their SYN wait in an
embryonic table, so a SYN flood evicts no established flow. IPv4 fragments and IPv6 extension
headers addressed to a VIP are dropped. docs/lb.md: "Security: floods and spoofing".

Weight 0 drains a backend: its connections and every subflow they add stay, new connections go
elsewhere. Adding a backend moves no established connection. A backend with a 'health' address
takes connections only while TCP connects to it succeed ('rise' in a row to come up, 'fall' to
go down).

'reload' (or SIGHUP to the daemon) re-reads the site file the balancer started with and applies
the difference: services and backends added or removed, weights (0 drains), targets, health
checks, stateless ports, and the hashing, collision, learning-rate and token-timer settings. A
backend or service that stays keeps its flows and tokens, so established connections to it go
on; a removed backend loses its flows. A file with a mistake is refused with its file and line,
as is a change only a restart applies (interfaces, attach, table sizes, health_interval, sweep,
metrics, control); then nothing changes and 'reload' exits 1. Each change is logged on one line
(docs/lb.md, "Reload").

The site file's [lb] section:

  [lb]
  interface = "eth0"            # where the VIP traffic arrives
  interfaces = ["eth1"]         # more such interfaces, if any
  mode = "mac"                  # mac | ipip (then encap_source4/encap_source6)
  metrics = "127.0.0.1:9476"    # GET /status (JSON) and /metrics (Prometheus)
  control = "@braid/lb"         # the default: an abstract socket of the network namespace
  [[lb.service]]
  vip = "203.0.113.80:443"
  [[lb.backend]]
  name = "web1"
  mac = "02:00:00:00:00:01"
  health = "10.0.0.11:443"

Several instances (a fleet) share the VIPs behind routers that spread them by ECMP: each
instance announces its VIPs over BGP ([lb.bgp]; GoBGP runs inside braid lb, it connects to
its neighbours and never listens) while it serves (a backend is up and not drained), and
withdraws them when it stops serving. On SIGTERM it withdraws them first, keeps forwarding for
'drain', then stops. Every instance needs the same backends, hash_seed and services (Maglev
then places a flow the same way on each), and the backends the stateless mode, since a join
may reach an instance that did not see its connection (docs/lb.md, "Several instances"):

  [lb.bgp]
  local_as = 65001
  router_id = "10.4.0.2"        # IPv4; also the next hop of IPv4 VIPs unless next_hop is set
  # next_hop6 = "2001:db8::2"   # required to announce IPv6 VIPs
  # announce = ["10.100.0.1/32"]  # default: every service's VIP, /32 or /128
  hold_time = "9s"
  drain = "2s"
  [[lb.bgp.neighbor]]
  address = "10.4.0.1"
  as = 65000
  # port = 179

Example:
  braid lb check --config /etc/braid/site.toml
  braid lb --config /etc/braid/site.toml
  braid lb backends
  braid lb drain web1
  braid lb reload
  braid lb tokens --json
`

func runLB(e env, args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "check":
			return lbCheck(e, args[1:])
		case "status", "backends", "tokens":
			return lbShow(e, args[0], args[1:])
		case "weight", "drain", "remove", "add":
			return lbControl(e, args[0], args[1:])
		case "reload":
			return runReloadCommand(e, "lb", lbDoc, config.LBDefaults().Control, args[1:])
		}
	}
	return runDaemon(e, "lb", lbDoc, args, loadLBConfig, serveLB)
}

func loadLBConfig(file string) (*config.LB, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return config.LoadLB(file, data, systemEnv{})
}

func lbCheck(e env, args []string) int {
	return runCheck(e, args, "lb", lbDoc, loadLBConfig, func(cfg *config.LB) string {
		aware := "MPTCP-aware"
		if !cfg.Aware {
			aware = "MPTCP-unaware"
		}
		s := fmt.Sprintf("%s, mode %s, %d services, %d backends", aware, cfg.Mode, len(cfg.Services), len(cfg.Backends))
		if cfg.BGP != nil {
			s += fmt.Sprintf(", BGP AS %d announcing %v to %d neighbours", cfg.BGP.LocalAS, cfg.BGP.Announce, len(cfg.BGP.Neighbors))
		}
		return s
	})
}

// lbPlaneConfig is the data plane's configuration from the site file.
func lbPlaneConfig(cfg *config.LB, srcMAC net.HardwareAddr) xdp.Config {
	c := xdp.Config{Aware: cfg.Aware, HashAddrs: cfg.Hash == "addresses", CollideDrop: cfg.Collision == "drop",
		HashSeed: cfg.HashSeed, LearnRate: cfg.LearnRate, LearnBurst: cfg.LearnBurst, GlobalRate: cfg.GlobalRate,
		GlobalBurst: cfg.GlobalBurst, UnjoinedAfter: cfg.TokenUnjoined, Src4: cfg.EncapSource4, Src6: cfg.EncapSource6, SrcMAC: srcMAC}
	if cfg.Mode == "ipip" {
		c.Mode = xdp.ModeIPIP
	}
	return c
}

func lbBackendSpec(b config.LBBackend) (lb.BackendSpec, error) {
	s := lb.BackendSpec{Name: b.Name, Weight: b.Weight, Health: b.Health, StatelessPort: b.StatelessPort,
		Target: xdp.Backend{MAC: b.MAC, Addr: b.Address}}
	if b.Interface != "" {
		ifi, err := net.InterfaceByName(b.Interface)
		if err != nil {
			return s, fmt.Errorf("backend %s: interface %s: %w", b.Name, b.Interface, err)
		}
		s.Target.IfIndex = ifi.Index
	}
	return s, nil
}

func serveLB(ctx context.Context, cfg *config.LB, log *slog.Logger) error {
	warnExposure(log, cfg.Metrics)
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return fmt.Errorf("interface %s: %w", cfg.Interface, err)
	}
	src := cfg.SourceMAC
	if src == nil {
		src = ifi.HardwareAddr
		for _, b := range cfg.Backends {
			if b.Interface != "" {
				if bi, err := net.InterfaceByName(b.Interface); err == nil {
					src = bi.HardwareAddr
				}
				break
			}
		}
	}
	var specs []lb.BackendSpec
	for _, b := range cfg.Backends {
		s, err := lbBackendSpec(b)
		if err != nil {
			return err
		}
		specs = append(specs, s)
	}
	d, err := xdp.Load(xdp.Options{Conns: cfg.ConnTable, Embryonic: cfg.EmbryonicTable, Tokens: cfg.TokenTable, Pending: cfg.PendingTable})
	if err != nil {
		return err
	}
	defer d.Close()
	l, err := lb.New(d, lb.Options{Services: cfg.Services, Plane: lbPlaneConfig(cfg, src),
		TokenIdle: cfg.TokenIdle, TokenClosing: cfg.TokenClosing, Sweep: cfg.Sweep, TokenTable: cfg.TokenTable,
		HealthInterval: cfg.HealthInterval, HealthTimeout: cfg.HealthTimeout, Rise: cfg.Rise, Fall: cfg.Fall,
		Logger: log}, specs)
	if err != nil {
		return err
	}
	mode := map[string]xdp.AttachMode{"auto": xdp.AttachAuto, "native": xdp.AttachNative, "generic": xdp.AttachGeneric}[cfg.Attach]
	for _, name := range append([]string{cfg.Interface}, cfg.Interfaces...) {
		ifx, err := net.InterfaceByName(name)
		if err != nil {
			return fmt.Errorf("interface %s: %w", name, err)
		}
		if err := d.Attach(ifx.Index, mode); err != nil {
			return err
		}
	}
	log.Info("balancing", "interface", cfg.Interface, "services", cfg.Services, "backends", len(specs), "mode", cfg.Mode, "aware", cfg.Aware)
	runCtx := ctx
	var status lbSource = l
	if cfg.BGP != nil {
		// Announced only now that the program is attached: a router sends nothing before.
		sp, err := startLBSpeaker(ctx, cfg, l, log)
		if err != nil {
			return err
		}
		defer sp.Stop()
		runCtx = sp.runContext(ctx)
		status = lbWithBGP{l, sp}
	}
	if cfg.Metrics != "" {
		srv, err := metrics.Listen(cfg.Metrics, status)
		if err != nil {
			return err
		}
		defer srv.Close()
		log.Info("status and metrics", "addr", srv.Addr(), "page", srv.PageURL())
	}
	rl := newRoleReloader(ctx, "lb", log, func(file string) ([]string, error) {
		next, err := loadLBConfig(file)
		if err != nil {
			return nil, configLines(err)
		}
		changes, err := reloadLB(l, cfg, next)
		if err == nil {
			cfg = next
		}
		return changes, err
	})
	if cfg.Control != "" {
		stop, err := serveControl(ctx, cfg.Control, func(r lbRequest) error {
			if r.Action == "reload" {
				return rl.controlReload()
			}
			return applyLB(l, r)
		}, status.StatusJSON)
		if err != nil {
			return err
		}
		defer stop()
	}
	return l.Run(runCtx)
}

// reloadLB applies the site file next to the balancer l that runs cur: the changes only a
// restart applies are refused first, then the backends are resolved (an interface that does
// not exist refuses the file), then l applies the difference.
func reloadLB(l *lb.LB, cur, next *config.LB) ([]string, error) {
	var rc restartCheck
	rc.check("interface", cur.Interface, next.Interface)
	rc.check("interfaces", cur.Interfaces, next.Interfaces)
	rc.check("attach", cur.Attach, next.Attach)
	rc.check("metrics", cur.Metrics, next.Metrics)
	rc.check("control", cur.Control, next.Control)
	rc.check("source_mac", cur.SourceMAC, next.SourceMAC)
	rc.check("sweep", cur.Sweep, next.Sweep)
	rc.check("health_interval", cur.HealthInterval, next.HealthInterval)
	rc.check("table sizes", []uint32{cur.ConnTable, cur.EmbryonicTable, cur.TokenTable, cur.PendingTable},
		[]uint32{next.ConnTable, next.EmbryonicTable, next.TokenTable, next.PendingTable})
	if err := rc.err(); err != nil {
		return nil, err
	}
	var specs []lb.BackendSpec
	for _, b := range next.Backends {
		s, err := lbBackendSpec(b)
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	// The frames' source MAC was chosen at start; it stays.
	plane := lbPlaneConfig(next, l.PlaneConfig().SrcMAC)
	changes, err := l.Apply(next.Services, specs, lb.Settings{Plane: plane, TokenIdle: next.TokenIdle,
		TokenClosing: next.TokenClosing, HealthTimeout: next.HealthTimeout, Rise: next.Rise, Fall: next.Fall})
	var out []string
	for _, c := range changes {
		out = append(out, c.String())
	}
	if err != nil && len(changes) > 0 {
		return out, fmt.Errorf("%w: %w", errPartlyApplied, err)
	}
	return out, err
}

// lbRequest is one request on the balancer's control socket.
type lbRequest struct {
	Action    string `json:"action"` // weight, remove, add, reload
	Name      string `json:"name"`
	Weight    uint32 `json:"weight"`
	MAC       string `json:"mac,omitempty"`
	Interface string `json:"interface,omitempty"`
	Address   string `json:"address,omitempty"`
	// StatelessPort is the added backend's own port on every VIP (stateless mode); 0 for none.
	StatelessPort uint16 `json:"stateless_port,omitempty"`
}

func applyLB(l *lb.LB, r lbRequest) error {
	switch r.Action {
	case "weight":
		if r.Weight > 1000 {
			return fmt.Errorf("weight %d outside 0..1000", r.Weight)
		}
		return l.SetWeight(r.Name, r.Weight)
	case "remove":
		return l.RemoveBackend(r.Name)
	case "add":
		if err := lbStatelessPortFree(l, r.StatelessPort); err != nil {
			return err
		}
		b := config.LBBackend{Name: r.Name, Weight: r.Weight, Interface: r.Interface, StatelessPort: r.StatelessPort}
		m, err := net.ParseMAC(r.MAC)
		if err != nil || len(m) != 6 {
			return fmt.Errorf("mac %q: want an Ethernet address", r.MAC)
		}
		b.MAC = m
		if r.Address != "" {
			a, err := netip.ParseAddr(r.Address)
			if err != nil {
				return fmt.Errorf("address %q: %w", r.Address, err)
			}
			b.Address = a
		}
		s, err := lbBackendSpec(b)
		if err != nil {
			return err
		}
		return l.AddBackend(s)
	}
	return fmt.Errorf("action %q is not weight, remove or add", r.Action)
}

func lbControl(e env, action string, args []string) int {
	fs := newFlags(e, "braid lb "+action, lbDoc)
	control := fs.String("control", config.LBDefaults().Control, "the balancer's control `SOCKET`")
	mac := fs.String("mac", "", "add: the backend's `MAC` (or its next hop's)")
	ifname := fs.String("interface", "", "add: egress `INTERFACE` toward the backend")
	addr := fs.String("address", "", "add: the backend's `ADDRESS` (encapsulation destination)")
	weight := fs.Uint("weight", 1, "add: the backend's `WEIGHT`")
	statelessPort := fs.Uint("stateless-port", 0, "add: the backend's own `PORT` on every VIP (stateless mode)")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	req := lbRequest{Action: action}
	switch {
	case action == "weight" && len(pos) == 2:
		w, err := strconv.ParseUint(pos[1], 10, 32)
		if err != nil || w > 1000 {
			fmt.Fprintf(e.stderr, "braid lb weight: %q is not a weight (0..1000; 0 drains)\n", pos[1])
			return exitUsage
		}
		req.Name, req.Weight = pos[0], uint32(w)
	case action == "drain" && len(pos) == 1:
		req.Action, req.Name, req.Weight = "weight", pos[0], 0
	case action == "remove" && len(pos) == 1:
		req.Name = pos[0]
	case action == "add" && len(pos) == 1:
		if *mac == "" {
			fmt.Fprintln(e.stderr, "braid lb add: --mac is required")
			return exitUsage
		}
		if *statelessPort > 65535 {
			fmt.Fprintf(e.stderr, "braid lb add: --stateless-port %d outside 1..65535\n", *statelessPort)
			return exitUsage
		}
		req.Name, req.MAC, req.Interface, req.Address, req.Weight = pos[0], *mac, *ifname, *addr, uint32(*weight)
		req.StatelessPort = uint16(*statelessPort)
	default:
		fmt.Fprintf(e.stderr, "braid lb %s: wrong arguments (see 'braid lb --help')\n", action)
		return exitUsage
	}
	if _, err := callControl(*control, req); err != nil {
		if errors.Is(err, errNotRunning) {
			fmt.Fprintf(e.stderr, "braid lb %s: is braid lb running? %v\n", action, err)
		} else {
			fmt.Fprintf(e.stderr, "braid lb %s: %v\n", action, err)
		}
		return exitError
	}
	return exitOK
}

func lbShow(e env, what string, args []string) int {
	fs := newFlags(e, "braid lb "+what, lbDoc)
	addr := fs.String("addr", config.LBDefaults().Metrics, "the balancer's status `ADDRESS`")
	asJSON := fs.Bool("json", false, "print the raw JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	var st lbStatusDoc
	if err := getStatus(*addr, &st); err != nil {
		fmt.Fprintf(e.stderr, "braid lb %s: %v\n", what, err)
		return exitError
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		switch what {
		case "backends":
			enc.Encode(st.Backends)
		case "tokens":
			enc.Encode(st.Tokens)
		default:
			enc.Encode(st)
		}
		return exitOK
	}
	switch what {
	case "backends":
		printLBBackends(e.stdout, st.Status)
	case "tokens":
		printLBTokens(e.stdout, st.Status)
	default:
		printLBStatus(e.stdout, st.Status)
		printLBBGP(e.stdout, st.BGP)
	}
	return exitOK
}

func printLBStatus(w io.Writer, st lb.Status) {
	aware := "MPTCP-aware"
	if !st.Aware {
		aware = "MPTCP-unaware"
	}
	fmt.Fprintf(w, "services %v, mode %s, %s, %d backends, %d tokens\n\n", st.Services, st.Mode, aware, len(st.Backends), countTokens(st))
	printLBBackends(w, st)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "COUNTER\tVALUE")
	names := make([]string, 0, len(st.Counters))
	for n := range st.Counters {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(tw, "%s\t%d\n", n, st.Counters[n])
	}
	fmt.Fprintf(tw, "tokens_swept\t%d\n", st.TokensSwept)
	fmt.Fprintf(tw, "tokens_removed_with_backend\t%d\n", st.TokensRemoved)
	tw.Flush()
}

func countTokens(st lb.Status) int {
	n := 0
	for _, b := range st.Backends {
		n += b.Tokens
	}
	return n
}

func printLBBackends(w io.Writer, st lb.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tINDEX\tSTATE\tWEIGHT\tFLOWS\tCONNS\tJOINS\tTOKENS\tPACKETS\tBYTES\tHEALTH")
	for _, b := range st.Backends {
		health := b.Health
		if health == "" {
			health = "-"
		}
		if b.HealthError != "" {
			health += " (" + b.HealthError + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", b.Name, b.Index, b.State, b.Weight, b.Flows, b.Conns, b.Joins, b.Tokens, b.Packets, b.Bytes, health)
	}
	tw.Flush()
}

func printLBTokens(w io.Writer, st lb.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tSERVICE\tBACKEND\tVERSION\tAGE\tIDLE\tFLAGS")
	for _, t := range st.Tokens {
		flags := "pending"
		if t.Joined {
			flags = "joined"
		}
		switch {
		case t.Collided:
			flags += ",collided"
		case t.Closing:
			flags += ",closing"
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\tv%d\t%v\t%v\t%s\n", t.Token, t.Service, t.Backend, t.Version,
			time.Duration(t.AgeMS)*time.Millisecond, time.Duration(t.IdleMS)*time.Millisecond, flags)
	}
	tw.Flush()
	if len(st.Tokens) == 0 {
		fmt.Fprintln(w, "(no tokens)")
	}
}
