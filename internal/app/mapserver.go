package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"braid/internal/config"
	"braid/internal/lisp/mapserver"
	"braid/internal/metrics"
)

func init() {
	commands["mapserver"] = command{summary: "LISP map-server and map-resolver: registrations, Map-Requests, negative replies", run: runMapserver}
}

const mapserverDoc = `Usage: braid mapserver --config FILE [--log-format text|json] [--verbose]
       braid mapserver check --config FILE
       braid mapserver show [--metrics HOST:PORT] [--json]
       braid mapserver reload [--control SOCKET]

braid mapserver is a LISP Map-Server and Map-Resolver (RFC 9301) in one process, or either
role alone. As a map-server it accepts Map-Registers from the ETRs of the sites in its
configuration, authenticated with each site's key (HMAC-SHA-1 or HMAC-SHA-256, full or
truncated digests, compared in constant time), for prefixes the site owns; it answers with a
Map-Notify when asked and drops registrations that are not refreshed. As a map-resolver it takes
Map-Requests encapsulated in ECMs from ITRs and answers from its own table (proxy reply, when
the site asked for it), forwards them to the registered ETR, or answers with a negative
Map-Reply: the widest prefix around the EID that no site holds (15 minutes), or the EID itself
for a site that is configured but not registered (1 minute). A map-resolver without the
map-server role forwards Map-Requests to the map servers in 'forward'.

Bad messages are dropped and counted by reason (drop_* in the metrics), never logged one by
one; a source sending more than rate_per_source messages per second is rate limited.

The site file's [mapserver] section configures it (see docs/lisp.md). 'show' prints the
registration table and counters of a running map server, read from its metrics address.

'reload' (or SIGHUP to the daemon) re-reads the site file the map server started with and
applies its sites: sites added, removed, or with new keys, prefixes, proxy_reply or replay. A
site that stays keeps its registrations (a changed one those of the prefixes it still owns,
and its replay state); a removed site's registrations are dropped at once. A file with a
mistake is refused with its file and line, as is a change only a restart applies (roles,
listen, forward, timers, TTLs, rate limits, metrics, control): then nothing changes and 'reload'
exits 1. Each change is logged on one line. It uses the 'control' socket (default
@braid/mapserver, an abstract socket of the network namespace).

Example:
  braid mapserver check --config /etc/braid/ms.toml
  braid mapserver --config /etc/braid/ms.toml
  braid mapserver show
  braid mapserver reload
  braid lig 192.168.2.1 --resolver 10.0.9.1
`

func runMapserver(e env, args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "check":
			return mapserverCheck(e, args[1:])
		case "show":
			return mapserverShow(e, args[1:])
		case "reload":
			return runReloadCommand(e, "mapserver", mapserverDoc, config.MapserverDefaults().Control, args[1:])
		}
	}
	return runDaemon(e, "mapserver", mapserverDoc, args, loadMapserverConfig,
		func(ctx context.Context, cfg *config.Mapserver, log *slog.Logger) error {
			ms, err := startMapserver(cfg, log)
			if err != nil {
				return err
			}
			return ms.run(ctx, cfg)
		})
}

func loadMapserverConfig(file string) (*config.Mapserver, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return config.LoadMapserver(file, data)
}

func mapserverCheck(e env, args []string) int {
	return runCheck(e, args, "mapserver", mapserverDoc, loadMapserverConfig, func(cfg *config.Mapserver) string {
		var roles []string
		if cfg.MapServer {
			roles = append(roles, "map-server")
		}
		if cfg.MapResolver {
			roles = append(roles, "map-resolver")
		}
		return fmt.Sprintf("%s on %v, %d sites", strings.Join(roles, " and "), cfg.Listen, len(cfg.Sites))
	})
}

// mapserverRun is a map server with its socket and metrics endpoint.
type mapserverRun struct {
	srv  *mapserver.Server
	conn *net.UDPConn
	web  *metrics.Server
	log  *slog.Logger
}

// startMapserver opens the socket and the metrics endpoint of cfg.
func startMapserver(cfg *config.Mapserver, log *slog.Logger) (*mapserverRun, error) {
	warnExposure(log, cfg.Metrics, cfg.KeyFiles...)
	mc := mapserver.Defaults()
	mc.MapServer, mc.MapResolver, mc.Forward = cfg.MapServer, cfg.MapResolver, cfg.Forward
	mc.RegistrationTimeout, mc.NegativeTTL, mc.UnregisteredTTL = cfg.RegistrationTimeout, cfg.NegativeTTL, cfg.UnregisteredTTL
	mc.RatePerSource, mc.BurstPerSource, mc.Logger = cfg.RatePerSource, cfg.BurstPerSource, log
	mc.RatePerDestination, mc.BurstPerDestination, mc.MaxAmplification = cfg.RatePerDestination, cfg.BurstPerDestination, cfg.MaxAmplification
	mc.Sites = mapserverSites(cfg, log)
	srv, err := mapserver.New(mc)
	if err != nil {
		return nil, err
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(cfg.Listen))
	if err != nil {
		return nil, fmt.Errorf("listen %v: %w", cfg.Listen, err)
	}
	conn.SetReadBuffer(8 << 20)
	r := &mapserverRun{srv: srv, conn: conn, log: log}
	if cfg.Metrics != "" {
		r.web, err = metrics.Listen(cfg.Metrics, mapserverSource{srv})
		if err != nil {
			conn.Close()
			return nil, err
		}
		log.Info("status and metrics", "addr", r.web.Addr(), "page", r.web.PageURL())
	}
	log.Info("map server up", "listen", conn.LocalAddr(), "sites", len(cfg.Sites), "map_server", cfg.MapServer, "map_resolver", cfg.MapResolver)
	return r, nil
}

