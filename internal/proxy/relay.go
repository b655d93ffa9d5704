package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// conn is one relayed connection: the site-side TCP connection and the MPTCP connection to or
// from the peer.
type conn struct {
	id     uint64
	t      *tenant
	role   string // "out": from this site to a peer; "in": from a peer to this site
	peer   string
	src    netip.AddrPort
	dst    netip.AddrPort
	start  time.Time
	up     atomic.Uint64 // bytes from the client towards the destination
	down   atomic.Uint64 // bytes back
	site   *net.TCPConn  // the plain TCP side
	mp     *net.TCPConn  // the MPTCP socket
	closed atomic.Bool
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

// copyCounted copies src to dst until end of stream, adding to n as it goes. Between two
// plain TCP sockets it splices (TCPConn.ReadFrom sees through io.LimitedReader).
func copyCounted(dst, src net.Conn, n *atomic.Uint64) error {
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
	one := func(dst, src net.Conn, n *atomic.Uint64) {
		defer wg.Done()
		if err := copyCounted(dst, src, n); err != nil {
			fail()
			return
		}
		if hc, ok := dst.(halfCloser); ok {
			if hc.CloseWrite() != nil {
				fail()
			}
		}
	}
	go one(m, s, &c.up)
	go one(s, m, &c.down)
	wg.Wait()
	if c.closed.CompareAndSwap(false, true) {
		s.Close()
		m.Close()
	}
}
