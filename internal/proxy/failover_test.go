package proxy

import (
	"net/netip"
	"testing"
	"time"

	"braid/internal/mptcp/info"
)

func sub(local string, unacked uint32, lastAck, rtt time.Duration) info.Subflow {
	return info.Subflow{Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort("10.9.0.2:7101"),
		TCP: info.TCPInfo{State: tcpEstablished, Unacked: unacked, LastAckRecv: lastAck, RTT: rtt}}
}

func kinds(as []failAction) map[string]failKind {
	m := map[string]failKind{}
	for _, a := range as {
		m[a.sub.Local.String()] = a.kind
	}
	return m
}

func TestFailoverDecide(t *testing.T) {
	t0 := time.Unix(1000, 0)
	marked, closed := map[subflowKey]time.Time{}, map[subflowKey]bool{}
	fibre, lte := "10.9.0.1:45000", "10.9.1.1:45001"

	// Both acknowledged: nothing to do. Data in flight but acked recently: alive.
	if got := failoverDecide(t0, 1, []info.Subflow{sub(fibre, 10, 20*time.Millisecond, 10*time.Millisecond), sub(lte, 0, time.Second, 50*time.Millisecond)}, marked, closed, nil, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("healthy: %v", got)
	}
	// A long path is not dead before one and a half of its RTTs.
	if got := failoverDecide(t0, 1, []info.Subflow{sub(fibre, 10, 170*time.Millisecond, 120*time.Millisecond), sub(lte, 0, 0, 50*time.Millisecond)}, marked, closed, nil, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("within 1.5 RTTs: %v", got)
	}
	// Base RTTs count, not smoothed ones: a full queue doubles the smoothed RTT.
	queued := sub(fibre, 10, 250*time.Millisecond, 240*time.Millisecond)
	queued.TCP.MinRTT = 120 * time.Millisecond
	if got := kinds(failoverDecide(t0, 7, []info.Subflow{queued, sub(lte, 2, 5*time.Millisecond, 50*time.Millisecond)}, map[subflowKey]time.Time{}, map[subflowKey]bool{}, nil, 0, time.Time{})); got[fibre] != failBackup {
		t.Fatalf("silent for two base RTTs: %v", got)
	}
	// Nor before its retransmission timeout: an LTE subflow behind its sibling's data in the
	// shared queue, 244 ms without an acknowledgement.
	behind := sub(lte, 36, 244*time.Millisecond, 300*time.Millisecond)
	behind.TCP.MinRTT, behind.TCP.RTTVar = 160*time.Millisecond, 10*time.Millisecond
	if got := failoverDecide(t0, 10, []info.Subflow{behind, sub("10.9.1.1:45002", 30, 5*time.Millisecond, 300*time.Millisecond)}, map[subflowKey]time.Time{}, map[subflowKey]bool{}, nil, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("within its RTO: %v", got)
	}
	// The fibre stops acknowledging: backup.
	subs := []info.Subflow{sub(fibre, 10, 300*time.Millisecond, 10*time.Millisecond), sub(lte, 2, 5*time.Millisecond, 50*time.Millisecond)}
	got := kinds(failoverDecide(t0, 1, subs, marked, closed, nil, 0, time.Time{}))
	if got[fibre] != failBackup || len(got) != 1 {
		t.Fatalf("dead fibre: %v", got)
	}
	marked[subflowKey{1, subs[0].Local, subs[0].Remote}] = t0
	// Still dead at the next poll: close it.
	got = kinds(failoverDecide(t0.Add(failoverPoll), 1, subs, marked, closed, nil, 0, time.Time{}))
	if got[fibre] != failClose {
		t.Fatalf("dead for long: %v", got)
	}
	// Acknowledged again before that: restore.
	back := []info.Subflow{sub(fibre, 0, 400*time.Millisecond, 10*time.Millisecond), subs[1]}
	if got := kinds(failoverDecide(t0.Add(100*time.Millisecond), 1, back, marked, closed, nil, 0, time.Time{})); got[fibre] != failRestore {
		t.Fatalf("acked again: %v", got)
	}
	// A closed subflow still listed is left alone.
	closed[subflowKey{1, subs[0].Local, subs[0].Remote}] = true
	if got := failoverDecide(t0.Add(2*failoverPoll), 1, subs, marked, closed, nil, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("closed: %v", got)
	}
	// Nothing moves when no other non-backup subflow is alive.
	both := []info.Subflow{sub(fibre, 10, time.Second, 10*time.Millisecond), sub(lte, 5, time.Second, 10*time.Millisecond)}
	if got := failoverDecide(t0, 2, both, map[subflowKey]time.Time{}, map[subflowKey]bool{}, nil, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("all dead: %v", got)
	}
	// A join in its handshake (SYN_SENT) is not judged.
	joining := sub(fibre, 1, time.Second, 0)
	joining.TCP.State = 2
	if got := failoverDecide(t0, 5, []info.Subflow{joining, subs[1]}, map[subflowKey]time.Time{}, map[subflowKey]bool{}, nil, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("joining: %v", got)
	}
	// An idle subflow's last acknowledgement is old (an answer to a keepalive, up to a second
	// and an RTT); its first data, sent 10 ms ago, does not make it dead. The same data
	// unacknowledged for 300 ms does.
	idle := []info.Subflow{sub(fibre, 1, time.Second, 10*time.Millisecond), sub(lte, 0, time.Second, 50*time.Millisecond)}
	busy := map[subflowKey]time.Time{{6, idle[0].Local, idle[0].Remote}: t0.Add(-10 * time.Millisecond)}
	if got := failoverDecide(t0, 6, idle, map[subflowKey]time.Time{}, map[subflowKey]bool{}, busy, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("first data after idle: %v", got)
	}
	if got := kinds(failoverDecide(t0.Add(300*time.Millisecond), 6, idle, map[subflowKey]time.Time{}, map[subflowKey]bool{}, busy, 0, time.Time{})); got[fibre] != failBackup {
		t.Fatalf("unacknowledged since the data left: %v", got)
	}
	// The receiving end: nothing in flight, but nothing heard from the peer for longer than
	// its keepalives allow: closed (while another subflow is alive).
	quiet := []info.Subflow{sub(fibre, 0, 3*time.Second, 120*time.Millisecond), sub(lte, 0, 20*time.Millisecond, 160*time.Millisecond)}
	if got := kinds(failoverDecide(t0, 8, quiet, map[subflowKey]time.Time{}, map[subflowKey]bool{}, nil, 0, time.Time{})); got[fibre] != failClose || len(got) != 1 {
		t.Fatalf("peer silent: %v", got)
	}
	// An idle subflow whose keepalives are answered is left alone.
	idleOK := []info.Subflow{sub(fibre, 0, 1100*time.Millisecond, 120*time.Millisecond), sub(lte, 0, 20*time.Millisecond, 160*time.Millisecond)}
	if got := failoverDecide(t0, 9, idleOK, map[subflowKey]time.Time{}, map[subflowKey]bool{}, nil, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("idle, keepalives answered: %v", got)
	}
	// One subflow: nothing to fail over to.
	if got := failoverDecide(t0, 4, subs[:1], map[subflowKey]time.Time{}, map[subflowKey]bool{}, nil, 0, time.Time{}); len(got) != 0 {
		t.Fatalf("one subflow: %v", got)
	}
}

