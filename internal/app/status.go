package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"text/tabwriter"
	"time"

	"braid/internal/config"
	"braid/internal/metrics"
	"braid/internal/tunnel"
	"braid/internal/units"
)

func init() {
	commands["status"] = command{summary: "show a running role's state: paths, RTT, loss, rate, bytes", run: runStatus}
}

const statusDoc = `Usage: braid status [--addr HOST:PORT] [--json]

Reads the status endpoint of a running braid role (its 'metrics' address) and prints it as a
table: for the tunnel, every peer with its session and every path with its state, round-trip
time, loss, delivery rate and counters, then the tunnel's drop counters by reason.

Example:
  braid status
  braid status --addr 127.0.0.1:9473 --json
`

func runStatus(e env, args []string) int {
	fs := newFlags(e, "braid status", statusDoc)
	addr := fs.String("addr", config.TunnelDefaults().Metrics.String(), "the role's status `ADDRESS`")
	asJSON := fs.Bool("json", false, "print the raw JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + *addr + "/status")
	if err != nil {
		fmt.Fprintf(e.stderr, "braid status: is a braid role running with metrics on %s? %v\n", *addr, err)
		return exitError
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		fmt.Fprintf(e.stderr, "braid status: %s: %v\n", *addr, err)
		return exitError
	}
	var doc statusReport
	if err := json.Unmarshal(body, &doc); err != nil {
		fmt.Fprintf(e.stderr, "braid status: %s: %v\n", *addr, err)
		return exitError
	}
	if doc.Role == "proxy" {
		return printProxyStatus(e, body, *asJSON)
	}
	if doc.Role == "pm" {
		return printPMStatus(e, body, *asJSON)
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(doc)
		return exitOK
	}
	if doc.MPT != nil {
		printMPTStatus(e, doc.MPT)
		return exitOK
	}
	if doc.Tunnel == nil {
		fmt.Fprintf(e.stdout, "role %s\n", doc.Role)
		return exitOK
	}
	st := doc.Tunnel
	fmt.Fprintf(e.stdout, "tunnel, public key %s, up %s, mtu %d\n", st.PublicKey, st.Uptime.Round(time.Second), st.MTU)
	for _, p := range st.Peers {
		session := "no session"
		if p.Session {
			session = "session " + p.SessionAge.Round(time.Second).String() + " old, " + p.Cipher
		}
		buffer := "unknown"
		if p.PeerBufferFree >= 0 {
			buffer = strconv.Itoa(p.PeerBufferFree) + " B free"
		}
		fmt.Fprintf(e.stdout, "\npeer %s: %s, reorder hold %v, scheduler %s, peer's reorder buffer %s\n", p.Name, session, p.ReorderHold, p.Scheduler, buffer)
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PATH\tUPLINK\tREMOTE\tSTATE\tRTT\tLOSS\tRATE\tCAPACITY\tMTU\tTX\tRX\tTX DROPS")
		for _, pa := range p.Paths {
			capacity := "configured " + units.FormatRate(uint64(pa.Capacity))
			switch {
			case pa.CapacityPhase != "":
				capacity = units.FormatRate(uint64(pa.Capacity)) + " (" + pa.CapacityPhase + ")"
			case pa.Capacity == 0:
				capacity = "-"
			}
			mtu := strconv.Itoa(pa.MTU)
			if pa.MTUSearching {
				mtu += " (probing)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.1f ms\t%.1f %%\t%s\t%s\t%s\t%d B\t%d B\t%d\n", pa.ID, pa.Uplink, pa.Remote, pa.State,
				float64(pa.RTT)/1e6, 100*pa.Loss, units.FormatRate(uint64(pa.Rate)), capacity, mtu, pa.TxBytes, pa.RxBytes, pa.TxDrops)
		}
		tw.Flush()
		for _, pa := range p.Paths {
			switch {
			case pa.Sched == "":
			case pa.SchedRequired == 0 && pa.SchedAvailable == 0:
				fmt.Fprintf(e.stdout, "path %d %s: %s\n", pa.ID, pa.Sched, pa.SchedReason)
			default:
				fmt.Fprintf(e.stdout, "path %d %s: %s (buffer required %d B, available %d B)\n", pa.ID, pa.Sched, pa.SchedReason, pa.SchedRequired, pa.SchedAvailable)
			}
		}
	}
	fmt.Fprintln(e.stdout)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	for _, k := range metrics.SortedKeys(st.Counters) {
		if v := st.Counters[k]; v != 0 {
			fmt.Fprintf(tw, "%s\t%d\n", k, v)
		}
	}
	tw.Flush()
	return exitOK
}

func printMPTStatus(e env, st *tunnel.MPTStatus) {
	fmt.Fprintf(e.stdout, "tunnel in mpt mode (IPv%d connection), up %s, reordering %v\n\n", st.IPVersion, st.Uptime.Round(time.Second), st.Reorder)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tUPLINK\tREMOTE\tSTATE\tWEIGHT\tLAST HEARD\tTX\tRX\tKEEPALIVES OUT/IN")
	for _, p := range st.Paths {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%v ago\t%d B\t%d B\t%d/%d\n", p.ID, p.Uplink, p.Remote, p.State, p.Weight,
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
