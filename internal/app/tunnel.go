package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime/pprof"
	"strconv"

	"braid/internal/config"
	"braid/internal/gothreads"
	"braid/internal/metrics"
	"braid/internal/sock"
	"braid/internal/tun"
	"braid/internal/tunnel"
	"braid/internal/tunnel/path"
	"braid/internal/tunnel/reorder"
	"braid/internal/tunnel/session"

	"github.com/vishvananda/netlink"
)

func init() {
	commands["tunnel"] = command{summary: "multipath L3 tunnel between sites (MPT-GRE): run it, or change its paths", run: runTunnel}
}

const tunnelDoc = `Usage: braid tunnel --config FILE [--log-format text|json] [--verbose] [--cpuprofile FILE]
       braid tunnel check --config FILE
       braid tunnel import-mpt --interface interface.conf [--out FILE] CONNECTION.conf...
       braid tunnel path up|down PEER PATH [--control SOCKET]
       braid tunnel path weight PEER PATH WEIGHT [--control SOCKET]
       braid tunnel reload [--control SOCKET]

braid tunnel carries the IP packets of a TUN interface to other sites over several UDP paths at
once (GRE-in-UDP, RFC 8086), so that one flow gets the sum of the paths and survives the loss of
any of them. Packets are sealed with AES-256-GCM or ChaCha20-Poly1305 (the handshake picks the
one both machines run fast, or the site file's 'cipher') under keys from a Noise IK handshake
between the sites' X25519 keys ('braid keygen'); with encryption = false on both sites data
travels in clear, authenticated only, and the log says so. Every path is probed every 50 ms,
also when the tunnel is idle, and a silent path is taken out of use within 300 ms and comes back
by itself.

The site file's [tunnel] section describes the TUN interface, the site's uplinks and its peers
(see the example in internal/config/testdata/site-a.toml). Its 'scheduler' spreads the packets:
paced (the default: each path at its measured or configured capacity), wrr (weights, as MPT),
minrtt, blest, ecf, or rbpm (takes out the paths whose slowness would fill the peer's reorder
buffer, 'reorder_max_bytes', with out-of-order data; 'braid status' shows which and why).
'check' validates it and exits;
'import-mpt' writes one from an MPT daemon's configuration (mode "mpt", to interoperate). The
running tunnel serves its status and Prometheus metrics on the 'metrics' address, and its status
and path changes on its 'control' socket (default @braid/tunnel, an abstract socket of the
network namespace, so each namespace has its own); 'braid status' and 'braid tunnel path' find
it without flags; a change applies to the next packet.
'reload' (or SIGHUP to the daemon) applies the site file it started with, changed: peers,
paths, uplinks, routes, capacities and the scheduler, while the peers that stay keep their
sessions; a file with a mistake is refused with its file and line, and nothing changes
(docs/tunnel.md, "Reload").
The tunnel's Go code runs on one thread while it needs less than a core (fewer wake-ups
and hand-offs between cores: docs/tunnel.md, "Go threads") and on one per CPU once that thread
is saturated; 'threads' in [tunnel] fixes the count instead, and a reload applies it.
--cpuprofile writes a Go CPU profile of the whole run to FILE when the tunnel stops (for 'go tool
pprof'; docs/tunnel-profile.md shows how it was used).

Example:
  braid keygen --out /etc/braid/site-a.key
  braid tunnel check --config /etc/braid/site.toml
  braid tunnel --config /etc/braid/site.toml
  braid tunnel path down site-b 2
  braid tunnel reload
  braid status
`

func runTunnel(e env, args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "check":
			return tunnelCheck(e, args[1:])
		case "import-mpt":
			return tunnelImportMPT(e, args[1:])
		case "path":
			return tunnelPath(e, args[1:])
		case "reload":
			return tunnelReload(e, args[1:])
		case "run":
			args = args[1:]
		}
	}
	return runDaemon(e, "tunnel", tunnelDoc, args, loadTunnelConfig, serveTunnel, cpuProfileFlag)
}

