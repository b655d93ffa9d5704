package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"braid/internal/config"
	"braid/internal/gothreads"
	"braid/internal/lb"
	"braid/internal/lisp/mapserver"
	"braid/internal/lisp/xtr"
	"braid/internal/metrics"
	"braid/internal/tunnel"
	"braid/internal/units"
)

func init() {
	commands["status"] = command{summary: "show the running roles' state: tunnel paths, lb backends, map server registrations, xTR map-cache", run: runStatus}
}

const statusDoc = `Usage: braid status [--control SOCKET | --addr HOST:PORT] [--json]

Prints the state of the braid roles running here (in this network namespace):
  tunnel     every peer with its session (its cipher, or "none (authenticated only)" when
             encryption = false) and every path with its state, round-trip time, loss,
             delivery rate ("unmeasured" until the peer has measured it, "-" while the path is
             down), capacity (configured, measured with the estimator's phase, or
             "unmeasured"), MTU and counters; then the drop counters by reason
  lb         services, backends with their state, weight, flows, tokens and health, counters
  mapserver  registered sites and EID prefixes with their locators, registrations accepted
             and refused, counters
  xtr        map-cache entries, RLOC pairs with their probe state and RTT, registrations,
             counters
  pm, proxy  their connections and counters

Without --control or --addr it asks each role where it is by default and prints every one
that answers: first each role's default control socket (@braid/tunnel, @braid/lb,
@braid/mapserver, @braid/xtr, @braid/pm, @braid/proxy: abstract sockets, which belong to the
network namespace, so that each namespace finds its own), then, for a role not found there,
its default status address (tunnel 127.0.0.1:9473, mapserver :9474, pm :9475, lb :9476, xtr
:9477, proxy :9478). A role therefore needs no 'metrics' for braid status. --control asks one
control socket, --addr one status address.

Each status address also serves a live page at / (open http://127.0.0.1:9473/ in a browser):
the role's state, with charts of the last minutes (docs/operations.md).

Example:
  braid status
  braid status --control @braid/tunnel --json
  braid status --addr 127.0.0.1:9478
`

// statusPlace is where braid status looks for a role: a control socket or a status address.
type statusPlace struct {
	role, where string // role: the role found there by default ("" when asked explicitly)
	control     bool
}

// defaultStatusPlaces lists where the roles are by default, control sockets first.
func defaultStatusPlaces() []statusPlace {
	return []statusPlace{
		{"tunnel", config.DefaultTunnelControl, true}, {"lb", config.DefaultLBControl, true},
		{"mapserver", config.DefaultMapserverControl, true}, {"xtr", config.DefaultXTRControl, true},
		{"pm", config.DefaultPMControl, true}, {"proxy", config.DefaultProxyControl, true},
		{"tunnel", config.DefaultTunnelMetrics, false}, {"mapserver", config.DefaultMapserverMetrics, false},
		{"pm", config.DefaultPMMetrics, false}, {"lb", config.DefaultLBMetrics, false},
		{"xtr", config.DefaultXTRMetrics, false}, {"proxy", config.DefaultProxyMetrics, false},
	}
}

