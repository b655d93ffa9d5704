package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"braid/internal/mptcp/info"
)

// conn is one relayed connection: the site-side TCP connection and the MPTCP connection to or
// from the peer.
type conn struct {
	id     uint64
	t      *tenant
	role   string // "out": from this site to a peer; "in": from a peer to this site
	peer   string
	pr     *peer // the peer (a reload that removes or changes it cuts the connection)
	src    netip.AddrPort
	dst    netip.AddrPort
	start  time.Time
	up     atomic.Uint64 // bytes from the client towards the destination
	down   atomic.Uint64 // bytes back
	site   *net.TCPConn  // the plain TCP side
	mp     *net.TCPConn  // the MPTCP socket
	closed atomic.Bool

	sendBacklog time.Duration // Options.SendBacklog
}

// abort resets both sides.
func (c *conn) abort() {
	if c.closed.CompareAndSwap(false, true) {
		reset(c.site)
		reset(c.mp)
	}
}

func (p *Proxy) register(c *conn) {
	c.id = p.nextID.Add(1)
	c.start = time.Now()
	p.mu.Lock()
	p.conns[c.id] = c
	p.mu.Unlock()
	c.t.c.active.Add(1)
	if c.role == "out" {
		c.t.c.out.Add(1)
	} else {
		c.t.c.in.Add(1)
	}
}

func (p *Proxy) unregister(c *conn) {
	p.mu.Lock()
	delete(p.conns, c.id)
	p.mu.Unlock()
	c.t.c.active.Add(-1)
	c.t.c.bytesUp.Add(c.up.Load())
	c.t.c.bytesDown.Add(c.down.Load())
}

// copyBuf is the buffer of copies that cannot splice (one side encrypted).
const copyBuf = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, copyBuf); return &b }}

// spliceChunk bounds one splice so that the live byte counters move during long transfers.
const spliceChunk = 4 << 20

// gatedChunk is the splice between two calls of a gate.
const gatedChunk = 256 << 10

// The send backlog. MPTCP's scheduler queues data on every subflow in proportion to its
// pacing rate (the subflow whose queue would empty first gets the next chunk), and it takes
// whatever the application has written; TCP_NOTSENT_LOWAT does not bound the subflows' queues
// (measured on Linux 6.18: 1 MB queued on an LTE subflow with the namespace's lowat at
// 128 KB). On unequal paths the receiver delivers in bursts, as data from the slow path fills
// the gaps, and each burst frees megabytes of the MPTCP socket's send buffer at once, which
// the relay fills and the scheduler spreads: the LTE subflows then held up to 1 MB not yet
// sent. When the wired path fails, what it held is re-sent behind that queue, and nothing can
// be delivered until it has gone (docs/proxy.md, "Unequal paths"). So the relay writes to the
// MPTCP socket only while the subflows' unsent data (tcpi_notsent_bytes) is under
// sendBacklog's worth at their delivery rates (at least minSendBacklog), as
// TCP_NOTSENT_LOWAT would at the subflows.
const (
	minSendBacklog     = 256 << 10
	sendBacklogPoll    = 2 * time.Millisecond
	sendBacklogMaxWait = time.Second // then write anyway: the kernel's own limits apply
)

// waitSendBacklog waits until the subflows' unsent data is under the backlog allowed (or the
// connection closed, or sendBacklogMaxWait passed).
func (c *conn) waitSendBacklog() {
	var deadline time.Time
	for !c.closed.Load() {
		full, err := info.Full(c.mp)
		if err != nil {
			return
		}
		var notsent, rate uint64
		for _, s := range full.Subflows {
			if s.TCP.State != tcpEstablished || s.Flags&(info.SubflowBackupLocal|info.SubflowBackupRemote) != 0 {
				continue // a backup subflow's queue (a dead path's, set to backup) is not sent
			}
			notsent += uint64(s.TCP.NotsentBytes)
			rate += s.TCP.DeliveryRate
		}
		if notsent <= max(minSendBacklog, rate*uint64(c.sendBacklog)/uint64(time.Second)) {
			return
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(sendBacklogMaxWait)
		} else if now.After(deadline) {
			return
		}
		time.Sleep(sendBacklogPoll)
	}
}