// cpuProfileFlag is --cpuprofile FILE: a Go CPU profile of the whole run, written when the
// role stops.
func cpuProfileFlag(fs *flag.FlagSet) func() (func(), error) {
	file := fs.String("cpuprofile", "", "write a CPU profile of the run to `FILE`")
	return func() (func(), error) {
		if *file == "" {
			return nil, nil
		}
		f, err := os.Create(*file)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		return func() { pprof.StopCPUProfile(); f.Close() }, nil
	}
}

// systemEnv is the machine as config validation sees it.
type systemEnv struct{}

func (systemEnv) InterfaceExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func (systemEnv) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

func loadTunnelConfig(file string) (*config.Tunnel, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return config.LoadTunnel(file, data, systemEnv{})
}

// configFail prints a config error, one problem per line.
func configFail(e env, role string, err error) int {
	fmt.Fprintf(e.stderr, "braid %s: the configuration is not valid:\n", role)
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, x := range joined.Unwrap() {
			fmt.Fprintf(e.stderr, "  %v\n", x)
		}
	} else {
		fmt.Fprintf(e.stderr, "  %v\n", err)
	}
	return exitError
}

func tunnelCheck(e env, args []string) int {
	return runCheck(e, args, "tunnel", tunnelDoc, loadTunnelConfig, func(cfg *config.Tunnel) string {
		return fmt.Sprintf("mode %s, %d uplinks, %d peers", cfg.Mode, len(cfg.Uplinks), len(cfg.Peers))
	})
}

// linkMTU is the MTU of an uplink's interface: the one named, else the one that holds its
// address, else 1500.
func linkMTU(u config.Uplink) int {
	if u.Interface != "" {
		if ifc, err := net.InterfaceByName(u.Interface); err == nil {
			return ifc.MTU
		}
	}
	ifcs, _ := net.Interfaces()
	for _, ifc := range ifcs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && u.Address.IsValid() && ipn.IP.Equal(net.IP(u.Address.AsSlice())) {
				return ifc.MTU
			}
		}
	}
	return 1500
}

// tunnelMTU derives the TUN MTU at start from the uplinks: the smallest interface MTU less the
// outer IP and UDP headers and the tunnel's own overhead. Path MTU discovery lowers it later if
// a path carries less.
func tunnelMTU(cfg *config.Tunnel) int {
	if cfg.MTU != 0 {
		return cfg.MTU
	}
	mtu := 0
	for _, u := range cfg.Uplinks {
		link := linkMTU(u)
		outer := 20 + 8
		if u.Address.Is6() {
			outer = 40 + 8
		}
		if m := link - outer - tunnel.Overhead; mtu == 0 || m < mtu {
			mtu = m
		}
	}
	return max(mtu, 1280)
}