// On the federation paper's links a cut of the wired uplink found the LTE subflows with 0.2 and
// 0.8 MB queued and not sent, which the dead subflow's re-sent data would have waited behind.
func TestFailoverBacklog(t *testing.T) {
	t0 := time.Unix(1000, 0)
	wired, cross, lte := "10.9.0.2:7101", "10.9.1.2:7101", "10.9.0.2:7102"
	mk := func(local string, notsent uint32, rate uint64) info.Subflow {
		s := sub(local, 100, 5*time.Millisecond, 300*time.Millisecond)
		s.TCP.MinRTT, s.TCP.NotsentBytes, s.TCP.DeliveryRate = 160*time.Millisecond, notsent, rate
		return s
	}
	dead := sub(wired, 800, 300*time.Millisecond, 240*time.Millisecond)
	dead.TCP.MinRTT = 120 * time.Millisecond
	subs := []info.Subflow{dead, mk(cross, 814_000, 600_000), mk(lte, 215_000, 650_000)}
	marked := map[subflowKey]time.Time{{3, dead.Local, dead.Remote}: t0}
	// Marking alone resets nothing.
	if got := kinds(failoverDecide(t0, 3, subs, map[subflowKey]time.Time{}, map[subflowKey]bool{}, nil, 100*time.Millisecond, time.Time{})); got[wired] != failBackup || len(got) != 1 {
		t.Fatalf("backup: %v", got)
	}
	// Instead of closing the dead one, the live subflow with the longer queue is reset (its
	// close re-sends the dead one's data too); the other is kept.
	got := kinds(failoverDecide(t0.Add(failoverPoll), 3, subs, marked, map[subflowKey]bool{}, nil, 100*time.Millisecond, time.Time{}))
	if got[cross] != failAbort || len(got) != 1 {
		t.Fatalf("close with backlog: %v", got)
	}
	// Within reinjectHold of that, the dead one is not closed: the kernel would queue the
	// same data again. After it, it is.
	if got := kinds(failoverDecide(t0.Add(2*failoverPoll), 3, []info.Subflow{dead, subs[2]}, marked, map[subflowKey]bool{}, nil, 100*time.Millisecond, t0.Add(failoverPoll))); len(got) != 0 {
		t.Fatalf("held: %v", got)
	}
	if got := kinds(failoverDecide(t0.Add(reinjectHold+2*failoverPoll), 3, []info.Subflow{dead, subs[2]}, marked, map[subflowKey]bool{}, nil, 100*time.Millisecond, t0.Add(failoverPoll))); got[wired] != failClose {
		t.Fatalf("after the hold: %v", got)
	}
	// Two dead subflows: one close.
	dead2 := dead
	dead2.Local = netip.MustParseAddrPort("10.9.1.2:7102")
	marked[subflowKey{3, dead2.Local, dead2.Remote}] = t0
	if got := failoverDecide(t0.Add(failoverPoll), 3, []info.Subflow{dead, dead2, subs[2]}, marked, map[subflowKey]bool{}, nil, 100*time.Millisecond, time.Time{}); len(got) != 1 || got[0].kind != failClose {
		t.Fatalf("two dead: %v", got)
	}
	// Off (0): only the close.
	if got := kinds(failoverDecide(t0.Add(failoverPoll), 3, subs, marked, map[subflowKey]bool{}, nil, 0, time.Time{})); len(got) != 1 {
		t.Fatalf("backlog rule off: %v", got)
	}
	// Short queues are kept.
	short := []info.Subflow{dead, mk(cross, 30_000, 600_000), mk(lte, 10_000, 650_000)}
	if got := kinds(failoverDecide(t0.Add(failoverPoll), 3, short, marked, map[subflowKey]bool{}, nil, 100*time.Millisecond, time.Time{})); len(got) != 1 {
		t.Fatalf("short queues: %v", got)
	}
	// The only live subflow is never reset, however long its queue.
	one := []info.Subflow{dead, mk(cross, 814_000, 600_000)}
	if got := kinds(failoverDecide(t0.Add(failoverPoll), 3, one, marked, map[subflowKey]bool{}, nil, 100*time.Millisecond, time.Time{})); len(got) != 1 {
		t.Fatalf("one live subflow: %v", got)
	}
}

