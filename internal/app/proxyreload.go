package app

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"braid/internal/config"
	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
	"braid/internal/netconf"
	"braid/internal/proxy"
)

// proxyReloader applies a changed site file to a running proxy ('braid proxy reload', SIGHUP;
// docs/proxy.md, "Reload"): it loads and checks the file, refuses changes only a restart
// applies, gives the path manager its new settings, hands the proxy its new tenants
// (proxy.Reload), then replaces the interception rules and tells the announcer the new peer
// ports. A file with a mistake is refused with its file:line and nothing changes.
type proxyReloader struct {
	p   *proxy.Proxy
	ann *proxy.Announcer // nil unless path_manager is braid
	pmd *pm.Daemon       // the path manager; nil unless path_manager is braid
	// pmUplinks are the path manager's uplinks, fixed at start
	pmUplinks []core.Uplink
	log       *slog.Logger
	// load reads a site file (loadProxyConfig; a test's own)
	load func(file string) (*config.Proxy, error)
	// rules replaces the interception rules (installRules)
	rules func(netconf.Intercept) error

	mu  sync.Mutex // one reload at a time; guards cfg
	cfg *config.Proxy
}

// proxyRequest is one request on the proxy's control socket.
type proxyRequest struct {
	Action string `json:"action"` // reload
}

func loadProxyConfig(file string) (*config.Proxy, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return config.LoadProxy(file, data, systemEnv{})
}

// reload applies file; the error says why nothing changed.
func (r *proxyReloader) reload(file string) (proxy.Change, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, err := r.reloadLocked(file)
	if err != nil {
		r.log.Error("reload refused: nothing changed", "file", file, "err", err)
		return ch, fmt.Errorf("%w: %s", errReloadRefused, err)
	}
	r.log.Info("reloaded", "file", file, "change", ch.String())
	return ch, nil
}

func (r *proxyReloader) reloadLocked(file string) (proxy.Change, error) {
	if file == "" {
		return proxy.Change{}, errors.New("the proxy was not started from a site file")
	}
	cfg, err := r.load(file)
	if err != nil {
		return proxy.Change{}, configLines(err)
	}
	if err := proxyRestartOnly(r.cfg, cfg); err != nil {
		return proxy.Change{}, err
	}
	o, err := proxyOptions(cfg, r.log)
	if err != nil {
		return proxy.Change{}, err
	}
	old, err := proxyOptions(r.cfg, r.log)
	if err != nil {
		return proxy.Change{}, err
	}
	pmChange, pmBack, err := r.reconfigurePM(r.cfg, cfg)
	if err != nil {
		return proxy.Change{}, fmt.Errorf("path manager: %w", err)
	}
	ch, err := r.p.Reload(o.Tenants)
	if err != nil {
		pmBack()
		return proxy.Change{}, err
	}
	if oic, nic := intercept(r.cfg), intercept(cfg); !reflect.DeepEqual(oic, nic) {
		if err := r.rules(nic); err != nil {
			// Back to the file the proxy ran: its listeners are the ones it had (the reload
			// kept every socket whose address stayed), so this cannot fail for a port.
			if _, rerr := r.p.Reload(old.Tenants); rerr != nil {
				err = errors.Join(err, fmt.Errorf("and going back: %w", rerr))
			}
			pmBack()
			return proxy.Change{}, fmt.Errorf("interception rules: %w", err)
		}
	}
	ch.PathManager = pmChange
	if r.ann != nil {
		var ports []uint16
		for _, t := range cfg.Tenants {
			ports = append(ports, t.PeerPort)
		}
		r.ann.SetPorts(ports)
	}
	r.cfg = cfg
	return ch, nil
}

// proxyRestartOnly refuses the changes that only a restart applies: everything but the
// tenants and, while path_manager stays "braid", the path manager's settings. It names the
// file's keys that changed.
func proxyRestartOnly(old, cur *config.Proxy) error {
	a, b := *old, *cur
	a.Tenants, b.Tenants = nil, nil
	if a.PathManager == "braid" && b.PathManager == "braid" {
		a.PMPolicy, a.PMJoinTimeout, a.PMJoinBackoffMax = b.PMPolicy, b.PMJoinTimeout, b.PMJoinBackoffMax
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	var what []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := range va.NumField() {
		key := va.Type().Field(i).Tag.Get("key")
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) && !slices.Contains(what, key) {
			what = append(what, key)
		}
	}
	return fmt.Errorf("%s changed: only the tenants and the path manager's pm_ settings reload; restart the proxy to apply this", strings.Join(what, ", "))
}

// pmSettings are the path manager's settings a reload applies.
type pmSettings struct {
	policy        string
	join, backoff time.Duration
}

func proxyPMSettings(c *config.Proxy) pmSettings {
	return pmSettings{c.PMPolicy, c.PMJoinTimeout, c.PMJoinBackoffMax}
}

// reconfigurePM gives the running path manager cur's settings when they differ from old's. It
// returns what changed ("" for nothing) and how to go back to old's; the connections and their
// subflows stay, and a policy that did not change keeps its state.
func (r *proxyReloader) reconfigurePM(old, cur *config.Proxy) (string, func(), error) {
	if r.pmd == nil || proxyPMSettings(old) == proxyPMSettings(cur) {
		return "", func() {}, nil
	}
	prev := r.pmd.Policy()
	pol := prev
	if cur.PMPolicy != old.PMPolicy {
		var err error
		if pol, err = pm.NewPolicy(cur.PMPolicy); err != nil {
			return "", nil, err
		}
	}
	if err := r.pmd.Reconfigure(r.pmUplinks, pol, proxyPMCore(cur)); err != nil {
		return "", nil, err
	}
	undo := func() {
		if err := r.pmd.Reconfigure(r.pmUplinks, prev, proxyPMCore(old)); err != nil {
			r.log.Error("path manager: going back to the running settings", "err", err)
		}
	}
	return fmt.Sprintf("pm_policy %s, pm_join_timeout %v, pm_join_backoff_max %v", cur.PMPolicy, cur.PMJoinTimeout, cur.PMJoinBackoffMax), undo, nil
}

// installRules replaces the proxy's nftables table in one transaction (the script deletes and
// recreates it): when nft refuses it, the rules that were there stay. The policy rules and
// routes do not depend on the tenants.
func installRules(ic netconf.Intercept) error {
	path, err := exec.LookPath("nft")
	if err != nil {
		return netconf.ErrNoNft
	}
	cmd := exec.Command(path, "-f", "-")
	cmd.Stdin = strings.NewReader(ic.Script())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft: %v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// proxyReload is 'braid proxy reload': the running proxy re-reads its site file.
func proxyReload(e env, args []string) int {
	fs := newFlags(e, "braid proxy reload", proxyDoc)
	control := fs.String("control", config.DefaultProxyControl, "the proxy's control `SOCKET`")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "braid proxy reload: no arguments expected (the proxy re-reads the site file it started with)")
		return exitUsage
	}
	rep, err := callControl(*control, proxyRequest{Action: "reload"})
	if err != nil {
		if errors.Is(err, errNotRunning) {
			fmt.Fprintf(e.stderr, "braid proxy reload: is the proxy running? %v\n", err)
		} else {
			fmt.Fprintf(e.stderr, "braid proxy reload: %v\n", err)
		}
		return exitError
	}
	fmt.Fprintf(e.stdout, "reloaded %s\n", rep.Message)
	return exitOK
}
