package federation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

func init() {
	kit.Register(kit.Scenario{Name: "federation", Summary: "the Multipath Cloud Federation paper: TCP, proxied TCP, MPTCP-1, MPTCP-4 (throughput, HTTP time), and a cut uplink (Figure 5)", Run: runFederation})
}

// The paper's testbed (§V): a wired path of about 40 Mbit/s between Heidelberg and Helsinki and
// an LTE uplink of up to 10 Mbit/s at one site. The paper gives no delays; its HTTP HEAD on a
// persistent connection took 138 ms, which we read as the wired RTT plus server time, so the
// wired path gets 60 ms one way (120 ms RTT) and LTE, typically slower, 80 ms.
var (
	fedWired = topo.Shape{Rate: 40e6, Delay: 60 * time.Millisecond}
	fedLTE   = topo.Shape{Rate: 10e6, Delay: 80 * time.Millisecond}
)

func runFederation(ctx context.Context, w io.Writer, o kit.Options) error {
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	dur, reqs, fig := 10*time.Second, 40, 45*time.Second
	if o.Quick {
		dur, reqs, fig = 4*time.Second, 8, 12*time.Second
	}
	fmt.Fprintf(w, "braid lab repro federation: Kimmerlin, Hasselmeier, Ripke, \"Multipath Cloud Federation\"\n")
	fmt.Fprintf(w, "uplinks: wired %s (%v one way), LTE %s (%v one way) at both sites' proxies; links: %s\n\n",
		kit.RateText(fedWired.Rate), fedWired.Delay, kit.RateText(fedLTE.Rate), fedLTE.Delay, lab.EmulatorName)
	f, err := StartFed(ctx, o, bin, nil, false, fedWired, fedLTE)
	if err != nil {
		return err
	}
	defer f.Close()

	type row struct {
		cfg        FedConfig
		tput       float64
		persistent time.Duration
		fresh      time.Duration
	}
	var rows []row
	for _, cfg := range []FedConfig{FedPlainTCP, FedProxiedTCP, FedMPTCP1, FedMPTCP4} {
		if err := f.Use(ctx, cfg); err != nil {
			return fmt.Errorf("%s: %w", cfg.Name, err)
		}
		b, err := f.Bulk(ctx, traffic.BulkOptions{Duration: dur, Streams: 5})
		if err != nil {
			return fmt.Errorf("%s: throughput: %w\n%s", cfg.Name, err, f.Logs())
		}
		f.WaitIdle(ctx)
		p, err := f.RR(ctx, traffic.RROptions{Count: reqs, RequestSize: 100, ResponseSize: 300})
		if err != nil {
			return fmt.Errorf("%s: requests: %w\n%s", cfg.Name, err, f.Logs())
		}
		n, err := f.RR(ctx, traffic.RROptions{Count: reqs, RequestSize: 100, ResponseSize: 300, NewConn: true})
		if err != nil {
			return fmt.Errorf("%s: requests on new connections: %w\n%s", cfg.Name, err, f.Logs())
		}
		rows = append(rows, row{cfg, b.Steady, p.Median, n.Median})
		fmt.Fprintf(w, "  %-24s measured\n", cfg.Name)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONFIGURATION\tTHROUGHPUT (5 streams)\tHTTP, PERSISTENT\tHTTP, NEW CONNECTION\tPAPER (Fig. 3, 4, §V)")
	paper := []string{"~40 Mbit/s, 138 ms (the baseline)", "~40 Mbit/s, slightly above TCP", "~40 Mbit/s, as proxied TCP", "~46 Mbit/s (+6); new connection 278 ms"}
	for i, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.1f ms\t%.1f ms\t%s\n", r.cfg.Name, kit.RateText(uint64(r.tput)), ms(r.persistent), ms(r.fresh), paper[i])
	}
	tw.Flush()
	base := rows[0]
	fmt.Fprintf(w, "\nMPTCP-4 / TCP throughput: %.2f (paper: about 46/40 = 1.15; the uplinks here add up to %.2f x the wired one).\n",
		rows[3].tput/base.tput, float64(fedWired.Rate+fedLTE.Rate)/float64(fedWired.Rate))
	fmt.Fprintf(w, "New connection through the proxy - without it: %+.1f ms (paper: +140 ms, a WAN round trip for the SOCKS exchange; braid sends\n"+
		"the request in front of the data over a pre-established connection, so no round trip is added).\n\n", ms(rows[3].fresh-base.fresh))

	// Figure 5: one transfer over both uplinks; the wired one is cut at 1/3 and restored at 2/3.
	if err := f.Use(ctx, FedMPTCP4); err != nil {
		return err
	}
	cutAt, restoreAt := fig/3, 2*fig/3
	// Sampled every 100 ms, so that the stall is measured as the issue states it (the longest
	// run of 100 ms samples below 1/10 of the rate before the cut); printed per second.
	res, err := f.CutDuring(ctx, fig, 100*time.Millisecond, cutAt, restoreAt)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Figure 5: one download over MPTCP-4, the wired uplink cut at %v and restored at %v (means of 1 s):\n", cutAt, restoreAt)
	for i := 0; i+10 <= len(res.Samples); i += 10 {
		var sum float64
		for _, s := range res.Samples[i : i+10] {
			sum += s.BitsPerSecond
		}
		bar := int(sum / 10 / 1e6)
		fmt.Fprintf(w, "  %5.0f s %8s  %s\n", res.Samples[i+9].At.Seconds(), kit.RateText(uint64(sum/10)), bars(bar))
	}
	back := "not within the run"
	if res.SubflowBack >= 0 {
		back = res.SubflowBack.Round(10 * time.Millisecond).String()
	}
	fmt.Fprintf(w, "before the cut %s, during %s, after %s; longest gap (100 ms samples below 1/10 of the rate before): %v; a wired subflow carried data again %s after the restore.\n",
		kit.RateText(uint64(res.Before)), kit.RateText(uint64(res.During)), kit.RateText(uint64(res.After)), res.Gap, back)
	fmt.Fprintf(w, "(paper: the rate drops to the LTE link's and comes back; no interruption of the transfer.)\n")
	path := filepath.Join(o.Out, "federation-fig5.png")
	plotErr := fedFigure5(path, res, restoreAt-cutAt)
	if plotErr == nil {
		fmt.Fprintf(w, "wrote %s\n", path)
	}
	c := fedClaims(FedRows{TCP: rows[0].tput, Proxied: rows[1].tput, MPTCP4: rows[3].tput, FreshTCP: rows[0].fresh, FreshMPTCP4: rows[3].fresh}, res)
	c.Print(w)
	return errors.Join(plotErr, c.Err())
}

