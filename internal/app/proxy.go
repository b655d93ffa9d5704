package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"braid/internal/config"
	"braid/internal/metrics"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
	"braid/internal/netconf"
	"braid/internal/proxy"
	"braid/internal/proxy/ident"
)

func init() {
	commands["proxy"] = command{summary: "transparent TCP-to-MPTCP proxy between sites (federation)", run: runProxy}
}

const proxyDoc = `Usage: braid proxy --config FILE [--log-format text|json] [--verbose]
       braid proxy check --config FILE
       braid proxy reload [--control SOCKET]
       braid proxy keygen [--out FILE]
       braid proxy keygen --public < FILE
       braid proxy --cleanup [--config FILE]

braid proxy joins the TCP of two or more sites over MPTCP. Applications talk plain TCP; the proxy
of their site intercepts each connection to another site's networks (nftables TPROXY, or
REDIRECT), carries it over one MPTCP connection to the peer proxy of that site, with a subflow
over every uplink to every address of the peer, and the peer proxy opens plain TCP to the
destination from the client's own address and port (IP_TRANSPARENT), so the server sees the real
client. Every proxy plays both roles. Ordinary SOCKS5 clients (curl --socks5) are served too.

Proxies authenticate each other with TLS 1.3 and pinned Ed25519 keys: make a key with
'braid proxy keygen --out FILE', give its public key ('--public') to the peers' site files.
Connections from anything else are refused and counted; 'plaintext = true' turns encryption
off for links that are protected below (IPsec).

A new connection costs no round trip to the peer: the proxy keeps 'pool' connections to each
peer open and authenticated, and sends the request in front of the client's first data without
waiting for an answer.

The site file's [proxy] section (docs/proxy.md has a full two-site example):

  [proxy]
  mode = "tproxy"                 # tproxy | redirect | socks (no interception)
  private_key_file = "proxy.key"
  metrics = "127.0.0.1:9478"      # GET /status, /metrics; 'braid status --addr' reads it
  [[proxy.uplink]]
  name = "fibre"
  interface = "wan0"
  address = "192.0.2.1"
  [[proxy.tenant]]
  name = "blue"
  networks = ["10.1.0.0/24"]
  port = 7001                     # interception delivers here
  peer_port = 7101                # peers connect here (MPTCP)
  socks = "10.1.0.254:1080"       # optional
    [[proxy.tenant.peer]]
    name = "site-b"
    public_key = "..."
    address = ["198.51.100.1:7101"]
    networks = ["10.2.0.0/24"]

Who may use what: a peer must hold a pinned key (or, in plaintext, connect from one of its
configured addresses or 'sources'), claim only sources in its networks and ask only for the
tenant's own networks; a request without a source is refused unless the tenant sets
'allow_sourceless = true'. The SOCKS5 listener serves the tenant's own networks only (or
'socks_clients'). Connections not yet authenticated are capped ('max_unauthenticated'), and
ADD_ADDR announces the other uplinks only to authenticated peers.

Subflows (path_manager = "braid", the default): one from every uplink to every address of the
peer. A join not up within pm_join_timeout (1s) is tried again with a fresh port; a pair of an
uplink and a peer address that has never carried a subflow on the connection is tried at
doubling intervals up to pm_join_backoff_max (30s; "0" keeps retrying every pm_join_timeout).
pm_policy = "rbpm" demotes to backup the subflows whose data would wait in the peer's buffer.

'reload' (or SIGHUP) re-reads the site file the proxy started with and applies its tenants:
tenants and peers added, removed or changed; what did not change keeps its connections. It
also gives the path manager its pm_policy, pm_join_timeout and pm_join_backoff_max. A file
with a mistake, or a change only a restart applies (mode, key, uplinks, timeouts...), is
refused with the reason and nothing changes.

The proxy installs its nftables table (inet braid_proxy), a policy rule (fwmark -> route_table)
and local routes, and removes them on exit. SIGTERM drains: new connections are refused,
those under way get drain_timeout to finish. After a SIGKILL, 'braid proxy --cleanup' removes
what was left.

Example:
  braid proxy keygen --out /etc/braid/proxy.key
  braid proxy check --config /etc/braid/site.toml
  braid proxy --config /etc/braid/site.toml
  braid status --addr 127.0.0.1:9478
  curl --socks5 10.1.0.254:1080 http://10.2.0.1/
`

