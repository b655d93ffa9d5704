package traffic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Server answers every test of this package: one TCP listener serves Bulk, RR, File and the
// control connections of UDP tests; one UDP socket receives the datagrams of UDP tests.
type Server struct {
	tcp net.Listener
	udp net.PacketConn
	cfg serverConfig

	mu       sync.Mutex
	serving  bool
	shut     bool
	conns    map[net.Conn]struct{}
	bulk     map[uint64]*bulkTest
	fatalErr error

	udpMu    sync.RWMutex
	udpTests map[uint64]*udpTest

	closed    chan struct{}
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup // the accept and UDP loops and every connection handler

	accepted, rejected, active, ignored atomic.Int64
}

// ServerOption configures a Server.
type ServerOption func(*serverConfig)

type serverConfig struct {
	headerTimeout time.Duration
	idleTimeout   time.Duration
}

// WithHeaderTimeout sets how long a new connection may take to send its header (default 10 s);
// a connection that is slower is rejected.
func WithHeaderTimeout(d time.Duration) ServerOption {
	return func(c *serverConfig) {
		if d > 0 {
			c.headerTimeout = d
		}
	}
}

// WithIdleTimeout sets how long any read or write of an established connection may go without
// progress before the server drops the connection (default 30 s).
func WithIdleTimeout(d time.Duration) ServerOption {
	return func(c *serverConfig) {
		if d > 0 {
			c.idleTimeout = d
		}
	}
}

// Stats are the server's counters.
type Stats struct {
	Accepted int64 `json:"accepted"` // TCP connections accepted
	Rejected int64 `json:"rejected"` // connections closed because of a bad header or a refused request
	Active   int64 `json:"active"`   // TCP connections open now
	Ignored  int64 `json:"ignored"`  // UDP datagrams that belonged to no running test
}

// NewServer returns a server for tcp and udp; udp may be nil, and then UDP tests are refused.
// The server owns both sockets from now on: Close (or the end of Serve) closes them.
func NewServer(tcp net.Listener, udp net.PacketConn, opts ...ServerOption) *Server {
	s := &Server{
		tcp:      tcp,
		udp:      udp,
		cfg:      serverConfig{headerTimeout: 10 * time.Second, idleTimeout: 30 * time.Second},
		conns:    make(map[net.Conn]struct{}),
		bulk:     make(map[uint64]*bulkTest),
		udpTests: make(map[uint64]*udpTest),
		closed:   make(chan struct{}),
	}
	for _, o := range opts {
		o(&s.cfg)
	}
	// A measuring receiver must not be where datagrams are lost: ask for a large buffer (the
	// kernel caps it at net.core.rmem_max unless we may force it).
	if u, ok := udp.(interface{ SetReadBuffer(int) error }); ok {
		u.SetReadBuffer(udpReadBuffer)
	}
	return s
}

// udpReadBuffer is the receive buffer the server asks for its UDP socket.
const udpReadBuffer = 8 << 20

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		Accepted: s.accepted.Load(),
		Rejected: s.rejected.Load(),
		Active:   s.active.Load(),
		Ignored:  s.ignored.Load(),
	}
}

// Serve accepts connections and datagrams until ctx is done or Close is called. Before it
// returns, every goroutine it started has stopped and every connection is closed. It returns nil
// after Close, ctx.Err() when ctx ended it, and an error if the listener failed.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		return errors.New("traffic: Serve called twice")
	}
	s.serving = true
	s.mu.Unlock()
	if s.tcp == nil {
		s.Close()
		return errors.New("traffic: Serve: no TCP listener")
	}
	s.wg.Go(s.acceptLoop)
	if s.udp != nil {
		s.wg.Go(s.udpLoop)
	}
	var ctxErr error
	select {
	case <-ctx.Done():
		ctxErr = ctx.Err()
		s.Close()
	case <-s.closed:
	}
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fatalErr != nil {
		return s.fatalErr
	}
	return ctxErr
}

