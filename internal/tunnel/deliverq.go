package tunnel

// A peer's packets are read by several goroutines: one per uplink (and per socket of an
// uplink's group, shard.go), and the timers, which release what the reorder buffer held too
// long. The reorder buffer puts them in order under p.mu, but a goroutine writes what it
// released after letting go of the lock, so two goroutines could write a peer's packets to
// the device in the wrong order. The packets released therefore go into the peer's delivery
// queue, in the order released, and one goroutine at a time (the drainer) writes the queue
// out: whoever finds no drainer becomes it; the others leave their packets to it and go on,
// so that no reader waits for another or holds a lock across a device write.

// rxQueue is a peer's delivery queue; p.mu guards it.
type rxQueue struct {
	queue, spare []*packetBuf
	draining     bool
}

// add queues the packets out released (p.mu held) and notes p in ob, whose flush drains the
// queue.
func (q *rxQueue) add(p *peer, out []*packetBuf, ob *outbox) {
	if len(out) == 0 {
		return
	}
	q.queue = append(q.queue, out...)
	for _, o := range ob.peers {
		if o == p {
			return
		}
	}
	ob.peers = append(ob.peers, p)
}

// drain writes p's queue to the device through ob, unless another goroutine is doing so, in
// which case that one writes these packets too.
func (q *rxQueue) drain(t *Tunnel, p *peer, ob *outbox) {
	p.mu.Lock()
	if q.draining {
		p.mu.Unlock()
		return
	}
	q.draining = true
	for len(q.queue) > 0 {
		batch := q.queue
		q.queue, q.spare = q.spare[:0], nil
		p.mu.Unlock()
		for _, pb := range batch {
			ob.add(pb)
		}
		ob.write(t)
		clear(batch)
		p.mu.Lock()
		q.spare = batch[:0]
	}
	q.draining = false
	p.mu.Unlock()
}
