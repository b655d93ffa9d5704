package rbpm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/traffic"
	"braid/internal/tunnel"
)

// RBPMTunnelSchedulers are the tunnel's rows of the RBPM reproduction, in the order printed:
// MPT's weighted round robin with its default weights (all 1) and with weights in proportion
// to the paths' rates (wrr-rates: what an operator who knows them would configure), the
// MPTCP-like min-RTT, the two receive-window-aware schedulers and RBPM.
var RBPMTunnelSchedulers = []string{"wrr", "wrr-rates", "minrtt", "blest", "ecf", "rbpm"}

// RBPMTunnelConfig names the tunnel row of a scheduler.
func RBPMTunnelConfig(scheduler string) string { return "braid tunnel, " + scheduler }

// RBPMTunnel measures `braid tunnel` with the given scheduler on scenario sc for dur: a
// single TCP upload (reno) from host a to host b through a tunnel over the scenario's paths.
// Two buffers are bounded to sc's buffer (RBPMBuffer for the paper's): the inner TCP receiver's
// (tcp_rmem's maximum on b, as in the kernel rows) and the tunnel's reorder buffer, whose free
// room the buffer-aware schedulers learn from the feedback. Path capacities are not
// configured. scheduler "wrr" configures every weight 1 (MPT's default), "wrr-rates" the
// weights in proportion to the paths' rates (one per 100 kbit/s). PerPath is what each link
// carried from a to b each second, tunnel headers and probes included.
func RBPMTunnel(ctx context.Context, self string, sc RBPMScenario, scheduler string, dur time.Duration, o kit.Options) (RBPMRow, error) {
	row := RBPMRow{Scenario: sc.Name, Config: RBPMTunnelConfig(scheduler)}
	l, err := rbpmLab(ctx, "rbpmt", sc, o)
	if err != nil {
		return row, err
	}
	defer l.Close()
	a, b := l.Host("a"), l.Host("b")
	// The inner TCP receiver on b is bounded exactly as the kernel rows bound theirs (tcp_rmem's
	// maximum in b's namespace), so that a tunnel row differs from a kernel row only in the
	// transport. The reorder buffer alone does not hold the flow to sc's buffer: it releases on
	// overflow, and behind it the inner receiver would advertise its default window of
	// several MB.
	if err := b.NS.Sysctl("ipv4/tcp_rmem", fmt.Sprintf("4096 131072 %d", sc.buffer())); err != nil {
		return row, err
	}
	spec := roles.SiteSpec{Paths: len(sc.Paths), Outer: 4, Scheduler: scheduler, ReorderMaxBytes: sc.buffer()}
	if scheduler == "wrr" || scheduler == "wrr-rates" {
		spec.Scheduler = "wrr"
		for _, p := range sc.Paths {
			w := 1
			if scheduler == "wrr-rates" {
				w = int(p.Rate / 100e3)
			}
			spec.Weights = append(spec.Weights, w)
		}
	}
	pair, err := roles.StartTunnelPair(ctx, l, self, spec, 4)
	if err != nil {
		return row, err
	}
	defer pair.Close()
	addr := netip.AddrPortFrom(roles.SiteInner(1, 4), 5201).String()
	stop, err := kit.StartServer(ctx, b, addr)
	if err != nil {
		return row, err
	}
	defer stop()

	row.initSamples(len(sc.Paths))
	links := l.Links()
	start := time.Now()
	last := make([]uint64, len(links))
	for i, lk := range links {
		last[i] = lk.Stats(0).Bytes
	}
	stopSampling := everySecond(ctx, func() {
		for i, lk := range links {
			cur := lk.Stats(0).Bytes
			row.PerPath[i] = append(row.PerPath[i], float64(cur-min(last[i], cur)))
			last[i] = cur
		}
		st, err := tunnelStatus(ctx, a)
		if err != nil || len(st.Peers) == 0 {
			return
		}
		for i, pa := range st.Peers[0].Paths {
			if pa.Sched == "demoted" && i < len(row.DemotedAt) && row.DemotedAt[i] < 0 {
				row.DemotedAt[i] = time.Since(start)
			}
		}
	})
	res, err := traffic.Bulk(ctx, a.Dial, addr, traffic.BulkOptions{Duration: dur, Interval: time.Second})
	stopSampling()
	if err != nil {
		return row, fmt.Errorf("%w\n%s", err, pair.Logs())
	}
	row.Goodput = res.Goodput / 8
	var notes []string
	if st, err := tunnelStatus(ctx, a); err == nil && len(st.Peers) > 0 {
		for _, pa := range st.Peers[0].Paths {
			if pa.Sched == "demoted" {
				notes = append(notes, fmt.Sprintf("path %d demoted at the end (%s: required %d B, available %d B)", pa.ID, pa.SchedReason, pa.SchedRequired, pa.SchedAvailable))
			}
			if os.Getenv("BRAID_RBPM_DEBUG") != "" {
				fmt.Fprintf(os.Stderr, "%+v\n", pa)
			}
		}
		if d := st.Counters["drop_no_path"]; d > 0 {
			notes = append(notes, fmt.Sprintf("%d packets found no path with room", d))
		}
	}
	for i, at := range row.DemotedAt {
		if at >= 0 {
			notes = append(notes, fmt.Sprintf("path %d first seen demoted at %.0f s", i+1, at.Seconds()))
		}
	}
	notes = append(notes, fmt.Sprintf("%d retransmissions", res.Retransmits))
	row.Note = strings.Join(notes, "; ")
	return row, nil
}

// tunnelStatus reads the status of the tunnel on h from its metrics endpoint (the default
// address, in h's namespace).
func tunnelStatus(ctx context.Context, h *lab.Host) (*tunnel.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := h.Dial(ctx, "tcp", "127.0.0.1:9473")
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	req, _ := http.NewRequest("GET", "http://127.0.0.1:9473/status", nil)
	req.Close = true
	if err := req.Write(c); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc struct {
		Tunnel *tunnel.Status `json:"tunnel"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, err
	}
	if doc.Tunnel == nil {
		return nil, fmt.Errorf("scenario: no tunnel status on %s", h.Name)
	}
	return doc.Tunnel, nil
}

// rbpmTunnelRows measures every tunnel scheduler on sc.
func rbpmTunnelRows(ctx context.Context, sc RBPMScenario, dur time.Duration, o kit.Options) ([]RBPMRow, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var rows []RBPMRow
	for _, s := range RBPMTunnelSchedulers {
		row, err := RBPMTunnel(ctx, self, sc, s, dur, o)
		if err != nil {
			return nil, fmt.Errorf("tunnel, %s: %w", s, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}