func TestDeliveredUnacked(t *testing.T) {
	busy := sub("10.9.0.1:45000", 10, 0, 50*time.Millisecond)
	busy.TCP.SndMSS, busy.TCP.NotsentBytes = 1400, 6000
	closed := sub("10.9.1.1:45001", 30, 0, 50*time.Millisecond)
	closed.TCP.State, closed.TCP.SndMSS = 7, 1400 // a closed first subflow's stale counters
	// 100 000 bytes sent and not acknowledged; the live subflow holds 14 000 in flight and 6 000
	// queued: 80 000 were delivered by the subflows.
	ci := info.ConnInfo{BytesSent: 1_100_000, BytesAcked: 1_000_000}
	if got := deliveredUnacked(ci, []info.Subflow{busy, closed}); got != 80000 {
		t.Errorf("delivered and unacknowledged: %d, want 80000", got)
	}
	// The subflows hold more than is outstanding (segments counted at a full MSS): none.
	if got := deliveredUnacked(info.ConnInfo{BytesSent: 10_000, BytesAcked: 0}, []info.Subflow{busy}); got != 0 {
		t.Errorf("all held: %d, want 0", got)
	}
	// A kernel without the byte counts: 0.
	if got := deliveredUnacked(info.ConnInfo{}, []info.Subflow{busy}); got != 0 {
		t.Errorf("no counts: %d", got)
	}
}