// serveTunnel builds the tunnel from cfg in this process's network namespace and runs it until
// ctx ends.
func serveTunnel(ctx context.Context, cfg *config.Tunnel, log *slog.Logger) error {
	if cfg.Mode == config.ModeMPT && len(cfg.Peers) != 1 {
		return fmt.Errorf("mode mpt carries one connection: the site file has %d peers (run one braid tunnel per MPT connection, each with its own interface)", len(cfg.Peers))
	}
	tunnelStartWarnings(log, cfg)
	mtu := tunnelMTU(cfg)
	// braid mode moves packets in batches (TUN offloads, UDP segmentation and coalescing);
	// mpt mode reads and writes one packet at a time.
	open := tun.OpenOffload
	if cfg.Mode == config.ModeMPT {
		open = tun.Open
	}
	dev, err := open(cfg.Interface)
	if err != nil {
		return err
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		dev.Close()
		return fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()
	var uplinks []tunnel.Uplink
	closeAll := func() {
		dev.Close()
		for _, u := range uplinks {
			if u.Conn != nil {
				u.Conn.Close()
			}
		}
	}
	if err := tun.Configure(nl, cfg.Interface, mtu, cfg.Addresses); err != nil {
		closeAll()
		return err
	}
	byName := map[string]config.Uplink{}
	socks := map[string]uplinkSock{}
	for _, u := range cfg.Uplinks {
		byName[u.Name] = u
		if u.Follows() {
			// Bound by the follower (below) to the interface's address, when it has one.
			uplinks = append(uplinks, uplinkOf(u, cfg.Port, nil, linkMTU(u)))
			socks[u.Name] = uplinkSock{local: u.Socket(cfg.Port), iface: u.Interface, mtu: linkMTU(u), config: u}
			continue
		}
		var c tunnel.Conn
		var err error
		if cfg.Mode == config.ModeMPT {
			c, err = sock.Listen(u.Socket(cfg.Port), u.Interface)
		} else {
			c, err = listenUplink(u, cfg.Port, shards(cfg))
		}
		if err != nil {
			closeAll()
			return fmt.Errorf("uplink %s: %w", u.Name, err)
		}
		uplinks = append(uplinks, uplinkOf(u, cfg.Port, c, linkMTU(u)))
		socks[u.Name] = uplinkSock{local: u.Socket(cfg.Port), iface: u.Interface, conn: c, mtu: linkMTU(u), config: u}
	}
	for _, p := range cfg.Peers {
		for _, r := range p.Routes {
			if err := tun.AddRoute(nl, cfg.Interface, r); err != nil {
				closeAll()
				return err
			}
		}
	}
	// How many threads run the tunnel's Go code: one while a core suffices, by default.
	threads := gothreads.New(cfg.Threads, log)
	go threads.Run(ctx)
	var (
		run    func(context.Context) error
		src    metrics.Source
		mutate func(pathRequest) error
	)
	if cfg.Mode == config.ModeMPT {
		o := mptOptions(cfg, dev, mtu, uplinks, byName, log)
		if port := cfg.Peers[0].MPT.CmdPort; port != 0 {
			c, err := listenMPTCommand(port)
			if err != nil {
				closeAll()
				return err
			}
			o.Command = c
		}
		t, err := tunnel.NewMPT(o)
		if err != nil {
			if o.Command != nil {
				o.Command.Close()
			}
			closeAll()
			return err
		}
		run, src = t.Run, mptSource{t, threads}
		onHangup(ctx, func(string) {
			log.Warn("SIGHUP: mode mpt does not reload yet; still running with the site file it started with (restart to apply a change)")
		})
		mutate = func(r pathRequest) error {
			if r.Action == "reload" {
				return errors.New("mode mpt: reload is not supported yet: restart the tunnel to apply a changed site file")
			}
			return applyMPTPath(t, cfg.Peers[0].Name, r)
		}
	} else {
		o := braidOptions(cfg, dev, mtu, uplinks, byName, log)
		if cfg.MTU == 0 { // derived: path MTU discovery may lower it
			o.SetMTU = func(m int) error { return tun.SetMTU(nl, cfg.Interface, m) }
		}
		t, err := tunnel.New(o)
		if err != nil {
			closeAll()
			return err
		}
		run, src = t.Run, tunnelSource{t, threads}
		// The uplinks named by interface alone follow it, also those a reload adds.
		stop, err := followUplinks(ctx, t, shards(cfg), log)
		if err != nil {
			closeAll()
			return err
		}
		defer stop()
		rl := &tunnelReloader{t: t, threads: threads, nl: nl, log: log, load: loadTunnelConfig, listen: func(u config.Uplink, port uint16) (tunnel.Conn, error) {
			return listenUplink(u, port, shards(cfg))
		}, cfg: cfg, conns: socks}
		file := daemonFile(ctx)
		mutate = func(r pathRequest) error {
			if r.Action == "reload" {
				what, err := rl.reload(file)
				if err != nil {
					return err
				}
				return controlDone(file + ": " + what)
			}
			return applyPath(t, r)
		}
		onHangup(ctx, func(file string) {
			log.Info("SIGHUP: reloading", "file", file)
			rl.reload(file) // logged either way
		})
	}
	if cfg.Metrics.IsValid() {
		srv, err := metrics.Listen(cfg.Metrics.String(), src)
		if err != nil {
			closeAll()
			return err
		}
		defer srv.Close()
		log.Info("status and metrics", "addr", srv.Addr(), "page", srv.PageURL())
	}
	if cfg.Control != "" {
		stop, err := serveControl(ctx, cfg.Control, mutate, src.StatusJSON)
		if err != nil {
			closeAll()
			return err
		}
		defer stop()
	}
	return run(ctx)
}

// uplinkOf is the tunnel's uplink of u, with socket c (nil for one that follows its
// interface's address: the follower binds it).
func uplinkOf(u config.Uplink, port uint16, c tunnel.Conn, mtu int) tunnel.Uplink {
	up := tunnel.Uplink{Name: u.Name, Conn: c, MTU: mtu, Capacity: u.Capacity, Interface: u.Interface}
	if u.Follows() {
		up.Follow, up.Port = true, u.Socket(port).Port()
	} else {
		up.Local = u.Socket(port)
	}
	return up
}

// followUplinks runs the tunnel's follower of the uplinks named by interface alone
// (tunnel.FollowUplinks) until ctx ends or stop is called; stop waits for it.
func followUplinks(ctx context.Context, t *tunnel.Tunnel, n int, log *slog.Logger) (stop func(), err error) {
	nl, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := t.FollowUplinks(ctx, tunnel.FollowOptions{Netlink: nl, Listen: func(local netip.AddrPort, ifname string) (tunnel.Conn, error) {
			return listenGroup(local, ifname, n)
		}})
		if err != nil {
			log.Error("uplinks: not following their interfaces", "err", err)
		}
	}()
	return func() {
		cancel()
		<-done
		nl.Close()
	}, nil
}