// proxyPMCore is the core configuration of the proxy's path manager: the file's join timeout
// and backoff, and a dead_after of 5 s, a backstop behind the failover monitor
// (internal/proxy/failover.go), which handles dead subflows.
func proxyPMCore(cfg *config.Proxy) core.Config {
	return core.Config{JoinTimeout: cfg.PMJoinTimeout, DeadAfter: 5 * time.Second, Retry: 250 * time.Millisecond,
		MaxJoinBackoff: joinBackoff(cfg.PMJoinBackoffMax)}
}

func runProxy(e env, args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "keygen":
			return proxyKeygen(e, args[1:])
		case "check":
			return proxyRun(e, args[1:], true)
		case "reload":
			return proxyReload(e, args[1:])
		}
	}
	return proxyRun(e, args, false)
}

func proxyKeygen(e env, args []string) int {
	fs := newFlags(e, "braid proxy keygen", proxyDoc)
	out := fs.String("out", "", "write the private key to `FILE` (mode 0600, never overwritten)")
	public := fs.Bool("public", false, "read a private key on standard input and print its public key")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "braid proxy keygen: takes no arguments")
		return exitUsage
	}
	if *public {
		line, _ := bufio.NewReader(e.stdin).ReadString('\n')
		k, err := ident.ParsePrivateKey(strings.TrimSpace(line))
		if err != nil {
			fmt.Fprintf(e.stderr, "braid proxy keygen --public: %v\n", err)
			return exitError
		}
		fmt.Fprintln(e.stdout, k.Public())
		return exitOK
	}
	k, err := ident.Generate()
	if err != nil {
		fmt.Fprintf(e.stderr, "braid proxy keygen: %v\n", err)
		return exitError
	}
	if *out == "" {
		fmt.Fprintln(e.stdout, k)
		return exitOK
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		_, err = fmt.Fprintln(f, k)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "braid proxy keygen: %v\n", err)
		return exitError
	}
	fmt.Fprintf(e.stdout, "private key written to %s; public key %s\n", *out, k.Public())
	return exitOK
}

func proxyRun(e env, args []string, check bool) int {
	fs := newFlags(e, "braid proxy", proxyDoc)
	file := fs.String("config", "", "the site `FILE` (TOML)")
	cleanup := fs.Bool("cleanup", false, "remove the rules, routes and path-manager settings a killed proxy left, and exit")
	format := fs.String("log-format", e.defaultLogFormat(), "log format: text or json")
	verbose := fs.Bool("verbose", false, "log debug messages too")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 || (*file == "" && !*cleanup) {
		fmt.Fprintln(e.stderr, "braid proxy: expected --config FILE (see 'braid proxy --help')")
		return exitUsage
	}
	cfg := config.ProxyDefaults()
	if *file != "" {
		data, err := os.ReadFile(*file)
		if err != nil {
			fmt.Fprintf(e.stderr, "braid proxy: %v\n", err)
			return exitError
		}
		c, err := config.LoadProxy(*file, data, systemEnv{})
		if err != nil {
			return configFail(e, "proxy", err)
		}
		cfg = *c
	}
	if *cleanup {
		return proxyCleanup(e, &cfg)
	}
	if check {
		fmt.Fprintf(e.stdout, "%s: valid (mode %s, %d tenants, %d uplinks, encrypted %v)\n", *file, cfg.Mode, len(cfg.Tenants), len(cfg.Uplinks), !cfg.Plaintext)
		return exitOK
	}
	log, err := newLogger(e, *format, *verbose)
	if err != nil {
		fmt.Fprintf(e.stderr, "braid proxy: %v\n", err)
		return exitUsage
	}
	ctx, cancel := daemonContext("braid proxy", log, *file)
	defer cancel()
	if err := serveProxy(ctx, &cfg, log); err != nil {
		fmt.Fprintf(e.stderr, "braid proxy: %v\n", err)
		return exitError
	}
	return exitOK
}