func (p statusPlace) fetch(timeout time.Duration) ([]byte, error) {
	if p.control {
		return controlStatus(p.where)
	}
	client := http.Client{Timeout: timeout}
	resp, err := client.Get("http://" + p.where + "/status")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", p.where, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

func runStatus(e env, args []string) int {
	fs := newFlags(e, "braid status", statusDoc)
	control := fs.String("control", "", "ask the role on this control `SOCKET`")
	addr := fs.String("addr", "", "ask the role at this status `ADDRESS`")
	asJSON := fs.Bool("json", false, "print the raw JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	places := defaultStatusPlaces()
	switch {
	case *control != "" && *addr != "":
		fmt.Fprintln(e.stderr, "braid status: give --control or --addr, not both")
		return exitUsage
	case *control != "":
		places = []statusPlace{{where: *control, control: true}}
	case *addr != "":
		places = []statusPlace{{where: *addr}}
	}
	found := map[string]bool{}
	var failed []string
	shown := 0
	for _, p := range places {
		if p.role != "" && found[p.role] {
			continue // found on its control socket already
		}
		body, err := p.fetch(5 * time.Second)
		if err == nil {
			var doc struct {
				Role string `json:"role"`
			}
			if err = json.Unmarshal(body, &doc); err == nil && doc.Role == "" {
				err = errors.New("the answer names no braid role")
			}
			if err == nil {
				found[doc.Role] = true
				if shown++; shown > 1 && !*asJSON {
					fmt.Fprintln(e.stdout)
				}
				if code := printStatus(e, doc.Role, body, *asJSON); code != exitOK {
					return code
				}
				continue
			}
		}
		failed = append(failed, fmt.Sprintf("%s: %v", p.where, err))
	}
	if shown > 0 {
		return exitOK
	}
	if len(places) == 1 {
		fmt.Fprintf(e.stderr, "braid status: is a braid role running there? %s\n", failed[0])
		return exitError
	}
	fmt.Fprintln(e.stderr, "braid status: no braid role answers at the default places (give --control or --addr):")
	for _, f := range failed {
		fmt.Fprintf(e.stderr, "  %s\n", f)
	}
	return exitError
}

// printStatus prints the status document body of role.
func printStatus(e env, role string, body []byte, asJSON bool) int {
	switch role {
	case "proxy":
		return printProxyStatus(e, body, asJSON)
	case "pm":
		return printPMStatus(e, body, asJSON)
	}
	if asJSON {
		var out bytes.Buffer
		if err := json.Indent(&out, body, "", "  "); err != nil {
			fmt.Fprintf(e.stderr, "braid status: %s: %v\n", role, err)
			return exitError
		}
		fmt.Fprintln(e.stdout, strings.TrimSpace(out.String()))
		return exitOK
	}
	var err error
	switch role {
	case "lb":
		var st lb.Status
		if err = json.Unmarshal(body, &st); err == nil {
			fmt.Fprint(e.stdout, "load balancer: ")
			printLBStatus(e.stdout, st)
		}
	case "mapserver":
		var st mapserverStatus
		if err = json.Unmarshal(body, &st); err == nil {
			printMapserverSummary(e.stdout, st)
			printRegistrations(e.stdout, st)
		}
	case "xtr":
		var st xtrStatus
		if err = json.Unmarshal(body, &st); err == nil {
			printXTRSummary(e.stdout, st.XTR)
			printXTR(e.stdout, st.XTR)
		}
	case "tunnel":
		var doc statusReport
		if err = json.Unmarshal(body, &doc); err == nil {
			switch {
			case doc.MPT != nil:
				printMPTStatus(e, doc.MPT)
			case doc.Tunnel != nil:
				printTunnelStatus(e.stdout, doc.Tunnel)
			default:
				err = errors.New("the tunnel's status is empty")
			}
			if err == nil && doc.Threads != nil {
				printThreads(e.stdout, doc.Threads)
			}
		}
	default:
		err = fmt.Errorf("role %q is not one braid status knows", role)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "braid status: %s: %v\n", role, err)
		return exitError
	}
	return exitOK
}

// printThreads prints the Go thread controller's line.
func printThreads(w io.Writer, st *gothreads.Status) {
	how := "threads = " + st.Setting
	switch st.Setting {
	case "auto":
		how = fmt.Sprintf("auto: one while a core suffices, up to %d; changed %d times", st.Max, st.Changes)
	case "environment":
		how = "GOMAXPROCS from the environment"
	}
	fmt.Fprintf(w, "\nGo threads: %d (%s); the process used %.2f cores over the last %v\n", st.Threads, how, st.Busy, gothreads.Interval)
}

// printTunnelStatus prints a braid-mode tunnel's status as tables.
func printTunnelStatus(w io.Writer, st *tunnel.Status) {
	fmt.Fprintf(w, "tunnel, public key %s, up %s, mtu %d\n", st.PublicKey, st.Uptime.Round(time.Second), st.MTU)
	if len(st.Uplinks) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "UPLINK\tINTERFACE\tLOCAL\tADDRESS\tSTATE\tREBINDS")
		for _, u := range st.Uplinks {
			iface, local, how, state := u.Interface, u.Local, "configured", u.State
			if iface == "" {
				iface = "-"
			}
			if local == "" {
				local = "-"
			}
			if u.Follow {
				how = "the interface's"
			}
			if state == "" {
				state = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", u.Name, iface, local, how, state, u.Rebinds)
		}
		tw.Flush()
	}
	for _, p := range st.Peers {
		session := "no session"
		if p.Session {
			session = "session " + p.SessionAge.Round(time.Second).String() + " old, cipher " + p.Cipher
		}
		buffer := "unknown"
		if p.PeerBufferFree >= 0 {
			buffer = strconv.Itoa(p.PeerBufferFree) + " B free"
		}
		if p.Session && p.Protocol != 0 {
			session += ", protocol " + strconv.Itoa(p.Protocol)
		}
		fmt.Fprintf(w, "\npeer %s: %s, scheduler %s, send queue %d packets (%d B), peer's reorder buffer %s\n",
			p.Name, session, p.Scheduler, p.SendQueuePackets, p.SendQueueBytes, buffer)
		if r := p.Reorder; r != nil {
			fmt.Fprintf(w, "reorder buffer: hold %v, holding %d packets, %d late, %d gaps given up (lost), %d gaps held past the hold for a path still delivering, %d held for a resend asked of the peer (%d filled), %d duplicates, %d sparse flows' packets delivered at once\n",
				p.ReorderHold.Round(10*time.Microsecond), r.Packets, r.Late, r.Lost, r.Waited, r.Rescued, r.Refilled, r.Duplicates, r.Placed)
		}
		if p.LearnsPaths {
			fmt.Fprintf(w, "paths learned from the peer's packets (at most %d), keepalive %v\n", p.MaxPaths, p.Keepalive)
		} else {
			fmt.Fprintf(w, "keepalive %v\n", p.Keepalive)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		// TX and RX DATA count data only (probes, replies and MTU probes are in the JSON's
		// TxBytes and RxBytes), so a path that carries no traffic shows 0 however often it is probed.
		fmt.Fprintln(tw, "PATH\tUPLINK\tLOCAL\tREMOTE\tHOW\tSTATE\tRTT\tLOSS\tRATE\tCAPACITY\tMTU\tTX DATA\tRX DATA\tTX DROPS")
		for _, pa := range p.Paths {
			mtu := strconv.Itoa(pa.MTU)
			if pa.MTUSearching {
				mtu += " (probing)"
			}
			local := pa.Local
			if local == "" {
				local = "-"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%.1f ms\t%.1f %%\t%s\t%s\t%s\t%d B\t%d B\t%d\n", pa.ID, pa.Uplink, local, pa.Remote, pathOrigin(pa), pa.State,
				float64(pa.RTT)/1e6, 100*pa.Loss, pathRate(pa), pathCapacity(pa), mtu, pa.TxDataBytes, pa.RxDataBytes, pa.TxDrops)
		}
		tw.Flush()
		for _, pa := range p.Paths {
			switch {
			case pa.Sched == "":
			case pa.SchedRequired == 0 && pa.SchedAvailable == 0:
				fmt.Fprintf(w, "path %d %s: %s\n", pa.ID, pa.Sched, pa.SchedReason)
			default:
				fmt.Fprintf(w, "path %d %s: %s (buffer required %d B, available %d B)\n", pa.ID, pa.Sched, pa.SchedReason, pa.SchedRequired, pa.SchedAvailable)
			}
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, k := range metrics.SortedKeys(st.Counters) {
		if v := st.Counters[k]; v != 0 {
			fmt.Fprintf(tw, "%s\t%d\n", k, v)
		}
	}
	tw.Flush()
}

// pathOrigin says how a path's remote address was found: "configured" (the site file),
// "learned" (from the peer's packets), or "roamed at T" when the peer's packets last moved it
// (with what it was before: configured or learned).
func pathOrigin(pa tunnel.PathStatus) string {
	if pa.MovedAt != nil {
		s := "roamed at " + pa.MovedAt.UTC().Format("15:04:05.000") + " (" + pa.Origin
		if pa.Moves > 1 {
			s += ", " + strconv.FormatUint(pa.Moves, 10) + " moves"
		}
		return s + ")"
	}
	return pa.Origin
}

// pathRate is a path's delivery rate as measured by the peer: "-" while the path is not up
// (it has no current rate), "unmeasured" before the peer has measured it.
func pathRate(pa tunnel.PathStatus) string {
	switch {
	case pa.State != "up":
		return "-"
	case !pa.RateMeasured:
		return "unmeasured"
	}
	return units.FormatRate(uint64(pa.Rate))
}

// pathCapacity is what a path is scheduled for: configured, measured (with the estimator's
// phase, and "unpaced" when it is the peer's one path left), "unmeasured" while the estimator
// has only its start-up guess, or "-" for none.
func pathCapacity(pa tunnel.PathStatus) string {
	unpaced := ""
	if pa.Unpaced {
		unpaced = ", unpaced"
	}
	switch {
	case pa.CapacityPhase != "" && !pa.CapacityMeasured:
		if pa.Unpaced {
			return "unmeasured (unpaced)"
		}
		return "unmeasured"
	case pa.CapacityPhase != "":
		return units.FormatRate(uint64(pa.Capacity)) + " (" + pa.CapacityPhase + unpaced + ")"
	case pa.Capacity == 0:
		return "-"
	}
	return "configured " + units.FormatRate(uint64(pa.Capacity))
}

// printMapserverSummary is the first line of a map server's status: what is registered and
// how registrations fared.
func printMapserverSummary(w io.Writer, st mapserverStatus) {
	sites := map[string]bool{}
	for _, r := range st.Registrations {
		sites[r.Site] = true
	}
	refused := uint64(0)
	for k, v := range st.Counters {
		if registrationRefusal[k] {
			refused += v
		}
	}
	fmt.Fprintf(w, "map server: %d sites registered, %d EID prefixes; registrations accepted %d, refused %d\n\n",
		len(sites), len(st.Registrations), st.Counters[mapserver.CountRegistered], refused)
}

// registrationRefusal names the counters of Map-Registers refused.
var registrationRefusal = map[string]bool{
	mapserver.DropNoAuth: true, mapserver.DropBadAuth: true, mapserver.DropAuthAlgorithm: true,
	mapserver.DropUnknownKeyID: true, mapserver.DropUnknownSite: true, mapserver.DropNotOwned: true,
	mapserver.DropReplay: true,
}

// printXTRSummary is the first line of an xTR's status.
func printXTRSummary(w io.Writer, st xtr.Status) {
	up := 0
	for _, p := range st.Pairs {
		if p.Up {
			up++
		}
	}
	registered := 0
	for _, r := range st.Registrations {
		if r.Registered {
			registered++
		}
	}
	fmt.Fprintf(w, "xtr: %d map-cache entries, %d RLOC pairs (%d up), registered with %d of %d map servers\n\n",
		len(st.Cache), len(st.Pairs), up, registered, len(st.Registrations))
}

func printMPTStatus(e env, st *tunnel.MPTStatus) {
	fmt.Fprintf(e.stdout, "tunnel in mpt mode (IPv%d connection), up %s, reordering %v\n\n", st.IPVersion, st.Uptime.Round(time.Second), st.Reorder)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tUPLINK\tREMOTE\tSTATE\tWEIGHT\tLAST HEARD\tTX\tRX\tKEEPALIVES OUT/IN")
	for _, p := range st.Paths {
		state := p.State
		if p.Status != "" && p.Status != "ok" {
			state += " (" + p.Status + ")" // why: silent, interface down, by hand, announced by the peer
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%v ago\t%d B\t%d B\t%d/%d\n", p.ID, p.Uplink, p.Remote, state, p.Weight,
			p.SinceReceive.Round(time.Millisecond), p.TxBytes, p.RxBytes, p.KeepalivesSent, p.KeepalivesReceived)
	}
	tw.Flush()
	fmt.Fprintln(e.stdout)
	tw = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	for _, k := range metrics.SortedKeys(st.Counters) {
		if v := st.Counters[k]; v != 0 {
			fmt.Fprintf(tw, "%s\t%d\n", k, v)
		}
	}
	tw.Flush()
}