// cipherSet is the set of transport ciphers the site file allows: one, or "" for those this
// machine runs fast.
func cipherSet(name string) session.Ciphers {
	if c, err := session.ParseCipher(name); err == nil {
		return session.Only(c)
	}
	return session.Fast()
}

func braidOptions(cfg *config.Tunnel, dev tunnel.Device, mtu int, uplinks []tunnel.Uplink, byName map[string]config.Uplink, log *slog.Logger) tunnel.Options {
	o := tunnel.Options{
		PrivateKey: cfg.Braid.PrivateKey, Device: dev, MTU: mtu, Logger: log, Uplinks: uplinks,
		Path:    path.Config{ProbeInterval: cfg.Braid.ProbeInterval, DownAfter: cfg.Braid.DownAfter},
		Reorder: cfg.Braid.Reorder.Enabled, Recovery: cfg.Braid.LossRecovery, SparseFlows: cfg.Braid.SparseFlows, Cleartext: !cfg.Braid.Encryption,
		Ciphers: cipherSet(cfg.Braid.Cipher),
		ReorderCfg: reorder.Config{MaxPackets: cfg.Braid.Reorder.MaxPackets, MaxBytes: cfg.Braid.Reorder.MaxBytes,
			MaxHold: cfg.Braid.Reorder.MaxHold},
		Scheduler: string(cfg.Scheduler), Shards: shards(cfg),
	}
	for _, p := range cfg.Peers {
		pc := tunnel.PeerConfig{Name: p.Name, PublicKey: p.PublicKey, Routes: p.Routes, Keepalive: p.Keepalive, MaxPaths: p.MaxPaths}
		for _, pp := range p.Paths {
			u := byName[pp.Uplink]
			w := pp.Weight
			if w == 0 {
				w = u.Weight
			}
			pc.Paths = append(pc.Paths, tunnel.PathConfig{Uplink: pp.Uplink, Remote: pp.Remote, Weight: float64(w), Capacity: u.Capacity})
		}
		o.Peers = append(o.Peers, pc)
	}
	return o
}