// fedFigure5 draws the download's goodput per sample through the cut (the paper's Fig. 5), the
// cut and the restore marked.
func fedFigure5(path string, res CutResult, cutFor time.Duration) error {
	ch := kit.Chart{Title: "One download over MPTCP-4, the wired uplink cut (paper Fig. 5)",
		XLabel: "time since the download began (s)", YLabel: "goodput (Mbit/s)"}
	s := kit.Series{Name: "goodput per 100 ms", Color: kit.Palette[1]}
	for _, x := range res.Samples {
		s.X, s.Y = append(s.X, x.At.Seconds()), append(s.Y, x.BitsPerSecond/1e6)
	}
	ch.Series = []kit.Series{s}
	if !res.CutTime.IsZero() && !res.Start.IsZero() {
		cut := res.CutTime.Sub(res.Start)
		ch.Marks = []kit.Mark{{Name: "wired uplink cut", X: cut.Seconds()}, {Name: "wired uplink restored", X: (cut + cutFor).Seconds()}}
	}
	return ch.Save(path)
}

// FedRows are the figures the federation claims are made on: throughput (bit/s) of plain TCP,
// proxied TCP and MPTCP-4, and the request/response time on a new connection without and
// through the proxies.
type FedRows struct {
	TCP, Proxied, MPTCP4  float64
	FreshTCP, FreshMPTCP4 time.Duration
}

// fedClaims are the paper's claims, with braid's own where it goes further:
//   - MPTCP-4 carries more than TCP over the wired path (the paper: 46/40 = 1.15; the uplinks
//     allow 1.25): at least 1.1 times, and no more than both uplinks' rate;
//   - the proxy costs TCP nothing (the paper: proxied TCP slightly above TCP): at least 0.9;
//   - a new connection through the proxies adds no WAN round trip (the paper's added one, 140
//     ms; braid sends the request ahead of the data on a pooled connection): less than half the
//     wired RTT;
//   - Figure 5: cutting the wired uplink leaves the LTE one carrying (at least half its rate;
//     no upper bound: data that came over the wired path before the cut and waited for a
//     gap to be filled is delivered during it),
//     the transfer is never stalled for 1 s or more (issue 16: 100 ms samples below 1/10 of
//     the rate before the cut, for less than 1 s), a wired subflow carries data again
//     after the restore, and the rate comes back to at least 0.8 of what it was.
func fedClaims(r FedRows, cut CutResult) *kit.Claims {
	c := &kit.Claims{}
	c.AtLeast("MPTCP-4 throughput over TCP's (paper: 1.15)", r.MPTCP4/max(r.TCP, 1), 1.1, "%.2f")
	c.AtMost("MPTCP-4 throughput, within both uplinks", r.MPTCP4/1e6, float64(fedWired.Rate+fedLTE.Rate)/1e6, "%.1f Mbit/s")
	c.AtLeast("proxied TCP throughput over TCP's (paper: slightly above 1)", r.Proxied/max(r.TCP, 1), 0.9, "%.2f")
	rtt := 2 * fedWired.Delay
	c.AtMost("new connection through the proxies, added time (paper: +140 ms)", ms(r.FreshMPTCP4-r.FreshTCP), ms(rtt/2), "%.1f ms")
	c.AtLeast("wired uplink cut: rate over the LTE uplink", cut.During/1e6, 0.5*float64(fedLTE.Rate)/1e6, "%.1f Mbit/s")
	c.AtMost("wired uplink cut: longest stall of the transfer (under 1 s)", cut.Gap.Seconds(), 0.9, "%.1f s")
	back := "not within the run"
	if cut.SubflowBack >= 0 {
		back = "after " + cut.SubflowBack.Round(10*time.Millisecond).String()
	}
	c.Add("wired uplink restored: a wired subflow carries data again", cut.SubflowBack >= 0, "%s", back)
	c.AtLeast("wired uplink restored: rate over the rate before the cut", cut.After/max(cut.Before, 1), 0.8, "%.2f")
	return c
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func bars(n int) string {
	if n < 0 {
		n = 0
	}
	if n > 100 {
		n = 100
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = '#'
	}
	return string(b)
}
