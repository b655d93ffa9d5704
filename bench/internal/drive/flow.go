package drive

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"time"

	"braid/internal/lab"
	"braid/internal/traffic"
)

// Flow is one `braid traffic bulk` run from host From of a lab (download with Reverse), with
// per-second samples.
type Flow struct {
	From     string // the client's host; "a" by default
	Addr     string // the server's address:port
	Duration time.Duration
	Reverse  bool
	// CC is the congestion control of an upload's sender (the client, `braid traffic bulk
	// --cc`); a download's sender is the server (Server's "--cc"). Empty: the host's default.
	CC string
}

// Run runs the flow and decodes its result; the driver fails if the flow does.
func (f Flow) Run(ctx context.Context, l *lab.Lab, braid string) traffic.BulkResult {
	res, err := f.Try(ctx, l, braid)
	if err != nil {
		Fatal(err)
	}
	return res
}

// Try runs the flow and decodes its result, or says why the flow failed (a stall, a broken
// connection, an unreadable report), for drivers that record a failed flow as a row.
func (f Flow) Try(ctx context.Context, l *lab.Lab, braid string) (traffic.BulkResult, error) {
	from := f.From
	if from == "" {
		from = "a"
	}
	args := []string{"traffic", "bulk", f.Addr, "--duration", f.Duration.String(), "--interval", "1s", "--json"}
	if f.Reverse {
		args = append(args, "--reverse")
	} else if f.CC != "" {
		args = append(args, "--cc", f.CC)
	}
	cmd := exec.CommandContext(ctx, braid, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := l.Host(from).Start(cmd); err != nil {
		Fatal(err) // the lab itself is broken: no row can be measured
	}
	var res traffic.BulkResult
	if err := cmd.Wait(); err != nil {
		return res, fmt.Errorf("braid %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return res, fmt.Errorf("braid %s: %v: %q", strings.Join(args, " "), err, out.String())
	}
	return res, nil
}

// Pinger sends an ICMP echo request from a lab host every interval and keeps the round trips
// of the replies, until Stop. It uses a raw socket of the host's namespace (root).
type Pinger struct {
	conn     net.PacketConn
	dst      net.Addr
	id       uint16
	interval time.Duration
	mu       sync.Mutex
	sent     map[uint16]time.Time
	rtts     []time.Duration
	nsent    int
	stop     chan struct{}
	wg       sync.WaitGroup
}

// StartPing starts pinging dst (an IPv4 address) from host h every interval.
func StartPing(h *lab.Host, dst string, interval time.Duration) *Pinger {
	c, err := h.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		Fatalf("ping from %s: %v", h.Name, err)
	}
	ip, err := net.ResolveIPAddr("ip4", dst)
	if err != nil {
		Fatalf("ping %s: %v", dst, err)
	}
	p := &Pinger{conn: c, dst: ip, id: uint16(time.Now().UnixNano()), interval: interval, sent: map[uint16]time.Time{}, stop: make(chan struct{})}
	p.wg.Add(2)
	go p.send()
	go p.receive()
	return p
}

func (p *Pinger) send() {
	defer p.wg.Done()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	msg := make([]byte, 64)
	for seq := uint16(0); ; seq++ {
		msg[0], msg[1] = 8, 0 // echo request
		binary.BigEndian.PutUint16(msg[2:], 0)
		binary.BigEndian.PutUint16(msg[4:], p.id)
		binary.BigEndian.PutUint16(msg[6:], seq)
		binary.BigEndian.PutUint16(msg[2:], icmpChecksum(msg))
		p.mu.Lock()
		p.sent[seq] = time.Now()
		p.nsent++
		p.mu.Unlock()
		p.conn.WriteTo(msg, p.dst)
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

func (p *Pinger) receive() {
	defer p.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, _, err := p.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		now := time.Now()
		// Go strips the IPv4 header of raw ICMP reads.
		if n < 8 || buf[0] != 0 || binary.BigEndian.Uint16(buf[4:]) != p.id {
			continue
		}
		seq := binary.BigEndian.Uint16(buf[6:])
		p.mu.Lock()
		if at, ok := p.sent[seq]; ok {
			p.rtts = append(p.rtts, now.Sub(at))
			delete(p.sent, seq)
		}
		p.mu.Unlock()
	}
}

// Stop ends the pings and returns the round trips of the replies and how many requests went
// out (a reply still missing a second after the last request is lost).
func (p *Pinger) Stop() (rtts []time.Duration, sent int) {
	close(p.stop)
	time.Sleep(time.Second)
	p.conn.Close()
	p.wg.Wait()
	return p.rtts, p.nsent
}

func icmpChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// LinkSampler records, every second, the IP bytes per second each of a lab's links delivered
// in one direction (0: A to B, 1: B to A), from the emulator's counters, and at Stop what each
// link's queue did while it sampled.
type LinkSampler struct {
	links []*lab.Link
	dir   int
	Rates [][]float64 // by link, bit/s per second
	// By link, set by Stop: the packets its queue dropped while sampling, and the largest
	// backlog it has held (the emulator keeps only the link's lifetime peak), in bytes.
	Drops, PeakBacklog []uint64
	drops0             []uint64
	stop               chan struct{}
	done               chan struct{}
}

// SampleLinks starts sampling links in direction dir.
func SampleLinks(links []*lab.Link, dir int) *LinkSampler {
	s := &LinkSampler{links: links, dir: dir, Rates: make([][]float64, len(links)), stop: make(chan struct{}), done: make(chan struct{})}
	for _, lk := range links {
		s.drops0 = append(s.drops0, lk.Stats(dir).DropQueue)
	}
	go func() {
		defer close(s.done)
		prev := make([]uint64, len(links))
		for i, lk := range links {
			prev[i] = lk.Stats(dir).Bytes
		}
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			for i, lk := range links {
				b := lk.Stats(dir).Bytes
				s.Rates[i] = append(s.Rates[i], float64(b-prev[i])*8)
				prev[i] = b
			}
		}
	}()
	return s
}

// Stop ends the sampling; Rates, Drops and PeakBacklog are complete afterwards.
func (s *LinkSampler) Stop() {
	close(s.stop)
	<-s.done
	for i, lk := range s.links {
		st := lk.Stats(s.dir)
		s.Drops = append(s.Drops, st.DropQueue-s.drops0[i])
		s.PeakBacklog = append(s.PeakBacklog, st.MaxBacklogBytes)
	}
}
