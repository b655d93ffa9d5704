package app

import (
	"testing"
	"time"

	"braid/internal/experiment/federation"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

// TestProxyNewConnectionUnequalDelay sends files through braid proxy, each on a new pooled
// connection, over two uplinks of very unequal delay: the first (the MPTCP connection's initial
// subflow) 10 Mbit/s at 150 ms one way, the second 50 Mbit/s at 5 ms. The receiving proxy's
// kernel gets the data of the slow subflow behind the data of the fast ones; with the kernel's
// default receive buffer of a new connection (128 KB), data ahead of a gap fills the
// connection's buffer and the gap, which sits in the slow subflow's own queue, is never moved
// in: the file stops for good (sockopt.go, mptcpRcvBuf). Every file must arrive whole and
// intact, none going 10 s without progress, in both directions.
func TestProxyNewConnectionUnequalDelay(t *testing.T) {
	slow := topo.Shape{Rate: 10e6, Delay: 150 * time.Millisecond}
	fast := topo.Shape{Rate: 30e6, Delay: 5 * time.Millisecond}
	mid := topo.Shape{Rate: 30e6, Delay: 40 * time.Millisecond}
	ctx, f := startFedLab(t, 4*time.Minute, slow, fast, mid)
	cfg := federation.FedMPTCP4
	cfg.Uplinks = 3
	if err := f.Use(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	for i := 0; i < 6; i++ {
		reverse := i%2 == 1
		start := time.Now()
		r, err := traffic.File(ctx, f.Dial(), federation.FedServerAddr, traffic.FileOptions{Size: size, Seed: uint64(i + 1), Reverse: reverse, IdleTimeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("file %d (%d MiB, download %v) after %v: %v\n%s", i, size>>20, reverse, time.Since(start).Round(time.Millisecond), err, f.Logs())
		}
		if !r.Intact || r.Bytes != size {
			t.Fatalf("file %d (download %v): %d of %d bytes, intact %v", i, reverse, r.Bytes, size, r.Intact)
		}
		t.Logf("file %d (%d MiB, download %v): %v", i, size>>20, reverse, r.Duration.Round(time.Millisecond))
	}
}
