package traffic

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// UDPOptions configure a UDP test.
//
// Rate counts whole IP packets: the UDP payload (Size bytes) plus the 8-byte UDP header and the
// IP header, 20 bytes for IPv4 or 40 for IPv6, so one datagram is (Size+28)*8 or (Size+48)*8
// bits. Link-layer framing is not counted.
type UDPOptions struct {
	Rate     uint64        // bit/s of IP packets; default 1 Mbit/s
	Size     int           // UDP payload bytes per datagram; default 1200, at least MinUDPSize
	Duration time.Duration // how long to send; default 10 s
	// DataAddr is where the datagrams go; by default the host of the server's address with the
	// UDP port the server announces. Set it to send them through a relay or a NAT.
	DataAddr string
}

// UDPResult is the outcome of a UDP test. The server counts what arrives; the client knows what
// it sent.
type UDPResult struct {
	Sent         int64         `json:"sent"`         // datagrams sent
	Received     int64         `json:"received"`     // distinct datagrams received
	Lost         int64         `json:"lost"`         // Sent - Received
	LossPercent  float64       `json:"loss_percent"` // 100 * Lost / Sent
	Duplicates   int64         `json:"duplicates"`   // extra copies received
	Reordered    int64         `json:"reordered"`    // arrived after a datagram with a higher sequence number
	Jitter       time.Duration `json:"jitter_ns"`    // RFC 3550 interarrival jitter
	Size         int           `json:"size"`         // UDP payload bytes per datagram
	TargetRate   float64       `json:"target_bits_per_second"`
	Rate         float64       `json:"bits_per_second"`          // achieved send rate, IP packet bits over Duration
	ReceivedRate float64       `json:"received_bits_per_second"` // received IP packet bits over Duration
	Duration     time.Duration `json:"duration_ns"`              // measured sending time
}

func (r UDPResult) String() string {
	return fmt.Sprintf("udp: sent %s for %.1f s, %d/%d datagrams received, %d lost (%.2f%%), %d duplicates, %d reordered, jitter %.3f ms",
		formatBits(r.Rate), r.Duration.Seconds(), r.Received, r.Sent, r.Lost, r.LossPercent,
		r.Duplicates, r.Reordered, float64(r.Jitter)/float64(time.Millisecond))
}

// UDP sends paced, numbered datagrams to the server at addr and reports what arrived. A TCP
// control connection to addr announces the test and collects the server's counts.
func UDP(ctx context.Context, dial DialFunc, addr string, o UDPOptions) (UDPResult, error) {
	if o.Rate == 0 {
		o.Rate = 1e6
	}
	if o.Size == 0 {
		o.Size = 1200
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	h := Header{Mode: ModeUDP, TestID: newTestID(), Duration: o.Duration, Rate: o.Rate, Size: uint64(o.Size)}
	if o.Size < 0 {
		h.Size = 0
	}
	if err := h.Validate(); err != nil {
		return UDPResult{}, fmt.Errorf("traffic: udp: bad options: %w", err)
	}
	sess := newSession(ctx, dial)
	defer sess.close()

	ctl, err := sess.dialConn("tcp", addr)
	if err != nil {
		return UDPResult{}, err
	}
	t0 := time.Now()
	if err := handshake(ctl, h, nil); err != nil {
		return UDPResult{}, sess.wrap("udp: control connection", err)
	}
	ready, err := readRecord(ctl, recUDPReady)
	if err != nil {
		return UDPResult{}, sess.wrap("udp: control connection", err)
	}
	rtt := time.Since(t0) / 2 // the header, status and ready record took about two round trips
	dataAddr := o.DataAddr
	if dataAddr == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return UDPResult{}, fmt.Errorf("traffic: udp: %w", err)
		}
		dataAddr = net.JoinHostPort(host, strconv.FormatUint(ready.v[0]&0xffff, 10))
	}
	uc, err := sess.dialConn("udp", dataAddr)
	if err != nil {
		return UDPResult{}, err
	}
	overhead := 48
	if ip := remoteIP(uc, dataAddr); ip.Is4() || ip.Is4In6() {
		overhead = 28
	}
	bits := float64((o.Size + overhead) * 8)

	buf := make([]byte, o.Size)
	copy(buf, udpMagic)
	binary.BigEndian.PutUint64(buf[4:], h.TestID)
	sent, elapsed, err := sendPaced(ctx, uc, buf, float64(o.Rate)/bits, o.Duration)
	if err != nil {
		return UDPResult{}, sess.wrap("udp: sending", err)
	}

	grace := max(200*time.Millisecond, 2*rtt)
	select {
	case <-time.After(grace):
	case <-ctx.Done():
		return UDPResult{}, sess.wrap("udp", ctx.Err())
	}
	if err := writeRecordTimeout(ctl, record{typ: recUDPRequest, v: [6]uint64{uint64(sent)}}, ioTimeout); err != nil {
		return UDPResult{}, sess.wrap("udp: control connection", err)
	}
	ctl.SetReadDeadline(time.Now().Add(ioTimeout))
	rep, err := readRecord(ctl, recUDPReport)
	if err != nil {
		return UDPResult{}, sess.wrap("udp: control connection: report", err)
	}
	res := UDPResult{
		Sent:       sent,
		Received:   int64(rep.v[0]),
		Duplicates: int64(rep.v[1]),
		Reordered:  int64(rep.v[2]),
		Jitter:     time.Duration(rep.v[3]),
		Size:       o.Size,
		TargetRate: float64(o.Rate),
		Duration:   elapsed,
	}
	res.Lost = max(0, res.Sent-res.Received)
	if res.Sent > 0 {
		res.LossPercent = 100 * float64(res.Lost) / float64(res.Sent)
	}
	res.Rate = float64(res.Sent) * bits / elapsed.Seconds()
	res.ReceivedRate = float64(res.Received) * bits / elapsed.Seconds()
	return res, nil
}

