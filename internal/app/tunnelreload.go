package app

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"

	"braid/internal/config"
	"braid/internal/gothreads"
	"braid/internal/sock"
	"braid/internal/tun"
	"braid/internal/tunnel"

	"github.com/vishvananda/netlink"
)

// tunnelReloader applies a changed site file to a running braid-mode tunnel ('braid tunnel
// reload', SIGHUP; docs/tunnel.md, "Reload"): it loads and checks the file, opens the sockets
// of new uplinks, hands the tunnel its new uplinks and peers, and routes the peers' prefixes
// into the TUN device. A file with a mistake, or with a change only a restart applies, is
// refused and nothing changes.
type tunnelReloader struct {
	t *tunnel.Tunnel
	// threads takes the file's threads (nil in tests that start no controller)
	threads *gothreads.Controller
	nl      *netlink.Handle
	log     *slog.Logger
	// load reads a site file (loadTunnelConfig; a test's own)
	load func(file string) (*config.Tunnel, error)
	// listen opens an uplink's socket (sock.Listen with GRO)
	listen func(u config.Uplink, port uint16) (tunnel.Conn, error)

	mu    sync.Mutex // one reload at a time; guards what follows
	cfg   *config.Tunnel
	conns map[string]uplinkSock // by uplink name
}

// uplinkSock is an uplink's socket and what it was opened for.
type uplinkSock struct {
	local  netip.AddrPort
	iface  string
	conn   tunnel.Conn
	mtu    int
	config config.Uplink
}

// errReloadRefused wraps every refusal.
var errReloadRefused = errors.New("reload refused, nothing changed")

// reload applies file and says what changed; the error says why nothing changed.
func (r *tunnelReloader) reload(file string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.cfg.Threads
	ch, err := r.reloadLocked(file)
	what := ch.String()
	if err == nil || errors.Is(err, errRoutesLag) {
		if cur := r.cfg.Threads; cur != old {
			t := fmt.Sprintf("threads %d", cur)
			if cur == 0 {
				t = "threads auto"
			}
			if ch.Empty() {
				what = t
			} else {
				what += "; " + t
			}
		}
	}
	switch {
	case errors.Is(err, errRoutesLag):
		r.log.Error("reloaded, but the kernel's routes into the tunnel did not all follow", "file", file, "change", what, "err", err)
		return what, fmt.Errorf("reloaded (%s), but: %w", what, err)
	case err != nil:
		r.log.Error("reload refused: nothing changed", "file", file, "err", err)
		return what, fmt.Errorf("%w: %s", errReloadRefused, err)
	}
	return what, nil
}

// errRoutesLag: the tunnel runs the new file, but a route into the TUN device could not be
// added or removed.
var errRoutesLag = errors.New("routes into the tunnel")

func (r *tunnelReloader) reloadLocked(file string) (tunnel.Change, error) {
	if file == "" {
		return tunnel.Change{}, errors.New("the tunnel was not started from a site file")
	}
	cfg, err := r.load(file)
	if err != nil {
		return tunnel.Change{}, configLines(err)
	}
	if err := restartOnly(r.cfg, cfg); err != nil {
		return tunnel.Change{}, err
	}
	// Uplinks whose socket stays keep it; the others get a new one, closed again if the
	// reload fails.
	var opened []tunnel.Conn
	fail := func(err error) (tunnel.Change, error) {
		for _, c := range opened {
			c.Close()
		}
		return tunnel.Change{}, err
	}
	conns := map[string]uplinkSock{}
	var uplinks []tunnel.Uplink
	byName := map[string]config.Uplink{}
	for _, u := range cfg.Uplinks {
		local := u.Socket(cfg.Port)
		s, ok := r.conns[u.Name]
		switch {
		case ok && s.local == local && s.iface == u.Interface:
			s.config = u
		case u.Follows():
			// A new uplink that follows its interface: the follower binds it.
			s = uplinkSock{local: local, iface: u.Interface, mtu: linkMTU(u), config: u}
		default:
			for name, o := range r.conns {
				if o.local == local && (name != u.Name || o.iface != u.Interface) {
					return fail(fmt.Errorf("uplink %s: %v is uplink %s's socket now (%w: a new name or interface on the same address and port)", u.Name, local, name, tunnel.ErrReloadNeedsRestart))
				}
			}
			c, err := r.listen(u, cfg.Port)
			if err != nil {
				return fail(fmt.Errorf("uplink %s: %w", u.Name, err))
			}
			opened = append(opened, c)
			s = uplinkSock{local: local, iface: u.Interface, conn: c, mtu: linkMTU(u), config: u}
		}
		conns[u.Name] = s
		byName[u.Name] = u
		uplinks = append(uplinks, uplinkOf(u, cfg.Port, s.conn, s.mtu))
	}
	o := braidOptions(cfg, nil, 0, uplinks, byName, r.log)
	ch, err := r.t.Reload(tunnel.Config{Uplinks: uplinks, Peers: o.Peers, Scheduler: o.Scheduler})
	if err != nil {
		return fail(err)
	}
	// The tunnel owns the sockets now (and has closed those of the uplinks it removed).
	// Routes: the new ones first, then those no peer has any more.
	var routeErrs []error
	want := routesOf(cfg)
	for _, p := range want {
		if err := tun.AddRoute(r.nl, cfg.Interface, p); err != nil {
			routeErrs = append(routeErrs, err)
		}
	}
	for _, p := range routesOf(r.cfg) {
		if !slices.Contains(want, p) {
			if err := tun.DelRoute(r.nl, cfg.Interface, p); err != nil {
				routeErrs = append(routeErrs, err)
			}
		}
	}
	if r.threads != nil && cfg.Threads != r.cfg.Threads {
		r.threads.Set(cfg.Threads)
	}
	r.cfg, r.conns = cfg, conns
	if err := errors.Join(routeErrs...); err != nil {
		return ch, fmt.Errorf("%w: %w", errRoutesLag, err)
	}
	return ch, nil
}

