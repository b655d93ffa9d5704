package lb

import (
	"strconv"

	"golang.org/x/sys/unix"

	"braid/internal/lb/xdp"
	"braid/internal/metrics"
)

func monotonic() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// counterHelp explains each data-plane counter in the metrics.
var counterHelp = map[xdp.Counter]string{
	xdp.CounterRX:               "Packets the XDP program saw.",
	xdp.CounterPassNotVIP:       "TCP packets not addressed to a service, passed to the stack.",
	xdp.CounterPassOther:        "Packets that are not TCP over IPv4/IPv6 (or fragments), passed to the stack.",
	xdp.CounterForwarded:        "Packets forwarded to a backend.",
	xdp.CounterNewConn:          "First-subflow SYNs placed by Maglev.",
	xdp.CounterNewMidflow:       "Packets of flows missing from the connection table, placed by Maglev.",
	xdp.CounterJoinSteered:      "MP_JOIN SYNs sent to the backend owning their token.",
	xdp.CounterDropJoinUnknown:  "MP_JOIN SYNs dropped: no backend owns their token.",
	xdp.CounterDropJoinCollided: "MP_JOIN SYNs dropped: two backends claim their token (collision = drop).",
	xdp.CounterTokenLearned:     "Server tokens learned from MP_CAPABLE.",
	xdp.CounterTokenRepeat:      "Token learnings repeating a known token of the same backend.",
	xdp.CounterTokenCollision:   "Token learnings refused: another backend owns the token.",
	xdp.CounterTokenFull:        "Token learnings refused: the token table is full.",
	xdp.CounterLearnNoFlow:      "MP_CAPABLE keys ignored: the flow's MP_CAPABLE SYN was not seen (forged or unknown).",
	xdp.CounterLearnLimited:     "Token learnings refused by the rate limits.",
	xdp.CounterTokenFastclose:   "Tokens removed by the client's MP_FASTCLOSE.",
	xdp.CounterTokenClosing:     "Tokens marked closing by the client's DATA_FIN.",
	xdp.CounterMPCBad:           "MP_CAPABLE options of a length, version or flags no RFC defines.",
	xdp.CounterOptMalformed:     "TCP option lists whose lengths lie (forwarded as plain TCP).",
	xdp.CounterDropMalformed:    "Packets to a service with a truncated TCP header, dropped.",
	xdp.CounterDropNoBackend:    "Packets dropped: no backend to send to.",
	xdp.CounterDropEncap:        "Packets dropped: no room for the encapsulation header.",
	xdp.CounterStateless:        "Packets forwarded by the stateless (VIP, port) table.",
}

// WriteMetrics writes the balancer's metrics (metrics.Source).
func (l *LB) WriteMetrics(w *metrics.Writer) {
	st, err := l.Status(false)
	if err != nil {
		return
	}
	for i := xdp.Counter(0); i < xdp.NumCounters; i++ {
		w.Sample("braid_lb_"+i.String()+"_total", metrics.Counter, counterHelp[i], float64(st.Counters[i.String()]))
	}
	w.Sample("braid_lb_tokens_swept_total", metrics.Counter, "Tokens expired by the control plane.", float64(st.TokensSwept))
	w.Sample("braid_lb_tokens_joined", metrics.Gauge, "Entries of the joined token table.", float64(st.TokensJoined))
	w.Sample("braid_lb_tokens_pending", metrics.Gauge, "Pending (never joined, not expired) tokens.", float64(st.TokensPending))
	w.Sample("braid_lb_token_pressure_sweeps_total", metrics.Counter, "Sweeps that found the joined token table above 3/4 full.", float64(st.TokenPressure))
	w.Sample("braid_lb_tokens_removed_with_backend_total", metrics.Counter, "Tokens removed with their backend.", float64(st.TokensRemoved))
	type g struct {
		name, help string
		kind       metrics.Kind
		v          func(b BackendStatus) float64
	}
	for _, m := range []g{
		{"braid_lb_backend_weight", "The backend's weight (0: drained).", metrics.Gauge, func(b BackendStatus) float64 { return float64(b.Weight) }},
		{"braid_lb_backend_up", "Whether the backend passes its health check.", metrics.Gauge, func(b BackendStatus) float64 {
			if b.State == "down" {
				return 0
			}
			return 1
		}},
		{"braid_lb_backend_flows", "Flows (subflows) pinned to the backend in the connection table.", metrics.Gauge, func(b BackendStatus) float64 { return float64(b.Flows) }},
		{"braid_lb_backend_tokens", "MPTCP tokens owned by the backend.", metrics.Gauge, func(b BackendStatus) float64 { return float64(b.Tokens) }},
		{"braid_lb_backend_connections_total", "First subflows placed on the backend.", metrics.Counter, func(b BackendStatus) float64 { return float64(b.Conns) }},
		{"braid_lb_backend_joins_total", "MP_JOIN subflows steered to the backend.", metrics.Counter, func(b BackendStatus) float64 { return float64(b.Joins) }},
		{"braid_lb_backend_packets_total", "Packets forwarded to the backend.", metrics.Counter, func(b BackendStatus) float64 { return float64(b.Packets) }},
		{"braid_lb_backend_bytes_total", "Bytes forwarded to the backend.", metrics.Counter, func(b BackendStatus) float64 { return float64(b.Bytes) }},
	} {
		for _, b := range st.Backends {
			w.Sample(m.name, m.kind, m.help, m.v(b), "backend", b.Name, "index", strconv.Itoa(int(b.Index)))
		}
	}
}

// StatusJSON is the /status document (metrics.Source): the status with every token.
func (l *LB) StatusJSON() any {
	st, err := l.Status(true)
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	return st
}
