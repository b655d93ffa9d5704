package mplb

import (
	"testing"

	"braid/internal/lb/maglev"
	"braid/internal/lb/xdp"
)

// The unaware balancer of the MPLB repro must split the client's two addresses, or the
// comparison would measure nothing.
func TestMPLBUnawareSeedSplits(t *testing.T) {
	seed := MPLBUnawareSeed()
	table := maglev.Table([]maglev.Backend{{Name: "b0", ID: 0, Weight: 1}, {Name: "b1", ID: 1, Weight: 1}}, xdp.TableSize)
	a := table[xdp.FlowHash(MPLBClient[0], MPLBVIP, 0, 0, seed, true)%xdp.TableSize]
	b := table[xdp.FlowHash(MPLBClient[1], MPLBVIP, 0, 0, seed, true)%xdp.TableSize]
	if a == b {
		t.Fatalf("seed %d sends both client addresses to backend %d", seed, a)
	}
}