// configLines is a config error with one problem per line (each with its file:line).
func configLines(err error) error {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		var b strings.Builder
		b.WriteString("the configuration is not valid:")
		for _, x := range joined.Unwrap() {
			fmt.Fprintf(&b, "\n  %v", x)
		}
		return errors.New(b.String())
	}
	return fmt.Errorf("the configuration is not valid: %w", err)
}

func routesOf(cfg *config.Tunnel) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range cfg.Peers {
		for _, r := range p.Routes {
			if r = r.Masked(); !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	return out
}

// restartOnly refuses the changes that only a restart applies: the TUN device, the key, the
// session and path settings every peer shares, and the status endpoints.
func restartOnly(old, cur *config.Tunnel) error {
	var what []string
	check := func(name string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			what = append(what, name)
		}
	}
	check("mode", old.Mode, cur.Mode)
	check("interface", old.Interface, cur.Interface)
	check("address", old.Addresses, cur.Addresses)
	check("mtu", old.MTU, cur.MTU)
	check("metrics", old.Metrics, cur.Metrics)
	check("control", old.Control, cur.Control)
	if old.Braid != nil && cur.Braid != nil {
		a, b := *old.Braid, *cur.Braid
		check("private key", a.PrivateKey, b.PrivateKey)
		check("probe_interval", a.ProbeInterval, b.ProbeInterval)
		check("down_after", a.DownAfter, b.DownAfter)
		check("reorder", a.Reorder, b.Reorder)
		check("shards", a.Shards, b.Shards)
		check("loss_recovery", a.LossRecovery, b.LossRecovery)
		check("sparse_flows", a.SparseFlows, b.SparseFlows)
		check("encryption", a.Encryption, b.Encryption)
		check("cipher", a.Cipher, b.Cipher)
	}
	if len(what) > 0 {
		return fmt.Errorf("%s changed: %w", strings.Join(what, ", "), tunnel.ErrReloadNeedsRestart)
	}
	return nil
}

// listenUplink opens an uplink's socket as serveTunnel does in braid mode: a group of n
// sockets (tunnel.Options.Shards).
func listenUplink(u config.Uplink, port uint16, n int) (tunnel.Conn, error) {
	return listenGroup(u.Socket(port), u.Interface, n)
}

// listenGroup opens n sockets on local in one group (sock.ListenGroup) that coalesce what
// they receive (GRO).
func listenGroup(local netip.AddrPort, iface string, n int) (tunnel.Conn, error) {
	g, err := sock.ListenGroup(local, iface, n)
	if err != nil {
		return nil, err
	}
	g.EnableGRO()
	return g, nil
}

// shards is the number of receive shards of a braid-mode tunnel: the configured number, or
// one per CPU.
func shards(cfg *config.Tunnel) int {
	if cfg.Braid != nil && cfg.Braid.Shards > 0 {
		return cfg.Braid.Shards
	}
	return runtime.NumCPU()
}
