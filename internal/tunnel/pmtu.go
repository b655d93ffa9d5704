package tunnel

import (
	"time"

	"braid/internal/tunnel/path"
	"braid/internal/tunnel/session"
	"braid/internal/wire/mpath"
)

// minMTU is the smallest tunnel MTU: what IPv6 needs of every link. A path whose MTU carries
// less is still used, and packets between its size and minMTU are lost on it: the log says so.
const minMTU = 1280

// probeMTU runs a path's MTU search: it starts again when the path comes (back) up, and sends
// the probe the search asks for. before and after are the path's state around this tick.
func (t *Tunnel) probeMTU(now int64, p *peer, pp *peerPath, before path.State, after path.Snapshot) {
	if after.State != path.Up || pp.admin {
		return
	}
	p.mu.Lock()
	if before != path.Up {
		pp.pmtu.Reset(now)
	}
	// An ack takes a round trip plus the peer's scheduling; a lost probe costs this long.
	timeout := max(3*int64(after.SRTT), int64(200*time.Millisecond))
	seq, size, due := pp.pmtu.Next(now, timeout)
	p.mu.Unlock()
	if !due {
		return
	}
	pr := mpath.Probe{Seq: seq, Timestamp: t.micros(now)}
	pr.Padding = size - pp.outer - (greLen + mpath.HeaderLen + mpath.ProbeMinLen + session.Overhead)
	if pr.Padding < 0 {
		pr.Padding = 0
	}
	t.sendSealed(p, pp, mpath.TypeMTUProbe, pr.Encode)
}

// updateMTU sets the tunnel MTU from the smallest path MTU among the usable paths (Up, not
// searching), between minMTU and the MTU the tunnel started with, and tells the device.
func (t *Tunnel) updateMTU() {
	want := 0
	for _, p := range t.peerList() {
		p.mu.Lock()
		for _, pp := range p.paths {
			if pp.admin || pp.est.State() != path.Up || pp.pmtu.Searching() {
				continue
			}
			if m := pp.pmtu.Value() - pp.outer - Overhead; want == 0 || m < want {
				want = m
			}
		}
		p.mu.Unlock()
	}
	if want == 0 {
		return // no usable path: keep what there is
	}
	if want < minMTU {
		if !t.mtuWarned {
			t.log.Warn("a path carries less than the minimum tunnel MTU: larger packets are lost on it", "path_mtu_inner", want, "tunnel_mtu", minMTU)
			t.mtuWarned = true
		}
		want = minMTU
	}
	want = min(want, t.o.MTU)
	cur := int(t.mtu.Load())
	if want == cur {
		return
	}
	if t.o.SetMTU == nil {
		if want < cur && !t.mtuWarned {
			t.log.Warn("a path carries less than the configured tunnel MTU: lower 'mtu' in the site file", "path_mtu_inner", want, "tunnel_mtu", cur)
			t.mtuWarned = true
		}
		return
	}
	if err := t.o.SetMTU(want); err != nil {
		t.log.Error("tunnel mtu", "mtu", want, "err", err)
		return
	}
	t.mtu.Store(int64(want))
	t.log.Info("tunnel mtu", "from", cur, "to", want)
}