// Close stops the server: it closes the sockets and every open connection, which ends the
// running tests (their clients get an error). It is idempotent; Serve returns after it.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.mu.Lock()
		s.shut = true
		conns := s.conns
		s.conns = map[net.Conn]struct{}{}
		s.mu.Unlock()
		if s.tcp != nil {
			if err := s.tcp.Close(); err != nil {
				s.closeErr = fmt.Errorf("traffic: close listener: %w", err)
			}
		}
		if s.udp != nil {
			if err := s.udp.Close(); err != nil && s.closeErr == nil {
				s.closeErr = fmt.Errorf("traffic: close UDP socket: %w", err)
			}
		}
		for c := range conns {
			c.Close()
		}
	})
	return s.closeErr
}

func (s *Server) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

func (s *Server) acceptLoop() {
	backoff := 5 * time.Millisecond
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			if s.isClosed() {
				return
			}
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				select {
				case <-time.After(backoff):
				case <-s.closed:
					return
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			s.mu.Lock()
			s.fatalErr = fmt.Errorf("traffic: accept: %w", err)
			s.mu.Unlock()
			s.Close()
			return
		}
		backoff = 5 * time.Millisecond
		s.mu.Lock()
		if s.shut {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.accepted.Add(1)
		s.active.Add(1)
		s.wg.Go(func() {
			defer s.release(c)
			s.handle(c)
		})
	}
}

// release closes c and forgets it.
func (s *Server) release(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.active.Add(-1)
}

func (s *Server) handle(c net.Conn) {
	c.SetDeadline(time.Now().Add(s.cfg.headerTimeout))
	h, err := ReadHeader(c)
	if err != nil {
		s.reject(c, statusBadHeader)
		return
	}
	c.SetDeadline(time.Time{})
	switch h.Mode {
	case ModeBulkUpload, ModeBulkDownload:
		s.serveBulkControl(c, h)
	case ModeBulkData:
		s.serveBulkData(c, h)
	case ModeUDP:
		s.serveUDPControl(c, h)
	case ModeRR:
		s.serveRR(c, h)
	case ModeFileUpload:
		s.serveFileUpload(c, h)
	case ModeFileDownload:
		s.serveFileDownload(c, h)
	default: // DecodeHeader validated the mode; keep the switch total anyway
		s.reject(c, statusBadHeader)
	}
}

// reject counts c as rejected and tells the client why, best effort; the caller closes c. So
// that the answer is not lost to a reset, it half-closes and drains what the client sent, for a
// short, bounded time.
func (s *Server) reject(c net.Conn, st status) {
	s.rejected.Add(1)
	c.SetDeadline(time.Now().Add(250 * time.Millisecond))
	if _, err := c.Write([]byte{byte(st)}); err != nil {
		return
	}
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		hc.CloseWrite()
	}
	io.CopyN(io.Discard, c, 64<<10)
}

func (s *Server) accept(c net.Conn) error {
	c.SetWriteDeadline(time.Now().Add(s.cfg.idleTimeout))
	_, err := c.Write([]byte{byte(statusOK)})
	return err
}

// progress sets c's deadline for the next read or write at most once a second, so that busy
// loops do not pay for a deadline per call; next is the time of the next refresh.
func progress(c net.Conn, idle time.Duration, next *time.Time) {
	now := time.Now()
	if now.Before(*next) {
		return
	}
	c.SetDeadline(now.Add(idle))
	*next = now.Add(time.Second)
}

// writeRecordTimeout writes r to c with a write deadline.
func writeRecordTimeout(c net.Conn, r record, d time.Duration) error {
	c.SetWriteDeadline(time.Now().Add(d))
	return writeRecord(c, r)
}

// discard reads from r until EOF or error; it is used to wait for a peer's close.
func discard(r io.Reader) {
	var b [4096]byte
	for {
		if _, err := r.Read(b[:]); err != nil {
			return
		}
	}
}