// remoteIP is the address the datagrams go to, from the connection if it says, else from addr.
func remoteIP(c net.Conn, addr string) netip.Addr {
	if ua, ok := c.RemoteAddr().(*net.UDPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ua.IP); ok {
			return ip
		}
	}
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap.Addr()
	}
	return netip.Addr{}
}

// sendPaced writes buf (whose bytes 12..28 it fills with the sequence number and send time) to w
// at pps datagrams per second for d. Datagram k is due at k/pps after the start; when the loop
// is late it sends every datagram that is due at once, so it keeps the average rate and never
// exceeds it. It returns the datagrams written and the time taken, at least d. It allocates
// nothing per datagram.
func sendPaced(ctx context.Context, w net.Conn, buf []byte, pps float64, d time.Duration) (int64, time.Duration, error) {
	gap := float64(time.Second) / pps
	done := ctx.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	w.SetWriteDeadline(time.Now().Add(d + ioTimeout))
	start := time.Now()
	var sent int64
	failures := 0
	for k := int64(0); ; k++ {
		due := time.Duration(float64(k) * gap)
		if due >= d {
			break
		}
		if wait := due - time.Since(start); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-done:
				return sent, time.Since(start), ctx.Err()
			}
		} else if k&63 == 0 {
			select {
			case <-done:
				return sent, time.Since(start), ctx.Err()
			default:
			}
		}
		binary.BigEndian.PutUint64(buf[12:], uint64(sent))
		binary.BigEndian.PutUint64(buf[20:], uint64(time.Since(start)))
		if _, err := w.Write(buf); err != nil {
			// ICMP errors (port unreachable) and full queues are transient: the datagram was
			// not sent and its sequence number is used again. Anything else ends the test.
			if errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled) || isTimeout(err) {
				return sent, time.Since(start), err
			}
			if failures++; failures > 1000 {
				return sent, time.Since(start), fmt.Errorf("too many failed sends: %w", err)
			}
			continue
		}
		failures = 0
		sent++
	}
	if rest := d - time.Since(start); rest > 0 {
		timer.Reset(rest)
		select {
		case <-timer.C:
		case <-done:
			return sent, time.Since(start), ctx.Err()
		}
	}
	return sent, time.Since(start), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// udpTest is the server's tally of one UDP test.
type udpTest struct {
	base  time.Time
	limit uint64 // sequence numbers at or above it cannot be valid

	mu          sync.Mutex
	seen        []uint64 // bitmap of received sequence numbers
	received    uint64
	dups        uint64
	reordered   uint64
	ignored     uint64
	highest     uint64
	any         bool
	jitter      float64 // nanoseconds
	lastTransit int64
}