// mapserverSites are the sites of cfg as the server takes them.
func mapserverSites(cfg *config.Mapserver, log *slog.Logger) []mapserver.Site {
	var sites []mapserver.Site
	for _, s := range cfg.Sites {
		sites = append(sites, mapserver.Site{Name: s.Name, Keys: map[uint8][]byte{s.KeyID: []byte(s.Key)}, Prefixes: s.Prefixes, ProxyReply: s.ProxyReply,
			TimestampNonces: s.Replay != "window"})
		if s.Replay == "window" {
			log.Warn("site takes registrations with any nonce (replay = \"window\"): a captured registration can be replayed after 10 minutes", "site", s.Name)
		}
	}
	return sites
}

// run serves cfg until ctx ends, with its control socket (reload, status).
func (r *mapserverRun) run(ctx context.Context, cfg *config.Mapserver) error {
	if r.web != nil {
		defer r.web.Close()
	}
	rl := newRoleReloader(ctx, "mapserver", r.log, func(file string) ([]string, error) {
		next, err := loadMapserverConfig(file)
		if err != nil {
			return nil, configLines(err)
		}
		changes, err := reloadMapserver(r.srv, cfg, next, r.log)
		if err == nil {
			cfg = next
		}
		return changes, err
	})
	if cfg.Control != "" {
		stop, err := serveReloadControl(ctx, cfg.Control, rl, mapserverSource{r.srv}.StatusJSON)
		if err != nil {
			r.conn.Close()
			return err
		}
		defer stop()
	}
	return r.srv.Serve(ctx, r.conn)
}

// reloadMapserver applies next's sites to srv, which runs cur; the other settings only a
// restart applies.
func reloadMapserver(srv *mapserver.Server, cur, next *config.Mapserver, log *slog.Logger) ([]string, error) {
	var rc restartCheck
	rc.check("roles", []bool{cur.MapServer, cur.MapResolver}, []bool{next.MapServer, next.MapResolver})
	rc.check("listen", cur.Listen, next.Listen)
	rc.check("forward", cur.Forward, next.Forward)
	rc.check("registration_timeout", cur.RegistrationTimeout, next.RegistrationTimeout)
	rc.check("negative_ttl", cur.NegativeTTL, next.NegativeTTL)
	rc.check("unregistered_ttl", cur.UnregisteredTTL, next.UnregisteredTTL)
	rc.check("rate limits", []float64{cur.RatePerSource, float64(cur.BurstPerSource), cur.RatePerDestination, float64(cur.BurstPerDestination), cur.MaxAmplification},
		[]float64{next.RatePerSource, float64(next.BurstPerSource), next.RatePerDestination, float64(next.BurstPerDestination), next.MaxAmplification})
	rc.check("metrics", cur.Metrics, next.Metrics)
	rc.check("control", cur.Control, next.Control)
	if err := rc.err(); err != nil {
		return nil, err
	}
	changes, err := srv.SetSites(mapserverSites(next, log))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range changes {
		s := c.What + " " + c.Site
		if len(c.Changed) > 0 {
			s += " (" + strings.Join(c.Changed, ", ") + ")"
		}
		if len(c.Dropped) > 0 {
			s += fmt.Sprintf(", registrations dropped %v", c.Dropped)
		}
		out = append(out, s)
	}
	return out, nil
}

// mapserverStatus is what the map server's /status returns.
type mapserverStatus struct {
	Role          string                   `json:"role"`
	Registrations []mapserver.Registration `json:"registrations"`
	Counters      map[string]uint64        `json:"counters"`
}

type mapserverSource struct{ s *mapserver.Server }

func (m mapserverSource) StatusJSON() any {
	return mapserverStatus{Role: "mapserver", Registrations: m.s.Registrations(time.Now()), Counters: m.s.Counters()}
}

func (m mapserverSource) WriteMetrics(w *metrics.Writer) {
	c := m.s.Counters()
	for _, k := range metrics.SortedKeys(c) {
		w.Sample("braid_mapserver_"+k+"_total", metrics.Counter, "Map server counter "+k+".", float64(c[k]))
	}
	w.Sample("braid_mapserver_registrations", metrics.Gauge, "Registered EID prefixes.", float64(len(m.s.Registrations(time.Now()))))
}

func getStatus(addr string, v any) error {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/status")
	if err != nil {
		return fmt.Errorf("is it running with metrics on %s? %w", addr, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	return nil
}

func mapserverShow(e env, args []string) int {
	return showStatus(e, args, "braid mapserver show", mapserverDoc, config.MapserverDefaults().Metrics, "mapserver", "a map server",
		func(st *mapserverStatus) string { return st.Role },
		func(w io.Writer, st *mapserverStatus) { printRegistrations(w, *st) })
}

func printRegistrations(w io.Writer, st mapserverStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SITE\tEID PREFIX\tETR\tLOCATORS (priority/weight)\tTTL\tEXPIRES IN\tPROXY")
	for _, r := range st.Registrations {
		var locs []string
		for _, l := range r.Locators {
			s := fmt.Sprintf("%v %d/%d", l.Address, l.Priority, l.Weight)
			if !l.Reachable {
				s += " unreachable"
			}
			locs = append(locs, s)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%dm\t%v\t%v\n", r.Site, r.Prefix, r.ETR, strings.Join(locs, ", "), r.TTL, r.ExpiresIn.Round(time.Second), r.ProxyReply)
	}
	if len(st.Registrations) == 0 {
		fmt.Fprintln(tw, "(no registrations)")
	}
	tw.Flush()
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
