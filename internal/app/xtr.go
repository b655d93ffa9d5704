package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"braid/internal/config"
	"braid/internal/lisp/xtr"
	"braid/internal/metrics"
	"braid/internal/tun"
	"braid/internal/wire/lisp"

	"github.com/vishvananda/netlink"
)

func init() {
	commands["xtr"] = command{summary: "LISP tunnel router (ITR/ETR) on a TUN device, with A-MPTCP placement", run: runXTR}
}

const xtrDoc = `Usage: braid xtr --config FILE [--log-format text|json] [--verbose]
       braid xtr check --config FILE
       braid xtr show [--metrics HOST:PORT] [--json]
       braid xtr reload [--control SOCKET]

braid xtr is a LISP tunnel router (RFC 9300, RFC 9301). As an ITR it reads the packets routed
into its TUN device (the 'routes' of its configuration, typically the EID space of the other
sites), looks their destination up in its map-cache, resolves misses with Map-Requests to the
map-resolvers (holding a few packets meanwhile, retrying on timeouts, caching negative answers
for their TTL) and encapsulates them on UDP port 4341 from one of the site's RLOCs to one of
the destination's, with a random nonce and an outer source port derived from the inner flow so
that the underlay spreads flows. As an ETR it decapsulates what arrives for the site's EIDs,
registers the EID prefixes with the map servers every register_interval (authenticated), and
answers Map-Requests and RLOC-probes.

Locators are chosen as RFC 9300 says: the lowest priority (255 = never), then in proportion to
the weights, per flow. Every RLOC pair in use is probed each probe_interval; a pair that has
not answered for down_after is not used until it answers again. With placement = true (for
A-MPTCP), a TCP flow takes the RLOC pair (sport + dport) mod (number of pairs), both sites
listing their RLOCs in the same canonical order, so that both directions of a subflow use the
same pair and subflows with different residues use different pairs.

The site file's [xtr] section configures it (see docs/lisp.md); braid xtr needs the privilege
to create TUN devices (CAP_NET_ADMIN). 'show' prints the map-cache, the RLOC pairs and the
counters of a running xTR.

'reload' (or SIGHUP to the daemon) re-reads the site file the xTR started with and applies its
mapping: EID prefixes added or removed (the site registers the new mapping at once), the RLOCs'
priorities and weights, the map-resolvers, the map servers (one whose address and settings stay
keeps its registration state) and the routes into the device. The map-cache stays (but for
entries over a new EID prefix of the site), and so do the RLOC pairs and their probes: traffic
to unchanged sites goes on. A file with a mistake is refused with its file and line, as is a
change only a restart applies (interface, mtu, the RLOCs' addresses and interfaces, the timers,
placement, any_outer_source, metrics, control): then nothing changes and 'reload' exits 1. Each
change is logged on one line. It uses the 'control' socket (default @braid/xtr, an abstract
socket of the network namespace).

Example:
  braid xtr check --config /etc/braid/site.toml
  braid xtr --config /etc/braid/site.toml
  braid xtr show
  braid xtr reload
`

func runXTR(e env, args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "check":
			return xtrCheck(e, args[1:])
		case "show":
			return xtrShow(e, args[1:])
		case "reload":
			return runReloadCommand(e, "xtr", xtrDoc, config.XTRDefaults().Control, args[1:])
		}
	}
	return runDaemon(e, "xtr", xtrDoc, args, loadXTRConfig, serveXTR)
}

func loadXTRConfig(file string) (*config.XTR, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return config.LoadXTR(file, data, systemEnv{})
}

func xtrCheck(e env, args []string) int {
	return runCheck(e, args, "xtr", xtrDoc, loadXTRConfig, func(cfg *config.XTR) string {
		mode := "hash"
		if cfg.Placement {
			mode = "A-MPTCP placement"
		}
		return fmt.Sprintf("%d EID prefixes, %d RLOCs, %d map-resolvers, %d map servers, %s",
			len(cfg.EIDs), len(cfg.RLOCs), len(cfg.Resolvers), len(cfg.MapServers), mode)
	})
}