func mptOptions(cfg *config.Tunnel, dev tunnel.Device, mtu int, uplinks []tunnel.Uplink, byName map[string]config.Uplink, log *slog.Logger) tunnel.MPTOptions {
	p := cfg.Peers[0]
	ipv := 4
	if p.MPT.RemoteTunnelIP.Is6() {
		ipv = 6
	}
	o := tunnel.MPTOptions{
		Device: dev, MTU: mtu, Uplinks: uplinks, Logger: log, IPVersion: ipv, Routes: p.Routes,
		ReorderWindow: p.MPT.ReorderWindow, MaxBuffDelay: p.MPT.MaxBuffDelay,
		Keepalive: p.MPT.Keepalive, DeadTime: p.MPT.DeadTime,
		LocalTunnelIP: p.MPT.LocalTunnelIP, RemoteTunnelIP: p.MPT.RemoteTunnelIP,
	}
	for _, pp := range p.Paths {
		w := pp.Weight
		if w == 0 {
			w = byName[pp.Uplink].Weight
		}
		u := byName[pp.Uplink]
		o.Paths = append(o.Paths, tunnel.MPTPath{Uplink: pp.Uplink, Remote: pp.Remote, Weight: w, Local: u.Address, Interface: u.Interface})
	}
	if p.MPT.CmdPort != 0 {
		o.RemoteCmdPort = p.MPT.RemoteCmdPort
		if o.RemoteCmdPort == 0 {
			o.RemoteCmdPort = config.DefaultMPTCmdPort
		}
		o.AuthType, o.AuthKey = uint8(p.MPT.AuthType), []byte(p.MPT.AuthKey)
	}
	return o
}

// mptCmdConn is the socket of MPT's command port: IPv4 and IPv6, on every address.
type mptCmdConn struct{ *net.UDPConn }

func (c mptCmdConn) Send(b []byte, dst netip.AddrPort) error {
	_, err := c.WriteToUDPAddrPort(b, dst)
	return err
}

func listenMPTCommand(port uint16) (tunnel.Conn, error) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{Port: int(port)})
	if err != nil {
		return nil, fmt.Errorf("mpt command port: %w", err)
	}
	return mptCmdConn{c}, nil
}

// applyMPTPath is 'braid tunnel path up|down' in mode mpt: MPT's "path up|down", told to the
// peer through the status exchange when there is a command port.
func applyMPTPath(t *tunnel.MPTTunnel, peer string, r pathRequest) error {
	if r.Action != "up" && r.Action != "down" {
		return fmt.Errorf("mode mpt: action %q: only up and down (weights are MPT's weight_out, in the site file)", r.Action)
	}
	if r.Peer != peer || !t.SetAdminDown(r.Path, r.Action == "down") {
		return fmt.Errorf("no path %d to a peer %q", r.Path, r.Peer)
	}
	return nil
}

// tunnelSource exposes a tunnel's status and metrics.
type tunnelSource struct {
	t       *tunnel.Tunnel
	threads *gothreads.Controller
}

func (s tunnelSource) StatusJSON() any {
	return statusReport{Role: "tunnel", Tunnel: ptr(s.t.Status()), Threads: ptr(s.threads.Status())}
}

func ptr[T any](v T) *T { return &v }

