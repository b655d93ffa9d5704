package tunnel

import (
	"fmt"
	"net/netip"
	"sync/atomic"
)

// A hub on every core (docs/tunnel.md): each uplink's socket may be a group of sockets bound
// to one address and port (SO_REUSEPORT, sock.ListenGroup), each read by a goroutine of its
// own. The kernel gives each datagram to the socket that the group's steering program picks
// from its GRE key modulo the group's size; the GRE key of a data packet is the receiver's
// session index, which this side chooses (reserveIndex). Every peer gets a shard when it first
// reserves an index, round robin, and keeps it for all its sessions: all of a peer's packets,
// on all its paths and across rekeys, are read by one goroutine per uplink, in the order they
// arrived; peers spread evenly over the shards. What the readers share per peer is p.mu (path
// counters, the reorder buffer), taken by one shard's readers only; what they share between
// peers is atomic counters, the lock-free tables (sessionsRO, tab) and the device.

// ShardedConn is an uplink socket that is a group of sockets: Send goes by one of them, and
// the tunnel reads each with ReadShard from a goroutine of its own.
type ShardedConn interface {
	Conn
	// Shards is the number of sockets of the group.
	Shards() int
	// ReadShard reads from socket i as BatchConn.ReadSegments does.
	ReadShard(i int, b, oob []byte) (n, seg int, src netip.AddrPort, err error)
}

// shardConn is socket i of a group, read as a Conn of its own; sends and closing go to the
// group.
type shardConn struct {
	ShardedConn
	i     int
	reads *atomic.Uint64
}

func (c shardConn) ReadSegments(b, oob []byte) (n, seg int, src netip.AddrPort, err error) {
	n, seg, src, err = c.ReadShard(c.i, b, oob)
	if err == nil {
		c.reads.Add(1)
	}
	return n, seg, src, err
}

func (c shardConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	var oob [128]byte
	n, _, src, err := c.ReadSegments(b, oob[:])
	return n, src, err
}

// SendSegments sends by the group's BatchConn when it has one, else datagram by datagram.
func (c shardConn) SendSegments(b []byte, seg int, dst netip.AddrPort) error {
	if bc, ok := c.ShardedConn.(BatchConn); ok {
		return bc.SendSegments(b, seg, dst)
	}
	var first error
	for len(b) > 0 {
		n := min(max(seg, 1), len(b))
		if err := c.Send(b[:n], dst); err != nil && first == nil {
			first = err
		}
		b = b[n:]
	}
	return first
}

// startShardReaders starts a reader per socket of u's group g (sk's conn); t.reloadMu is held.
func (t *Tunnel) startShardReaders(u *uplink, sk *upSock, g ShardedConn) {
	if n := g.Shards(); t.o.Shards > 1 && n != t.o.Shards {
		t.log.Warn("uplink socket group does not match the tunnel's shards: peers spread unevenly over its sockets",
			"uplink", u.name, "sockets", n, "shards", t.o.Shards)
	}
	reads := make([]atomic.Uint64, g.Shards())
	u.shardReads.Store(&reads)
	for i := range g.Shards() {
		c := shardConn{ShardedConn: g, i: i, reads: &reads[i]}
		t.wg.Go(func() {
			if err := t.readUplink(u, sk, c); err != nil {
				t.fail(fmt.Errorf("uplink %s, socket %d: %w", u.name, i, err))
			}
		})
	}
}

// shardOf is p's receive shard and the number of shards (1: no sharding); t.mu is held. A
// peer gets the next shard round robin the first time it asks, and keeps it.
func (t *Tunnel) shardOf(p *peer) (shard, n uint32) {
	if t.o.Shards <= 1 {
		return 0, 1
	}
	n = uint32(t.o.Shards)
	s, ok := t.shards[p.pub]
	if !ok {
		s = t.nextShard % n
		t.nextShard++
		t.shards[p.pub] = s
	}
	return s, n
}

// peerShard is the shard p's packets are steered to, -1 when there is no sharding or p has no
// shard yet.
func (t *Tunnel) peerShard(p *peer) int {
	if t.o.Shards <= 1 {
		return -1
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.shards[p.pub]; ok {
		return int(s)
	}
	return -1
}

// shardCounts is the reads of each socket of u's group, nil when it has one socket.
func (u *uplink) shardCounts() []uint64 {
	r := u.shardReads.Load()
	if r == nil {
		return nil
	}
	out := make([]uint64, len(*r))
	for i := range *r {
		out[i] = (*r)[i].Load()
	}
	return out
}