// maxUDPPackets bounds the datagrams of one test so that its bitmap stays below 128 MiB.
const maxUDPPackets = 1 << 30

func (t *udpTest) add(seq uint64, sentNs int64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if seq >= t.limit {
		t.ignored++
		return
	}
	w, bit := seq/64, uint64(1)<<(seq%64)
	if w >= uint64(len(t.seen)) {
		n := max(w+1, uint64(2*len(t.seen)), 1024)
		n = min(n, (t.limit+63)/64)
		t.seen = append(t.seen, make([]uint64, n-uint64(len(t.seen)))...)
	}
	if t.seen[w]&bit != 0 {
		t.dups++
		return
	}
	t.seen[w] |= bit
	t.received++
	if t.any && seq < t.highest {
		t.reordered++
	} else {
		t.highest = seq
	}
	// RFC 3550 section 6.4.1: J += (|D| - J) / 16, D the difference of successive transit times.
	transit := now.Sub(t.base).Nanoseconds() - sentNs
	if t.any {
		d := transit - t.lastTransit
		if d < 0 {
			d = -d
		}
		t.jitter += (float64(d) - t.jitter) / 16
	}
	t.lastTransit = transit
	t.any = true
}

// report counts the distinct datagrams below sent.
func (t *udpTest) report(sent uint64) record {
	t.mu.Lock()
	defer t.mu.Unlock()
	var got uint64
	for i, w := range t.seen {
		lo := uint64(i) * 64
		if lo >= sent {
			break
		}
		if sent-lo < 64 {
			w &= 1<<(sent-lo) - 1
		}
		got += uint64(bits.OnesCount64(w))
	}
	return record{typ: recUDPReport, v: [6]uint64{got, t.dups, t.reordered, uint64(t.jitter), t.ignored}}
}

func (s *Server) serveUDPControl(c net.Conn, h Header) {
	if s.udp == nil {
		s.reject(c, statusUnsupported)
		return
	}
	// The client never sends faster than Rate; count with the smaller IPv4 overhead.
	expected := float64(h.Rate) / float64((h.Size+28)*8) * h.Duration.Seconds()
	if expected > maxUDPPackets {
		s.reject(c, statusTooLarge)
		return
	}
	t := &udpTest{base: time.Now(), limit: uint64(expected) + 2}
	s.udpMu.Lock()
	if _, dup := s.udpTests[h.TestID]; dup {
		s.udpMu.Unlock()
		s.reject(c, statusDuplicate)
		return
	}
	s.udpTests[h.TestID] = t
	s.udpMu.Unlock()
	defer func() {
		s.udpMu.Lock()
		delete(s.udpTests, h.TestID)
		s.udpMu.Unlock()
	}()
	if s.accept(c) != nil {
		return
	}
	var port uint64
	if ap, err := netip.ParseAddrPort(s.udp.LocalAddr().String()); err == nil {
		port = uint64(ap.Port())
	}
	if writeRecordTimeout(c, record{typ: recUDPReady, v: [6]uint64{port}}, s.cfg.idleTimeout) != nil {
		return
	}
	c.SetReadDeadline(time.Now().Add(h.Duration + s.cfg.idleTimeout))
	req, err := readRecord(c, recUDPRequest)
	if err != nil {
		return
	}
	writeRecordTimeout(c, t.report(req.v[0]), s.cfg.idleTimeout)
}

func (s *Server) udpLoop() {
	buf := make([]byte, 64<<10)
	uc, _ := s.udp.(*net.UDPConn)
	for {
		var n int
		var err error
		if uc != nil {
			n, err = uc.Read(buf)
		} else {
			n, _, err = s.udp.ReadFrom(buf)
		}
		if err != nil {
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			select { // a transient error: do not spin
			case <-time.After(10 * time.Millisecond):
			case <-s.closed:
				return
			}
			continue
		}
		now := time.Now()
		id, seq, sentNs, ok := parseDatagram(buf[:n])
		if !ok {
			s.ignored.Add(1)
			continue
		}
		s.udpMu.RLock()
		t := s.udpTests[id]
		s.udpMu.RUnlock()
		if t == nil {
			s.ignored.Add(1)
			continue
		}
		t.add(seq, sentNs, now)
	}
}