func (s tunnelSource) WriteMetrics(w *metrics.Writer) {
	writeThreadMetrics(w, s.threads)
	st := s.t.Status()
	for _, k := range metrics.SortedKeys(st.Counters) {
		w.Sample("braid_tunnel_"+k+"_total", metrics.Counter, "Tunnel counter "+k+".", float64(st.Counters[k]))
	}
	w.Sample("braid_tunnel_mtu_bytes", metrics.Gauge, "The tunnel MTU: the largest inner packet.", float64(st.MTU))
	type peerMetric struct {
		name, help string
		kind       metrics.Kind
		value      func(tunnel.PeerStatus) (float64, bool)
	}
	for _, m := range []peerMetric{
		{"braid_tunnel_peer_send_queue_bytes", "Bytes (on the wire) waiting in the peer's send queue for a path.", metrics.Gauge,
			func(p tunnel.PeerStatus) (float64, bool) { return float64(p.SendQueueBytes), true }},
		{"braid_tunnel_peer_send_queue_packets", "Packets waiting in the peer's send queue for a path.", metrics.Gauge,
			func(p tunnel.PeerStatus) (float64, bool) { return float64(p.SendQueuePackets), true }},
		{"braid_tunnel_peer_send_queue_drops_total", "Packets to the peer dropped because its send queue was full while another peer's was not.", metrics.Counter,
			func(p tunnel.PeerStatus) (float64, bool) { return float64(p.SendQueueDrops), true }},
		{"braid_tunnel_peer_reorder_hold_seconds", "How long the peer's reorder buffer holds a packet behind a gap now.", metrics.Gauge,
			func(p tunnel.PeerStatus) (float64, bool) { return p.ReorderHold.Seconds(), p.Reorder != nil }},
		{"braid_tunnel_peer_reorder_lost_total", "Gaps the peer's reorder buffer gave up on: losses the inner flows saw.", metrics.Counter,
			func(p tunnel.PeerStatus) (float64, bool) {
				return reorderStat(p, func(r *reorder.Stats) uint64 { return r.Lost })
			}},
		{"braid_tunnel_peer_reorder_waited_total", "Gaps the peer's reorder buffer held past its hold because a path that was still delivering might bring them.", metrics.Counter,
			func(p tunnel.PeerStatus) (float64, bool) {
				return reorderStat(p, func(r *reorder.Stats) uint64 { return r.Waited })
			}},
		{"braid_tunnel_peer_reorder_rescued_total", "Gaps the peer's reorder buffer held past its hold for a resend it asked the peer for (gap nacks).", metrics.Counter,
			func(p tunnel.PeerStatus) (float64, bool) {
				return reorderStat(p, func(r *reorder.Stats) uint64 { return r.Rescued })
			}},
		{"braid_tunnel_peer_reorder_refilled_total", "Gaps held for a resend (braid_tunnel_peer_reorder_rescued_total) that a packet filled in time.", metrics.Counter,
			func(p tunnel.PeerStatus) (float64, bool) {
				return reorderStat(p, func(r *reorder.Stats) uint64 { return r.Refilled })
			}},
		{"braid_tunnel_peer_reorder_late_total", "Packets that came after the reorder buffer had given up on them (delivered).", metrics.Counter,
			func(p tunnel.PeerStatus) (float64, bool) {
				return reorderStat(p, func(r *reorder.Stats) uint64 { return r.Late })
			}},
		{"braid_tunnel_peer_reorder_placed_total", "Packets of sparse flows delivered at once, ahead of other flows' gaps (sparse_flows).", metrics.Counter,
			func(p tunnel.PeerStatus) (float64, bool) {
				return reorderStat(p, func(r *reorder.Stats) uint64 { return r.Placed })
			}},
	} {
		for _, ps := range st.Peers {
			if v, ok := m.value(ps); ok {
				w.Sample(m.name, m.kind, m.help, v, "peer", ps.Name)
			}
		}
	}
	type pathMetric struct {
		name, help string
		kind       metrics.Kind
		value      func(tunnel.PathStatus) float64
	}
	for _, m := range []pathMetric{
		{"braid_tunnel_path_up", "Whether the path is up (1) or not (0).", metrics.Gauge, func(p tunnel.PathStatus) float64 { return b2f(p.State == "up") }},
		{"braid_tunnel_path_demoted", "Whether the scheduler (rbpm) has demoted the path (1): it would block the receive buffer.", metrics.Gauge, func(p tunnel.PathStatus) float64 { return b2f(p.Sched == "demoted") }},
		{"braid_tunnel_path_rtt_seconds", "Smoothed round-trip time of the path.", metrics.Gauge, func(p tunnel.PathStatus) float64 { return p.RTT.Seconds() }},
		{"braid_tunnel_path_loss_ratio", "Probe loss of the path, 0 to 1.", metrics.Gauge, func(p tunnel.PathStatus) float64 { return p.Loss }},
		{"braid_tunnel_path_rate_bits_per_second", "Delivery rate measured by the peer; 0 while the path is down or unmeasured.", metrics.Gauge, func(p tunnel.PathStatus) float64 { return p.Rate }},
		{"braid_tunnel_path_capacity_bits_per_second", "Capacity the path is scheduled for: configured, measured, or the estimator's start-up guess (see braid_tunnel_path_capacity_measured).", metrics.Gauge, func(p tunnel.PathStatus) float64 { return p.Capacity }},
		{"braid_tunnel_path_capacity_measured", "Whether the path's capacity is configured or measured (1), or only the estimator's start-up guess (0).", metrics.Gauge, func(p tunnel.PathStatus) float64 { return b2f(p.CapacityMeasured) }},
		{"braid_tunnel_path_mtu_bytes", "Path MTU found by probing (outer packet size).", metrics.Gauge, func(p tunnel.PathStatus) float64 { return float64(p.MTU) }},
		{"braid_tunnel_path_tx_bytes_total", "Bytes sent on the path.", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.TxBytes) }},
		{"braid_tunnel_path_tx_packets_total", "Packets sent on the path.", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.TxPackets) }},
		{"braid_tunnel_path_tx_drops_total", "Packets not sent: the path's socket buffer was full.", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.TxDrops) }},
		{"braid_tunnel_path_rx_bytes_total", "Bytes received on the path.", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.RxBytes) }},
		{"braid_tunnel_path_rx_packets_total", "Packets received on the path.", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.RxPackets) }},
		{"braid_tunnel_path_tx_data_bytes_total", "Bytes of data packets sent on the path (no probes or control messages).", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.TxDataBytes) }},
		{"braid_tunnel_path_tx_data_packets_total", "Data packets sent on the path (no probes or control messages).", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.TxDataPackets) }},
		{"braid_tunnel_path_rx_data_bytes_total", "Bytes of data packets received on the path.", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.RxDataBytes) }},
		{"braid_tunnel_path_rx_data_packets_total", "Data packets received on the path.", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.RxDataPackets) }},
		{"braid_tunnel_path_moves_total", "Times the peer's authenticated packets moved the path to a new address (NAT rebinding).", metrics.Counter, func(p tunnel.PathStatus) float64 { return float64(p.Moves) }},
	} {
		for _, ps := range st.Peers {
			for _, p := range ps.Paths {
				// No remote label: a path keeps its series when the peer's address moves;
				// braid_tunnel_path_info carries the addresses.
				w.Sample(m.name, m.kind, m.help, m.value(p), "peer", ps.Name, "path", strconv.Itoa(p.ID), "uplink", p.Uplink)
			}
		}
	}
	for _, ps := range st.Peers {
		for _, p := range ps.Paths {
			w.Sample("braid_tunnel_path_info", metrics.Gauge, "Always 1: the path's local and remote address now and how it was found (configured or learned).",
				1, "peer", ps.Name, "path", strconv.Itoa(p.ID), "uplink", p.Uplink, "local", p.Local, "remote", p.Remote, "origin", p.Origin, "how", p.How)
		}
	}
}

