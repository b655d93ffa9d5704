package traffic

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"time"
)

// RROptions configure an RR test.
type RROptions struct {
	Count        int           // requests, one after the other; default 100
	RequestSize  int           // bytes per request; default 64, at most MaxRRSize
	ResponseSize int           // bytes per response; default 64, at most MaxRRSize
	NewConn      bool          // open a new connection per request (the latency includes the handshake)
	Timeout      time.Duration // bound on one request, connecting included; default 5 s
}

// RRResult is the outcome of an RR test: the latency of each request, from sending its first
// byte (or starting to connect, with NewConn) to receiving the last byte of its response.
type RRResult struct {
	NewConn bool            `json:"new_conn"`
	Samples []time.Duration `json:"samples_ns"`
	Min     time.Duration   `json:"min_ns"`
	Median  time.Duration   `json:"median_ns"`
	P90     time.Duration   `json:"p90_ns"`
	P99     time.Duration   `json:"p99_ns"`
	Max     time.Duration   `json:"max_ns"`
	Mean    time.Duration   `json:"mean_ns"`
}

func (r RRResult) String() string {
	kind := "persistent connection"
	if r.NewConn {
		kind = "new connection each"
	}
	return fmt.Sprintf("rr: %d requests (%s): min %v, median %v, p90 %v, p99 %v, max %v, mean %v",
		len(r.Samples), kind, r.Min, r.Median, r.P90, r.P99, r.Max, r.Mean)
}

// RR measures request/response latency against the server at addr.
func RR(ctx context.Context, dial DialFunc, addr string, o RROptions) (RRResult, error) {
	if o.Count == 0 {
		o.Count = 100
	}
	if o.RequestSize == 0 {
		o.RequestSize = 64
	}
	if o.ResponseSize == 0 {
		o.ResponseSize = 64
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Count < 1 || o.Timeout < 0 {
		return RRResult{}, fmt.Errorf("traffic: rr: bad options (count %d, timeout %v)", o.Count, o.Timeout)
	}
	h := Header{Mode: ModeRR, Size: uint64(max(0, o.RequestSize)), ResponseSize: uint32(max(0, min(o.ResponseSize, MaxRRSize+1)))}
	req, err := AppendHeader(nil, h)
	if err != nil {
		return RRResult{}, fmt.Errorf("traffic: rr: bad options: %w", err)
	}
	req = append(req, make([]byte, o.RequestSize)...)
	resp := make([]byte, 1+o.ResponseSize) // status byte, then the response
	sess := newSession(ctx, dial)
	defer sess.close()

	res := RRResult{NewConn: o.NewConn, Samples: make([]time.Duration, 0, o.Count)}
	if o.NewConn {
		for i := range o.Count {
			t := time.Now()
			c, err := sess.dialTimeout("tcp", addr, o.Timeout)
			if err != nil {
				return RRResult{}, err
			}
			c.SetDeadline(t.Add(o.Timeout))
			_, err = c.Write(req)
			if err == nil {
				_, err = io.ReadFull(c, resp)
			}
			d := time.Since(t)
			sess.forget(c)
			if err == nil {
				err = status(resp[0]).err()
			}
			if err != nil {
				return RRResult{}, sess.wrap(fmt.Sprintf("rr: request %d", i+1), err)
			}
			res.Samples = append(res.Samples, d)
		}
	} else {
		c, err := sess.dialConn("tcp", addr)
		if err != nil {
			return RRResult{}, err
		}
		if err := handshake(c, h, nil); err != nil {
			return RRResult{}, sess.wrap("rr", err)
		}
		body, resp := req[HeaderLen:], resp[1:]
		for i := range o.Count {
			t := time.Now()
			c.SetDeadline(t.Add(o.Timeout))
			_, err := c.Write(body)
			if err == nil {
				_, err = io.ReadFull(c, resp)
			}
			if err != nil {
				return RRResult{}, sess.wrap(fmt.Sprintf("rr: request %d", i+1), err)
			}
			res.Samples = append(res.Samples, time.Since(t))
		}
	}
	res.summarize()
	return res, nil
}

func (r *RRResult) summarize() {
	s := slices.Clone(r.Samples)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return
	}
	// nearest rank
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(n))) - 1
		return s[max(0, min(n-1, i))]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	r.Min, r.Max, r.Mean = s[0], s[n-1], sum/time.Duration(n)
	if n%2 == 1 {
		r.Median = s[n/2]
	} else {
		r.Median = (s[n/2-1] + s[n/2]) / 2
	}
	r.P90, r.P99 = rank(0.90), rank(0.99)
}

func (s *Server) serveRR(c net.Conn, h Header) {
	if s.accept(c) != nil {
		return
	}
	req := make([]byte, h.Size)
	resp := make([]byte, h.ResponseSize)
	for {
		c.SetReadDeadline(time.Now().Add(s.cfg.idleTimeout))
		if _, err := io.ReadFull(c, req); err != nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(s.cfg.idleTimeout))
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}