// xtrOptions converts the configuration (device and uplinks are added by the caller).
func xtrOptions(cfg *config.XTR, log *slog.Logger) xtr.Options {
	o := xtr.Options{EIDs: cfg.EIDs, Resolvers: cfg.Resolvers, RegisterInterval: cfg.RegisterInterval,
		RegisterTTL: cfg.RegisterTTL, RequestTimeout: cfg.RequestTimeout, RequestRetries: cfg.RequestRetries,
		ResolverTimeout: cfg.ResolverTimeout, ResolverBackoff: cfg.ResolverBackoff,
		ProbeInterval: cfg.ProbeInterval, DownAfter: cfg.DownAfter, Placement: cfg.Placement, AnyOuterSource: cfg.AnyOuterSource, Logger: log}
	m := xtrMapping(cfg)
	o.Locators, o.MapServers = m.Locators, m.MapServers
	return o
}

// xtrMapping is the part of cfg a reload applies.
func xtrMapping(cfg *config.XTR) xtr.Mapping {
	m := xtr.Mapping{EIDs: cfg.EIDs, Resolvers: cfg.Resolvers}
	for _, r := range cfg.RLOCs {
		m.Locators = append(m.Locators, xtr.Locator{Priority: r.Priority, Weight: r.Weight})
	}
	for _, ms := range cfg.MapServers {
		alg := uint8(lisp.AlgHMACSHA1)
		if ms.Algorithm == "hmac-sha256" {
			alg = lisp.AlgHMACSHA256
		}
		m.MapServers = append(m.MapServers, xtr.MapServer{Addr: ms.Address, Key: []byte(ms.Key), KeyID: ms.KeyID, AlgID: alg,
			AuthLen: ms.AuthLength, ProxyReply: ms.ProxyReply})
	}
	return m
}

// reloadXTR applies next to the xTR x, which runs cur: the mapping, then the routes into the
// device (nl: a netlink handle of the xTR's namespace).
func reloadXTR(x *xtr.XTR, nl *netlink.Handle, cur, next *config.XTR, log *slog.Logger) ([]string, error) {
	var rc restartCheck
	rc.check("interface", cur.Interface, next.Interface)
	rc.check("mtu", cur.MTU, next.MTU)
	type rloc struct {
		Address   netip.Addr
		Interface string
	}
	rlocs := func(c *config.XTR) []rloc {
		var out []rloc
		for _, r := range c.RLOCs {
			out = append(out, rloc{r.Address, r.Interface})
		}
		return out
	}
	rc.check("rloc addresses or interfaces", rlocs(cur), rlocs(next))
	rc.check("probe_interval", cur.ProbeInterval, next.ProbeInterval)
	rc.check("down_after", cur.DownAfter, next.DownAfter)
	rc.check("register_interval", cur.RegisterInterval, next.RegisterInterval)
	rc.check("register_ttl", cur.RegisterTTL, next.RegisterTTL)
	rc.check("request_timeout", cur.RequestTimeout, next.RequestTimeout)
	rc.check("request_retries", cur.RequestRetries, next.RequestRetries)
	rc.check("placement", cur.Placement, next.Placement)
	rc.check("any_outer_source", cur.AnyOuterSource, next.AnyOuterSource)
	rc.check("metrics", cur.Metrics, next.Metrics)
	rc.check("control", cur.Control, next.Control)
	if err := rc.err(); err != nil {
		return nil, err
	}
	changes, err := x.SetMapping(xtrMapping(next))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range changes {
		out = append(out, c.What+" "+c.Detail)
	}
	// Routes: the new ones first, then those the file no longer has.
	var routeErrs []error
	for _, p := range next.Routes {
		if !slices.Contains(cur.Routes, p) {
			if err := tun.AddRoute(nl, next.Interface, p); err != nil {
				routeErrs = append(routeErrs, err)
				continue
			}
			out = append(out, "route added "+p.String())
			log.Info("reload: route added", "detail", p.String())
		}
	}
	for _, p := range cur.Routes {
		if !slices.Contains(next.Routes, p) {
			if err := tun.DelRoute(nl, next.Interface, p); err != nil {
				routeErrs = append(routeErrs, err)
				continue
			}
			out = append(out, "route removed "+p.String())
			log.Info("reload: route removed", "detail", p.String())
		}
	}
	if err := errors.Join(routeErrs...); err != nil {
		// The mapping is applied: the reload is not refused, but it says what lags.
		log.Error("reloaded, but the routes into the device did not all follow", "err", err)
		out = append(out, "routes did not all follow: "+err.Error())
	}
	return out, nil
}