// proxyCleanup removes a killed proxy's leftovers.
func proxyCleanup(e env, cfg *config.Proxy) int {
	before, _ := netconf.Leftovers(cfg.FwMark, cfg.RouteTable)
	err := netconf.Cleanup(cfg.FwMark, cfg.RouteTable)
	if cfg.PathManager == "braid" {
		// The userspace PM the proxy selected; the kernel's default is the in-kernel PM.
		if b, rerr := os.ReadFile("/proc/sys/net/mptcp/pm_type"); rerr == nil && strings.TrimSpace(string(b)) == "1" {
			if werr := os.WriteFile("/proc/sys/net/mptcp/pm_type", []byte("0"), 0o644); werr != nil {
				err = errors.Join(err, werr)
			} else {
				before = append(before, "net.mptcp.pm_type = 1")
			}
		}
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "braid proxy --cleanup: %v\n", err)
		return exitError
	}
	if len(before) == 0 {
		fmt.Fprintln(e.stdout, "nothing to clean up")
	}
	for _, s := range before {
		fmt.Fprintf(e.stdout, "removed %s\n", s)
	}
	return exitOK
}

func proxyOptions(cfg *config.Proxy, log *slog.Logger) (proxy.Options, error) {
	o := proxy.Options{Pool: cfg.Pool, PoolIdle: cfg.PoolIdle, ConnectTimeout: cfg.ConnectTimeout,
		HeaderTimeout: cfg.HeaderTimeout, DrainTimeout: cfg.DrainTimeout, Logger: log, MaxUnauthenticated: cfg.MaxUnauthenticated}
	switch cfg.Mode {
	case "tproxy":
		o.Intercept = proxy.InterceptTProxy
	case "redirect":
		o.Intercept = proxy.InterceptRedirect
	}
	if !cfg.Plaintext {
		cert, err := ident.Certificate(cfg.PrivateKey)
		if err != nil {
			return o, err
		}
		o.Cert = &cert
	}
	for _, t := range cfg.Tenants {
		pt := proxy.Tenant{Name: t.Name, Networks: t.Networks, Port: t.Port, PeerPort: t.PeerPort, Socks: t.Socks,
			SocksClients: t.SocksClients, AllowSourceless: t.AllowSourceless}
		for _, pr := range t.Peers {
			pt.Peers = append(pt.Peers, proxy.Peer{Name: pr.Name, Key: pr.PublicKey, Addrs: pr.Addresses, Networks: pr.Networks, Sources: pr.Sources})
		}
		o.Tenants = append(o.Tenants, pt)
	}
	return o, nil
}

func intercept(cfg *config.Proxy) netconf.Intercept {
	ic := netconf.Intercept{Mode: netconf.ModeNone, FwMark: cfg.FwMark, RouteTable: cfg.RouteTable}
	switch cfg.Mode {
	case "tproxy":
		ic.Mode = netconf.ModeTProxy
	case "redirect":
		ic.Mode = netconf.ModeRedirect
	}
	for _, t := range cfg.Tenants {
		it := netconf.InterceptTenant{Name: t.Name, Sources: t.Networks, Port: t.Port}
		for _, pr := range t.Peers {
			it.Destinations = append(it.Destinations, pr.Networks...)
		}
		ic.Tenants = append(ic.Tenants, it)
	}
	return ic
}

// proxySource serves the proxy's status and metrics, with the path manager's.
type proxySource struct {
	p      *proxy.Proxy
	pmd    *pm.Daemon
	ann    *proxy.Announcer
	pmName string
}

func (s proxySource) StatusJSON() any {
	st := s.p.Status()
	doc := struct {
		Role        string        `json:"role"`
		Proxy       *proxy.Status `json:"proxy"`
		PathManager string        `json:"path_manager"`
		Announced   uint64        `json:"announced"`
		AnnFailed   uint64        `json:"announce_failures"`
	}{Role: "proxy", Proxy: &st, PathManager: s.pmName}
	if s.ann != nil {
		doc.Announced, doc.AnnFailed = s.ann.Counts()
	}
	return doc
}

func (s proxySource) WriteMetrics(w *metrics.Writer) {
	s.p.WriteMetrics(w)
	if s.pmd != nil {
		s.pmd.WriteMetrics(w)
	}
	if s.ann != nil {
		a, f := s.ann.Counts()
		w.Sample("braid_proxy_announced_total", metrics.Counter, "ADD_ADDR sent for this site's other uplinks.", float64(a))
		w.Sample("braid_proxy_announce_failures_total", metrics.Counter, "ADD_ADDR the kernel refused to send.", float64(f))
	}
}