// reorderStat is one counter of a peer's reorder buffer; ok is false when it has none.
func reorderStat(p tunnel.PeerStatus, f func(*reorder.Stats) uint64) (float64, bool) {
	if p.Reorder == nil {
		return 0, false
	}
	return float64(f(p.Reorder)), true
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// statusReport is what /status returns: the role and its status.
type statusReport struct {
	Role    string            `json:"role"`
	Tunnel  *tunnel.Status    `json:"tunnel,omitempty"`
	MPT     *tunnel.MPTStatus `json:"mpt,omitempty"`
	Threads *gothreads.Status `json:"threads,omitempty"`
}

// writeThreadMetrics writes the Go thread controller's gauges.
func writeThreadMetrics(w *metrics.Writer, c *gothreads.Controller) {
	st := c.Status()
	w.Sample("braid_tunnel_go_threads", metrics.Gauge, "Threads running the tunnel's Go code at once (GOMAXPROCS; the site file's threads).", float64(st.Threads))
	w.Sample("braid_tunnel_go_threads_changes_total", metrics.Counter, "Times threads = 0 (auto) changed the count.", float64(st.Changes))
	w.Sample("braid_tunnel_cpu_busy_cores", metrics.Gauge, "Cores the tunnel process used over the last half second.", st.Busy)
}

// mptSource exposes an mpt-mode tunnel's status and metrics.
type mptSource struct {
	t       *tunnel.MPTTunnel
	threads *gothreads.Controller
}

func (s mptSource) StatusJSON() any {
	return statusReport{Role: "tunnel", MPT: ptr(s.t.Status()), Threads: ptr(s.threads.Status())}
}

func (s mptSource) WriteMetrics(w *metrics.Writer) {
	writeThreadMetrics(w, s.threads)
	st := s.t.Status()
	for _, k := range metrics.SortedKeys(st.Counters) {
		w.Sample("braid_tunnel_mpt_"+k+"_total", metrics.Counter, "MPT-mode tunnel counter "+k+".", float64(st.Counters[k]))
	}
	for _, p := range st.Paths {
		w.Sample("braid_tunnel_mpt_path_up", metrics.Gauge, "Whether the path is up (1) or not (0).", b2f(p.State == "up"), "path", strconv.Itoa(p.ID), "uplink", p.Uplink, "remote", p.Remote)
	}
}

// pathRequest is one request on the tunnel's control socket.
type pathRequest struct {
	Action string  `json:"action"` // up, down, weight, reload
	Peer   string  `json:"peer"`
	Path   int     `json:"path"`
	Weight float64 `json:"weight,omitempty"`
}

func applyPath(t *tunnel.Tunnel, r pathRequest) error {
	var ok bool
	switch r.Action {
	case "up", "down":
		ok = t.SetAdminDown(r.Peer, r.Path, r.Action == "down")
	case "weight":
		if r.Weight < 0 {
			return fmt.Errorf("weight %g is negative", r.Weight)
		}
		ok = t.SetWeight(r.Peer, r.Path, r.Weight)
	default:
		return fmt.Errorf("action %q is not up, down or weight", r.Action)
	}
	if !ok {
		return fmt.Errorf("no path %d to a peer %q", r.Path, r.Peer)
	}
	return nil
}

func tunnelPath(e env, args []string) int {
	fs := newFlags(e, "braid tunnel path", tunnelDoc)
	control := fs.String("control", config.TunnelDefaults().Control, "the tunnel's control `SOCKET`")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	var req pathRequest
	switch {
	case len(pos) == 3 && (pos[0] == "up" || pos[0] == "down"):
	case len(pos) == 4 && pos[0] == "weight":
		w, err := strconv.ParseFloat(pos[3], 64)
		if err != nil || w < 0 {
			fmt.Fprintf(e.stderr, "braid tunnel path weight: %q is not a weight (0 or more; 0 = from measured capacity)\n", pos[3])
			return exitUsage
		}
		req.Weight = w
	default:
		fmt.Fprintln(e.stderr, "braid tunnel path: expected up|down PEER PATH, or weight PEER PATH WEIGHT")
		return exitUsage
	}
	n, err := strconv.Atoi(pos[2])
	if err != nil || n < 1 {
		fmt.Fprintf(e.stderr, "braid tunnel path: path %q is not a path number (1, 2, ...)\n", pos[2])
		return exitUsage
	}
	req.Action, req.Peer, req.Path = pos[0], pos[1], n
	if _, err := callControl(*control, req); err != nil {
		if errors.Is(err, errNotRunning) {
			fmt.Fprintf(e.stderr, "braid tunnel path: is the tunnel running? %v\n", err)
		} else {
			fmt.Fprintf(e.stderr, "braid tunnel path: %v\n", err)
		}
		return exitError
	}
	fmt.Fprintf(e.stdout, "peer %s path %d: %s done\n", req.Peer, req.Path, req.Action)
	return exitOK
}

// tunnelReload is 'braid tunnel reload': the running tunnel re-reads its site file.
func tunnelReload(e env, args []string) int {
	fs := newFlags(e, "braid tunnel reload", tunnelDoc)
	control := fs.String("control", config.TunnelDefaults().Control, "the tunnel's control `SOCKET`")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "braid tunnel reload: no arguments expected (the tunnel re-reads the site file it started with)")
		return exitUsage
	}
	rep, err := callControl(*control, pathRequest{Action: "reload"})
	if err != nil {
		if errors.Is(err, errNotRunning) {
			fmt.Fprintf(e.stderr, "braid tunnel reload: is the tunnel running? %v\n", err)
		} else {
			fmt.Fprintf(e.stderr, "braid tunnel reload: %v\n", err)
		}
		return exitError
	}
	fmt.Fprintf(e.stdout, "reloaded %s\n", rep.Message)
	return exitOK
}
