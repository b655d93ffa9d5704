// Package traffic is braid's built-in traffic generator and meter, used by the lab's tests,
// benchmarks and the `braid traffic` command instead of iperf3.
//
// It measures TCP goodput (Bulk), UDP loss, reordering and jitter at a paced rate (UDP),
// request/response latency (RR) and the integrity of a transfer (File). A Server answers all of
// them on one TCP listener and one UDP socket.
//
// The package never creates sockets on its own behalf except through what it is given: the
// server takes ready listeners, the client takes a DialFunc. The lab hands in sockets created
// inside a network namespace; NetDial is the plain dialer for loopback use and the CLI.
//
// Every client function is bounded by its context and by its own options: all connections are
// closed when the context ends, and every read and write has a deadline, so a peer that vanishes
// produces an error, never a hang.
package traffic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// DialFunc opens a connection; network is "tcp" or "udp". The lab passes one that creates the
// socket inside a network namespace.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// NetDial dials with a zero net.Dialer: for loopback use and the CLI.
func NetDial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, address)
}

// Timeouts the client uses when its options do not say otherwise.
const (
	setupTimeout = 10 * time.Second // dial, header, status and start of a test
	ioTimeout    = 10 * time.Second // any single read or write making no progress
	finishGrace  = 5 * time.Second  // collecting the final report after a timed test
)

// Sample is one interval of a Bulk test.
type Sample struct {
	At            time.Duration `json:"at_ns"` // end of the interval, since the start of the test
	BitsPerSecond float64       `json:"bits_per_second"`
	Bytes         int64         `json:"bytes"`       // payload received in the interval
	Duration      time.Duration `json:"duration_ns"` // measured length of the interval
}

// session holds the connections of one client call so that they can all be closed when the
// context ends or the call returns.
type session struct {
	ctx   context.Context
	dial  DialFunc
	mu    sync.Mutex
	conns []net.Conn
	done  bool
	stop  func() bool
}

func newSession(ctx context.Context, dial DialFunc) *session {
	if dial == nil {
		dial = NetDial
	}
	s := &session{ctx: ctx, dial: dial}
	s.stop = context.AfterFunc(ctx, s.closeAll)
	return s
}

// dialConn opens a connection bounded by setupTimeout and registers it with the session.
func (s *session) dialConn(network, addr string) (net.Conn, error) {
	return s.dialTimeout(network, addr, setupTimeout)
}

func (s *session) dialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	defer cancel()
	c, err := s.dial(ctx, network, addr)
	if err != nil {
		return nil, s.wrap("", err) // the net error names the network and address
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		c.Close()
		return nil, s.wrap("dial", net.ErrClosed)
	}
	s.conns = append(s.conns, c)
	return c, nil
}

// forget closes c and stops tracking it.
func (s *session) forget(c net.Conn) {
	c.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.Index(s.conns, c); i >= 0 {
		s.conns = slices.Delete(s.conns, i, i+1)
	}
}

func (s *session) closeAll() {
	s.mu.Lock()
	conns := s.conns
	s.conns, s.done = nil, true
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// close ends the session: every connection is closed.
func (s *session) close() {
	s.stop()
	s.closeAll()
}

// wrap prefixes err with "traffic: what: ", preferring the context's error when the context has
// ended (the connection errors are then only a consequence).
func (s *session) wrap(what string, err error) error {
	if what == "" {
		return s.wrap("connect", err)
	}
	if cerr := s.ctx.Err(); cerr != nil {
		return fmt.Errorf("traffic: %s: %w", what, context.Cause(s.ctx))
	}
	return fmt.Errorf("traffic: %s: %w", what, err)
}

// handshake writes the header (and extra bytes, if any) and reads the status byte.
func handshake(c net.Conn, h Header, extra []byte) error {
	b, err := AppendHeader(make([]byte, 0, HeaderLen+len(extra)), h)
	if err != nil {
		return err
	}
	b = append(b, extra...)
	c.SetDeadline(time.Now().Add(setupTimeout))
	if _, err := c.Write(b); err != nil {
		return err
	}
	return readStatus(c)
}

func readStatus(c net.Conn) error {
	var st [1]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("connection closed by the server before answering: %w", err)
		}
		return err
	}
	return status(st[0]).err()
}

// formatBits formats a rate in bit/s with an SI prefix: "94.3 Mbit/s".
func formatBits(bps float64) string {
	switch {
	case bps >= 1e12:
		return fmt.Sprintf("%.2f Tbit/s", bps/1e12)
	case bps >= 1e9:
		return fmt.Sprintf("%.2f Gbit/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.1f Mbit/s", bps/1e6)
	case bps >= 1e3:
		return fmt.Sprintf("%.1f kbit/s", bps/1e3)
	}
	return fmt.Sprintf("%.0f bit/s", bps)
}

// formatBytes formats a byte count with an IEC prefix: "10.0 MiB".
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func bitsPerSecond(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) * 8 / d.Seconds()
}

// median of a copy of v; 0 for an empty slice.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