func serveProxy(ctx context.Context, cfg *config.Proxy, log *slog.Logger) (err error) {
	warnExposure(log, cfg.Metrics, cfg.PrivateKeyFile)
	o, err := proxyOptions(cfg, log)
	if err != nil {
		return err
	}
	var ups []proxy.Uplink
	for _, u := range cfg.Uplinks {
		ifi, err := net.InterfaceByName(u.Interface)
		if err != nil {
			return fmt.Errorf("uplink %s: interface %s: %w", u.Name, u.Interface, err)
		}
		ups = append(ups, proxy.Uplink{Name: u.Name, Addr: u.Address, IfIndex: int32(ifi.Index), Backup: u.Backup})
	}
	// The path manager first: connections opened before it would have one subflow.
	src := proxySource{pmName: cfg.PathManager}
	var wg sync.WaitGroup
	pmCtx, stopPM := context.WithCancel(context.Background())
	defer func() { stopPM(); wg.Wait() }()
	var pmUps []core.Uplink // the path manager's, when it is braid's
	switch cfg.PathManager {
	case "braid":
		for _, u := range ups {
			pmUps = append(pmUps, core.Uplink{Name: u.Name, Addr: u.Addr.String(), IfIndex: u.IfIndex, Backup: u.Backup, V6: u.Addr.Is6()})
		}
		pol, err := pm.NewPolicy(cfg.PMPolicy)
		if err != nil {
			return fmt.Errorf("path manager: %w", err)
		}
		// Dead subflows are the failover monitor's (internal/proxy/failover.go): the manager's own
		// rule (data unacknowledged, no acknowledgement for DeadAfter) cannot tell a dead path
		// from a pooled connection's first data after a pause, and with 500 ms it destroyed every
		// subflow of such a connection as its download began. It stays as a backstop.
		d, err := pm.New(pm.Options{Uplinks: pmUps, Policy: pol, Logger: log.With("part", "pm"), Poll: 50 * time.Millisecond,
			Core: proxyPMCore(cfg)})
		if err != nil {
			return fmt.Errorf("path manager: %w", err)
		}
		defer func() {
			if err := d.Close(); err != nil {
				log.Warn("restore net.mptcp.pm_type", "err", err)
			}
		}()
		var ports []uint16
		for _, t := range cfg.Tenants {
			ports = append(ports, t.PeerPort)
		}
		ann, err := proxy.NewAnnouncer(ups, ports, log.With("part", "announce"))
		if err != nil {
			return fmt.Errorf("path manager: %w", err)
		}
		defer ann.Close()
		o.Authenticated = func(local, remote netip.AddrPort) { ann.Authenticated(pmCtx, local, remote) }
		src.pmd, src.ann = d, ann
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := d.Run(pmCtx); err != nil {
				log.Error("path manager stopped", "err", err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := ann.Run(pmCtx); err != nil {
				log.Error("announcer stopped", "err", err)
			}
		}()
		defer func() { stopPM(); wg.Wait() }() // before the sockets close
	case "kernel":
		remove, err := proxy.KernelEndpoints(ctx, ups)
		if err != nil {
			return fmt.Errorf("kernel path manager: %w", err)
		}
		defer func() {
			if err := remove(); err != nil {
				log.Warn("remove MPTCP endpoints", "err", err)
			}
		}()
	}
	o.Failover = cfg.PathManager == "braid"
	o.FailoverMaxBacklog = cfg.ResetBacklog
	o.SendBacklog = cfg.SendBacklog
	for _, u := range ups {
		if u.Backup {
			o.BackupAddrs = append(o.BackupAddrs, u.Addr)
		}
	}
	p, err := proxy.New(o)
	if err != nil {
		return err
	}
	defer p.Close()
	ic := intercept(cfg)
	if err := netconf.Install(ic); err != nil {
		return err
	}
	defer func() {
		if rerr := netconf.Remove(ic); rerr != nil {
			log.Warn("remove interception", "err", rerr)
			err = errors.Join(err, rerr)
		}
	}()
	log.Info("interception installed", "mode", cfg.Mode, "table", "inet "+netconf.Table, "fwmark", fmt.Sprintf("0x%x", cfg.FwMark), "route_table", cfg.RouteTable)
	src.p = p
	if cfg.Metrics != "" {
		srv, err := metrics.Listen(cfg.Metrics, src)
		if err != nil {
			return err
		}
		defer srv.Close()
		log.Info("status and metrics", "addr", srv.Addr(), "page", srv.PageURL())
	}
	rl := &proxyReloader{p: p, ann: src.ann, pmd: src.pmd, pmUplinks: pmUps, log: log, cfg: cfg, load: loadProxyConfig, rules: installRules}
	file := daemonFile(ctx)
	onHangup(ctx, func(file string) {
		log.Info("SIGHUP: reloading", "file", file)
		rl.reload(file) // logged either way
	})
	if cfg.Control != "" {
		stop, err := serveControl(ctx, cfg.Control, func(r proxyRequest) error {
			if r.Action != "reload" {
				return fmt.Errorf("action %q: the proxy's control socket serves reload and status", r.Action)
			}
			ch, err := rl.reload(file)
			if err != nil {
				return err
			}
			return controlDone(file + ": " + ch.String())
		}, src.StatusJSON)
		if err != nil {
			return err
		}
		defer stop()
	}
	return p.Run(ctx)
}

// printProxyStatus prints a proxy's /status document (braid status): each tenant's counters,
// then every live connection with its subflows.
func printProxyStatus(e env, body []byte, asJSON bool) int {
	var doc struct {
		Role        string        `json:"role"`
		Proxy       *proxy.Status `json:"proxy"`
		PathManager string        `json:"path_manager"`
		Announced   uint64        `json:"announced"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.Proxy == nil {
		fmt.Fprintf(e.stderr, "braid status: not a proxy status document: %v\n", err)
		return exitError
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(doc)
		return exitOK
	}
	st := doc.Proxy
	state := "serving"
	if st.Draining {
		state = "draining"
	}
	enc := "TLS 1.3, pinned keys"
	if !st.Encrypted {
		enc = "plaintext"
	}
	fmt.Fprintf(e.stdout, "proxy, up %s, %s, %s, path manager %s (%d addresses announced), %d/%d peer connections unauthenticated (%d/%d from peers' addresses)\n\n",
		st.Uptime.Round(time.Second), state, enc, doc.PathManager, doc.Announced, st.Unauthenticated, st.MaxUnauthenticated, st.UnauthenticatedPeers, st.MaxUnauthenticated)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tOUT\tIN\tACTIVE\tBYTES UP\tBYTES DOWN\tPOOLED\tREFUSED")
	for _, t := range st.Tenants {
		pooled := 0
		for _, n := range t.PoolReady {
			pooled += n
		}
		var refused []string
		for _, r := range proxy.Reasons {
			if n := t.Refused[r]; n > 0 {
				refused = append(refused, fmt.Sprintf("%s=%d", r, n))
			}
		}
		if len(refused) == 0 {
			refused = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", t.Name, t.Out, t.In, t.Active, t.BytesUp, t.BytesDown, pooled, strings.Join(refused, " "))
	}
	tw.Flush()
	if len(st.Connections) == 0 {
		fmt.Fprintln(e.stdout, "\nno live connections")
		return exitOK
	}
	fmt.Fprintln(e.stdout)
	tw = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONN\tTENANT\tROLE\tPEER\tSOURCE\tDESTINATION\tAGE\tUP\tDOWN\tSUBFLOWS\tUNACKED")
	for _, c := range st.Connections {
		sub := "fell back to TCP"
		if c.MPTCP {
			sub = strconv.Itoa(len(c.Subflows))
		}
		src := "-"
		if c.Src.IsValid() {
			src = c.Src.String()
		}
		unacked := "-"
		if c.MPTCP {
			unacked = fmt.Sprintf("%d B, last ack %s ago", c.Unacked, c.LastAck)
			if c.Undelivered > 0 {
				unacked = fmt.Sprintf("%d B (%d B delivered by subflows), last ack %s ago", c.Unacked, c.Undelivered, c.LastAck)
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d B\t%d B\t%s\t%s\n", c.ID, c.Tenant, c.Role, c.Peer, src, c.Dst, c.Age.Round(time.Second), c.BytesUp, c.Down, sub, unacked)
		for _, s := range c.Subflows {
			state := fmt.Sprintf("in flight %d, unsent %d B, last ack %s ago", s.Unacked, s.NotSent, s.LastAck)
			if s.TCPState != 1 { // TCP_ESTABLISHED
				state = fmt.Sprintf("not established (TCP state %d)", s.TCPState)
			}
			fmt.Fprintf(tw, "\t\t\t\t  %s\t-> %s\trtt %.1f ms\tsent %d B\trecv %d B\tretrans %d B\t%s\n",
				s.Local, s.Remote, float64(s.RTT)/1e6, s.BytesSent, s.BytesRecv, s.Retrans, state)
		}
	}
	tw.Flush()
	return exitOK
}