// xtrMTU is the configured MTU, or 1500 less the outer headers of the widest RLOC family.
func xtrMTU(cfg *config.XTR) int {
	if cfg.MTU != 0 {
		return cfg.MTU
	}
	mtu := 1500 - lisp.IPv4UDPLen - lisp.DataHeaderLen
	for _, r := range cfg.RLOCs {
		if r.Address.Is6() {
			mtu = 1500 - lisp.IPv6UDPLen - lisp.DataHeaderLen
		}
	}
	return mtu
}

// serveXTR builds the xTR of cfg in this process's network namespace and runs it until ctx
// ends.
func serveXTR(ctx context.Context, cfg *config.XTR, log *slog.Logger) error {
	warnExposure(log, cfg.Metrics, cfg.KeyFiles...)
	o := xtrOptions(cfg, log)
	o.MTU = xtrMTU(cfg)
	closeAll := func() {
		for _, u := range o.Uplinks {
			u.Close()
		}
		if o.Device != nil {
			o.Device.Close()
		}
	}
	for _, r := range cfg.RLOCs {
		u, err := xtr.OpenUplink(r.Address, r.Interface)
		if err != nil {
			closeAll()
			return err
		}
		o.Uplinks = append(o.Uplinks, u)
	}
	dev, err := tun.OpenOffload(cfg.Interface)
	if err != nil {
		closeAll()
		return err
	}
	o.Device = dev
	nl, err := netlink.NewHandle()
	if err != nil {
		closeAll()
		return fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()
	if err := tun.Configure(nl, cfg.Interface, o.MTU, nil); err != nil {
		closeAll()
		return err
	}
	for _, p := range cfg.Routes {
		if err := tun.AddRoute(nl, cfg.Interface, p); err != nil {
			closeAll()
			return err
		}
	}
	x, err := xtr.New(o)
	if err != nil {
		closeAll()
		return err
	}
	if cfg.Metrics != "" {
		srv, err := metrics.Listen(cfg.Metrics, xtrSource{x})
		if err != nil {
			closeAll()
			return err
		}
		defer srv.Close()
		log.Info("status and metrics", "addr", srv.Addr(), "page", srv.PageURL())
	}
	rl := newRoleReloader(ctx, "xtr", log, func(file string) ([]string, error) {
		next, err := loadXTRConfig(file)
		if err != nil {
			return nil, configLines(err)
		}
		changes, err := reloadXTR(x, nl, cfg, next, log)
		if err == nil {
			cfg = next
		}
		return changes, err
	})
	if cfg.Control != "" {
		stop, err := serveReloadControl(ctx, cfg.Control, rl, xtrSource{x}.StatusJSON)
		if err != nil {
			closeAll()
			return err
		}
		defer stop()
	}
	log.Info("xtr up", "interface", cfg.Interface, "mtu", o.MTU, "eids", cfg.EIDs, "rlocs", len(cfg.RLOCs), "placement", cfg.Placement)
	return x.Run(ctx)
}

// xtrStatus is what the xTR's /status returns.
type xtrStatus struct {
	Role string     `json:"role"`
	XTR  xtr.Status `json:"xtr"`
}

type xtrSource struct{ x *xtr.XTR }

func (s xtrSource) StatusJSON() any { return xtrStatus{Role: "xtr", XTR: s.x.Status()} }

func (s xtrSource) WriteMetrics(w *metrics.Writer) {
	st := s.x.Status()
	for _, k := range metrics.SortedKeys(st.Counters) {
		w.Sample("braid_xtr_"+k+"_total", metrics.Counter, "xTR counter "+k+".", float64(st.Counters[k]))
	}
	w.Sample("braid_xtr_map_cache_entries", metrics.Gauge, "Entries in the map-cache.", float64(len(st.Cache)))
	for _, p := range st.Pairs {
		l := []string{"local", p.Local.String(), "remote", p.Remote.String()}
		w.Sample("braid_xtr_pair_up", metrics.Gauge, "Whether the RLOC pair answers probes.", b2f(p.Up), l...)
	}
	for _, p := range st.Pairs {
		l := []string{"local", p.Local.String(), "remote", p.Remote.String()}
		w.Sample("braid_xtr_pair_rtt_seconds", metrics.Gauge, "Last probe round trip of the RLOC pair.", p.RTT.Seconds(), l...)
	}
	for _, p := range st.Pairs {
		l := []string{"local", p.Local.String(), "remote", p.Remote.String()}
		w.Sample("braid_xtr_pair_tx_packets_total", metrics.Counter, "Packets encapsulated on the RLOC pair.", float64(p.TxPackets), l...)
	}
	for _, p := range st.Pairs {
		l := []string{"local", p.Local.String(), "remote", p.Remote.String()}
		w.Sample("braid_xtr_pair_rx_packets_total", metrics.Counter, "Packets decapsulated from the RLOC pair.", float64(p.RxPackets), l...)
	}
}

func xtrShow(e env, args []string) int {
	return showStatus(e, args, "braid xtr show", xtrDoc, config.XTRDefaults().Metrics, "xtr", "an xTR",
		func(st *xtrStatus) string { return st.Role },
		func(w io.Writer, st *xtrStatus) { printXTR(w, st.XTR) })
}

func printXTR(w io.Writer, st xtr.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "EID PREFIX\tMAPPING\tTTL\tEXPIRES IN")
	for _, c := range st.Cache {
		var m string
		switch {
		case c.Pending:
			m = "resolving"
		case c.Negative:
			m = "negative, " + c.Action
		default:
			var locs []string
			for _, l := range c.Locators {
				s := "down"
				if l.Up {
					s = "up"
				}
				locs = append(locs, fmt.Sprintf("%v %d/%d %s", l.Address, l.Priority, l.Weight, s))
			}
			m = strings.Join(locs, ", ")
		}
		fmt.Fprintf(tw, "%v\t%s\t%dm\t%v\n", c.Prefix, m, c.TTL, c.ExpiresIn.Round(time.Second))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCAL RLOC\tREMOTE RLOC\tSTATE\tRTT\tTX PACKETS\tRX PACKETS")
	for _, p := range st.Pairs {
		s := "down"
		if p.Up {
			s = "up"
		}
		fmt.Fprintf(tw, "%v\t%v\t%s\t%v\t%d\t%d\n", p.Local, p.Remote, s, p.RTT.Round(10*time.Microsecond), p.TxPackets, p.RxPackets)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, r := range st.Registrations {
		s := "not registered"
		if r.Registered {
			s = "registered, last Map-Notify " + r.LastNotify.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "map server %v: %s\n", r.MapServer, s)
	}
	for _, r := range st.Resolvers {
		s := "up"
		if !r.Up {
			s = fmt.Sprintf("down, %d requests unanswered in a row, asked again in %v", r.Misses, r.RetryIn.Round(time.Millisecond))
		}
		fmt.Fprintf(w, "map resolver %v: %s\n", r.Address, s)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "COUNTER\tVALUE")
	for _, k := range metrics.SortedKeys(st.Counters) {
		if st.Counters[k] != 0 || !strings.HasPrefix(k, "drop_") {
			fmt.Fprintf(tw, "%s\t%d\n", k, st.Counters[k])
		}
	}
	tw.Flush()
}
