package pm_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/pm/core"
	"braid/internal/mptcp/pmnl"
)

// hostileAnnounced is how many addresses the hostile peer announces on the connection: all in
// 198.51.100.0/24, which a routes to b and b drops (and counts) on arrival, so that every join
// to them crosses the link and never comes up.
const hostileAnnounced = 24

// hostileRun is what one run against the hostile peer measured.
type hostileRun struct {
	announced   int // ADD_ADDRs the peer's kernel accepted to send
	synsEarly   int // MP_JOIN SYNs to the announced addresses that reached b by 5 s after the announcements
	synsLate    int // the same by 9 s
	distinct    int // announced addresses a sent any SYN to
	counters    core.Counters
	bytesLate   int64 // payload b received between 5 s and 9 s
	announceErr string
}

// runHostilePeer brings up two hosts on two links; b is a hostile MPTCP peer that runs the
// userspace PM itself and announces hostileAnnounced unreachable addresses on a's connection;
// a runs braid pm (fullmesh over both links) with cfg and sends data to b all along.
func runHostilePeer(t *testing.T, name string, cfg core.Config) hostileRun {
	t.Helper()
	shape := topo.Shape{Rate: 20e6, Delay: time.Millisecond}
	l := labtest.Up(t, kit.ParallelLinks(name, shape, shape))
	a, b := l.Host("a"), l.Host("b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// b counts (and drops) every SYN without ACK to the announced range, and remembers the
	// destinations.
	rules := `table inet hostile {
	counter joins { }
	set seen { type ipv4_addr; size 256; flags dynamic; }
	chain pre {
		type filter hook prerouting priority -300; policy accept;
		ip daddr 198.51.100.0/24 tcp flags & (syn | ack) == syn update @seen { ip daddr } counter name "joins" drop
	}
}
`
	rf := filepath.Join(t.TempDir(), "hostile.nft")
	if err := os.WriteFile(rf, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := b.Run(ctx, "nft", "-f", rf); err != nil {
		t.Fatalf("nft on b: %v: %s", err, out)
	}
	if out, err := a.Run(ctx, "ip", "route", "add", "198.51.100.0/24", "via", "10.9.0.2"); err != nil {
		t.Fatalf("route on a: %v: %s", err, out)
	}

	// b: the userspace PM, so that b's own program chooses what to announce.
	if err := b.NS.Sysctl("mptcp/pm_type", "1"); err != nil {
		t.Fatal(err)
	}
	var bEvents *pmnl.Stream
	var bClient *pmnl.Client
	if err := b.NS.Do(func() (err error) {
		if bEvents, err = pmnl.Subscribe(pmnl.Options{}); err != nil {
			return err
		}
		bClient, err = pmnl.Dial(pmnl.Options{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer bEvents.Close()
	defer bClient.Close()

	var received atomic.Int64
	ln := listenMPTCP(t, b, "0.0.0.0:5000")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					received.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()

	d := startPMWith(t, l, a, cfg)
	c, err := mptcpDial(a, "10.9.0.1:0", true)(ctx, "tcp", "10.9.0.2:5000")
	if err != nil {
		t.Fatal(err)
	}
	sendCtx, stopSend := context.WithCancel(ctx)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		buf := make([]byte, 16<<10)
		for sendCtx.Err() == nil {
			c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := c.Write(buf); err != nil && !isTimeout(err) {
				return
			}
		}
	}()
	defer func() { stopSend(); c.Close(); <-sent }()

	var token uint32
	for token == 0 {
		e, err := bEvents.Next(ctx)
		if err != nil {
			t.Fatalf("b saw no established connection: %v", err)
		}
		if e.Type == pmnl.EventEstablished {
			token = e.Token
		}
	}
	var run hostileRun
	// One ADD_ADDR at a time may be pending in the kernel: retry each until it is taken.
	for i := 1; i <= hostileAnnounced; i++ {
		addr := pmnl.Addr{ID: uint8(i), Addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})}
		for try := 0; ; try++ {
			err := bClient.Announce(ctx, token, addr)
			if err == nil {
				run.announced++
				break
			}
			if try == 50 {
				run.announceErr = err.Error()
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t0 := time.Now()
	time.Sleep(time.Until(t0.Add(5 * time.Second)))
	run.synsEarly, _ = hostileCounts(t, ctx, b)
	early := received.Load()
	time.Sleep(time.Until(t0.Add(9 * time.Second)))
	run.synsLate, run.distinct = hostileCounts(t, ctx, b)
	run.bytesLate = received.Load() - early
	run.counters = d.Status().Counters
	return run
}

var (
	nftPackets = regexp.MustCompile(`packets (\d+)`)
	nftSeen    = regexp.MustCompile(`198\.51\.100\.\d+`)
)

// hostileCounts reads b's count of join SYNs to the announced range and how many distinct
// announced addresses they went to.
func hostileCounts(t *testing.T, ctx context.Context, b *lab.Host) (syns, distinct int) {
	t.Helper()
	out, err := b.Run(ctx, "nft", "list", "counter", "inet", "hostile", "joins")
	if err != nil {
		t.Fatalf("nft list counter: %v: %s", err, out)
	}
	m := nftPackets.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no packet count in %q", out)
	}
	syns, _ = strconv.Atoi(string(m[1]))
	out, err = b.Run(ctx, "nft", "list", "set", "inet", "hostile", "seen")
	if err != nil {
		t.Fatalf("nft list set: %v: %s", err, out)
	}
	return syns, len(nftSeen.FindAll(out, -1))
}

func listenMPTCP(t *testing.T, h *lab.Host, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := h.NS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// A hostile MPTCP peer announces 24 addresses nobody answers on a connection braid pm serves
// (issue 18 item 14), across the lab's links: braid pm joins at most max_announced (8) of them,
// gives each up after join_attempts failed joins (RFC 8684 3.4.1), so that the MP_JOIN SYNs
// that reach the peer stop growing within 5 s, and the connection's data keeps flowing. A
// second run with the caps and the join backoff lifted (max_announced 255, join_attempts 1000,
// join_backoff_max 0) is the control: there the same counts show all 24 addresses joined and
// the SYNs still growing, so the first run's figures are the caps' doing and not the
// measurement's blindness.
func TestPMHostilePeerLab(t *testing.T) {
	capped := runHostilePeer(t, "pmhost", core.Config{})
	t.Logf("defaults (max_announced 8, join_attempts 2): %d announced, SYNs to them %d at 5 s and %d at 9 s, to %d addresses; announce_capped %d, joins_abandoned %d, join_timeouts %d; %d bytes received from 5 to 9 s",
		capped.announced, capped.synsEarly, capped.synsLate, capped.distinct, capped.counters.AnnounceCapped,
		capped.counters.JoinsAbandoned, capped.counters.JoinTimeouts, capped.bytesLate)
	if capped.announced != hostileAnnounced {
		t.Fatalf("the peer announced %d of %d addresses (%s): the attack was not performed", capped.announced, hostileAnnounced, capped.announceErr)
	}
	const maxAnnounced, joinAttempts, uplinks = 8, 2, 2
	if capped.distinct == 0 {
		t.Error("no join reached the peer: the attack did not cross the network")
	}
	if capped.distinct > maxAnnounced {
		t.Errorf("joins went to %d announced addresses, want at most max_announced %d", capped.distinct, maxAnnounced)
	}
	if capped.counters.AnnounceCapped == 0 {
		t.Error("announce_capped is 0 after 24 announcements")
	}
	if capped.counters.JoinsAbandoned == 0 {
		t.Error("joins_abandoned is 0: no announced endpoint was given up")
	}
	// each taken endpoint: join_attempts joins per uplink, each an initial SYN and at most
	// one retransmission before the join times out
	if bound := maxAnnounced * uplinks * joinAttempts * 2; capped.synsLate > bound {
		t.Errorf("%d join SYNs reached the peer, want at most %d", capped.synsLate, bound)
	}
	if capped.synsLate != capped.synsEarly {
		t.Errorf("join SYNs still growing after the endpoints should have been given up: %d at 5 s, %d at 9 s", capped.synsEarly, capped.synsLate)
	}
	if capped.bytesLate == 0 {
		t.Error("the connection's data stopped flowing under the announcements")
	}

	open := runHostilePeer(t, "pmhoc", core.Config{MaxAnnounced: 255, JoinAttempts: 1000, MaxJoinBackoff: -1})
	t.Logf("control, caps and backoff lifted: %d announced, SYNs to them %d at 5 s and %d at 9 s, to %d addresses; announce_capped %d, joins_abandoned %d",
		open.announced, open.synsEarly, open.synsLate, open.distinct, open.counters.AnnounceCapped, open.counters.JoinsAbandoned)
	if open.distinct <= maxAnnounced || open.synsLate <= open.synsEarly {
		t.Errorf("control: without the caps the same measurement shows %d addresses joined and SYNs %d -> %d; it cannot tell the caps' effect",
			open.distinct, open.synsEarly, open.synsLate)
	}
}