// copyCounted copies src to dst until end of stream, adding to n as it goes. Between two
// plain TCP sockets it splices (TCPConn.ReadFrom sees through io.LimitedReader). gate, if not
// nil, is called before each write (each gatedChunk when splicing).
func copyCounted(dst, src net.Conn, n *atomic.Uint64, gate func()) error {
	if r, ok := dst.(*readyReader); ok {
		dst = r.Conn
	}
	if r, ok := src.(*readyReader); ok {
		if err := r.check(); err != nil {
			return err
		}
		src = r.Conn // plaintext: splice from here on
	}
	_, dstTCP := dst.(*net.TCPConn)
	_, srcTCP := src.(*net.TCPConn)
	if dstTCP && srcTCP {
		d := dst.(*net.TCPConn)
		lr := &io.LimitedReader{R: src}
		for {
			lr.N = spliceChunk
			if gate != nil {
				gate()
				lr.N = gatedChunk
			}
			k, err := d.ReadFrom(lr)
			n.Add(uint64(k))
			if err != nil {
				return err
			}
			if k == 0 {
				return nil
			}
		}
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if gate != nil {
				gate()
			}
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return werr
			}
			n.Add(uint64(k))
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// The first bytes a destination sends back are gathered for one write to the peer: what
// arrives until a gap of firstGatherGap, at most firstGatherMax after the first byte. Written
// as they come, a response sent in two segments (a status or header, then the body: the
// demo's traffic server sends a status byte, then the response, 45-130 us apart) makes two
// TLS records and two sends, and MPTCP's default scheduler puts the second on the subflow
// whose queue would empty first: not the one still holding the first record (unacknowledged),
// but an idle one, in the demo over the slower uplinks. The response then arrives with the
// slower path's delay: tshark on r1 showed the 1-byte record on the fibre subflow and the
// 64-byte one 20 ms later on the lte-dsl one, and such new connections took 53 ms instead of
// 32. The client side does the same with the request (appendFirstData). Timers this short can
// fire late (a 150 us sleep overran a 500 us deadline in a unit test), so a response sent in
// one segment can wait up to about firstGatherMax, once per connection.
const (
	firstGatherGap = 500 * time.Microsecond
	firstGatherMax = time.Millisecond
)

// copyFirst copies src's first bytes to dst in one write, with what follows them within
// firstGatherGap (at most firstGatherMax in all, or a full buffer). It returns io.EOF when
// the stream ended within them.
func copyFirst(dst, src net.Conn, n *atomic.Uint64) error {
	if r, ok := dst.(*readyReader); ok {
		dst = r.Conn
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	k, err := src.Read(buf)
	end := time.Now().Add(firstGatherMax)
	for err == nil && k > 0 && k < len(buf) {
		dl := time.Now().Add(firstGatherGap)
		if dl.After(end) {
			dl = end
		}
		if err = src.SetReadDeadline(dl); err != nil {
			break
		}
		var more int
		more, err = src.Read(buf[k:])
		k += more
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = nil
			break
		}
	}
	if derr := src.SetReadDeadline(time.Time{}); err == nil {
		err = derr
	}
	if k > 0 {
		if _, werr := dst.Write(buf[:k]); werr != nil {
			return werr
		}
		n.Add(uint64(k))
	}
	return err
}

// halfCloser is a connection whose write side can be shut on its own (TCP: FIN; TLS:
// close_notify).
type halfCloser interface{ CloseWrite() error }

// relay copies both ways between the site side s and the peer side m until both directions
// have ended. An end of stream is passed on as a half-close; an error (a reset, a timeout)
// resets both connections, so that each end sees the failure.
func relay(c *conn, s, m net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	fail := func() {
		c.abort()
		s.Close() // both copies return now
		m.Close()
	}
	one := func(dst, src net.Conn, n *atomic.Uint64, gate func(), first bool) {
		defer wg.Done()
		var err error
		if first {
			err = copyFirst(dst, src, n)
		}
		if err == nil {
			err = copyCounted(dst, src, n, gate)
		}
		if errors.Is(err, io.EOF) {
			err = nil // the first bytes were the whole stream
		} else if err != nil {
			fail()
			return
		}
		if hc, ok := dst.(halfCloser); ok {
			if hc.CloseWrite() != nil {
				fail()
			}
		}
	}
	var gate func()
	if c.sendBacklog > 0 && c.mp != nil {
		gate = func() { c.waitSendBacklog() }
	}
	// At the far side the destination's first bytes leave in one write (copyFirst).
	go one(m, s, &c.up, gate, c.role == "in")
	go one(s, m, &c.down, nil, false)
	wg.Wait()
	if c.closed.CompareAndSwap(false, true) {
		s.Close()
		m.Close()
	}
}
