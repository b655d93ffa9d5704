package pm

import (
	"errors"
	"fmt"
	"time"

	"braid/internal/metrics"
	"braid/internal/mptcp/info"
	"braid/internal/mptcp/pm/core"
)

// decideRBPM hands the rbpm policy the statistics of the last poll and returns its backup-flag
// changes; nil for other policies. The caller holds d.mu.
func (d *Daemon) decideRBPM(now time.Time, conns []info.Conn) []core.Action {
	p, ok := d.o.Policy.(*core.RBPM)
	if !ok || conns == nil {
		return nil
	}
	return p.Decide(now, rbpmStats(conns), d.o.Uplinks)
}

// rbpmStats translates a sock_diag dump for the rbpm policy.
func rbpmStats(conns []info.Conn) []core.ConnStats {
	const tcpEstablished = 1
	out := make([]core.ConnStats, 0, len(conns))
	for _, c := range conns {
		if c.State != tcpEstablished {
			continue
		}
		cs := core.ConnStats{Token: c.Info.Token, Fallback: c.Info.Flags&info.FlagFallback != 0}
		if c.Mem.Known {
			cs.SendBuffer = c.Mem.SendBuffer
		}
		for _, s := range c.Subflows {
			t := s.TCP
			cs.Subflows = append(cs.Subflows, core.SubflowStats{Local: endpoint(s.Local), Remote: endpoint(s.Remote),
				RTT: t.RTT, RTTVar: t.RTTVar, MinRTT: t.MinRTT, Cwnd: t.SndCwnd, MSS: t.SndMSS, Unacked: t.Unacked,
				DeliveryRate: t.DeliveryRate, SndWnd: t.SndWnd, LastAckRecv: t.LastAckRecv,
				Backup: s.Flags&info.SubflowBackupLocal != 0})
		}
		out = append(out, cs)
	}
	return out
}

// rbpmStatus is the rbpm policy's part of the status; nil for other policies. The caller
// holds d.mu.
func (d *Daemon) rbpmStatus() *RBPMStatus {
	p, ok := d.o.Policy.(*core.RBPM)
	if !ok {
		return nil
	}
	return &RBPMStatus{Decisions: p.Counters, Connections: p.Status()}
}

// RBPMStatus is the rbpm policy's part of the status: per connection, each subflow active or
// demoted to backup, and why.
type RBPMStatus struct {
	Decisions   core.RBPMCounters `json:"decisions"`
	Connections []core.RBPMConn   `json:"connections"`
}

func writeRBPMMetrics(w *metrics.Writer, st *RBPMStatus) {
	if st == nil {
		return
	}
	w.Sample("braid_pm_rbpm_demotions_total", metrics.Counter, "Subflows the rbpm policy set to backup.", float64(st.Decisions.Demotions))
	w.Sample("braid_pm_rbpm_restores_total", metrics.Counter, "Subflows the rbpm policy restored from backup.", float64(st.Decisions.Restores))
	for _, c := range st.Connections {
		demoted := 0
		for _, s := range c.Subflows {
			if !s.Active {
				demoted++
			}
		}
		w.Sample("braid_pm_rbpm_demoted_subflows", metrics.Gauge, "Subflows the rbpm policy holds as backup, per connection.", float64(demoted), "token", fmt.Sprintf("%08x", c.Token))
	}
}

// RBPMHoldDown is the rbpm policy's least time between two changes of a subflow, in braid pm
// and in braid proxy alike.
const RBPMHoldDown = time.Second

// ErrUnknownPolicy is returned by NewPolicy for a policy it cannot build.
var ErrUnknownPolicy = errors.New("pm: unknown policy")

// NewPolicy returns the named policy among those that need nothing but the uplinks: fullmesh
// and rbpm (amptcp needs a LISP mapping system). braid pm and braid proxy both build their
// policy here, so that the proxy's rbpm is braid pm's.
func NewPolicy(name string) (core.Policy, error) {
	switch name {
	case "fullmesh":
		return core.Policies["fullmesh"], nil
	case "rbpm":
		return core.NewRBPM(RBPMHoldDown), nil
	}
	return nil, fmt.Errorf("%w %q (known without a mapping system: fullmesh, rbpm)", ErrUnknownPolicy, name)
}
