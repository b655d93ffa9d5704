package emu

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"braid/internal/lab/topo"

	"golang.org/x/sys/unix"
)

// Stats counts what one direction of a link did. Read with Link.Stats.
type Stats struct {
	Packets, Bytes        uint64 // delivered (a super-packet counts its segments)
	DropLoss, DropQueue   uint64 // segments dropped at random / by the full queue
	DropDown              uint64 // segments dropped because the link was cut
	MaxBacklogBytes       uint64 // the largest serialiser backlog seen, in bytes
	MaxBacklogPackets     uint64 // and in segments
	ReadErrors, WriteErrs uint64
	// Age is how long the link had run when the counters were read: a trace link's replay is
	// then at Age + Trace.Offset into its trace, and what was delivered by then departed the
	// serialiser by Age - Delay (without jitter). 0 for a kernel link.
	Age time.Duration
}

type counters struct {
	packets, bytes, dropLoss, dropQueue, dropDown atomic.Uint64
	maxBacklogBytes, maxBacklogPkts               atomic.Uint64
	readErrs, writeErrs                           atomic.Uint64
}

// Link moves packets between two TUN devices, shaping each direction. Directions are indexed 0
// (A to B) and 1 (B to A).
type Link struct {
	a, b   *os.File
	vnet   bool
	dirs   [2]*direction
	wg     sync.WaitGroup
	closed atomic.Bool
	once   sync.Once
	stop   int   // eventfd that wakes the readers on Close
	start  int64 // nanotime of the link's creation: where trace replays start
}

type direction struct {
	in, out *os.File
	inFd    int // in's descriptor, read directly on the reader's own thread
	vnet    bool
	shaper  *Shaper                    // owned by the reader goroutine
	next    atomic.Pointer[topo.Shape] // a new shape for the reader to take
	down    atomic.Bool
	q       delayQueue
	c       counters
	closed  *atomic.Bool
}

// NewLink starts moving packets between the TUN devices a and b (opened with the same offload
// setting), shaping a→b with ab and b→a with ba. It owns the files and closes them on Close.
func NewLink(a, b *os.File, offload bool, mtu int, ab, ba topo.Shape, seed uint64) (*Link, error) {
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("emu: eventfd: %w", err)
	}
	l := &Link{a: a, b: b, vnet: offload, stop: stop, start: nanotime()}
	l.dirs[0] = &direction{in: a, out: b, vnet: offload, shaper: NewShaper(ab, mtu, seed), closed: &l.closed}
	l.dirs[1] = &direction{in: b, out: a, vnet: offload, shaper: NewShaper(ba, mtu, seed+1), closed: &l.closed}
	for _, d := range l.dirs {
		d.shaper.SetOrigin(l.start)
		d.q.init()
		d.inFd = fdOf(d.in)
		l.wg.Add(2)
		go func() { defer l.wg.Done(); d.read(stop) }()
		go func() { defer l.wg.Done(); d.write() }()
	}
	return l, nil
}

func fdOf(f *os.File) int {
	fd := -1
	if raw, err := f.SyscallConn(); err == nil {
		raw.Control(func(x uintptr) { fd = int(x) })
	}
	return fd
}

// SetShape changes the shape of direction dir (0: A to B, 1: B to A) while traffic flows. A new
// trace replays as if it had started with the link (at its offset then).
func (l *Link) SetShape(dir int, s topo.Shape) { l.dirs[dir].next.Store(&s) }

// SetDown cuts (true) or restores (false) both directions. Packets in flight on a cut link are
// lost too.
func (l *Link) SetDown(down bool) {
	for _, d := range l.dirs {
		d.down.Store(down)
	}
}

// Down reports whether the link is cut.
func (l *Link) Down() bool { return l.dirs[0].down.Load() }

// Stats returns the counters of direction dir.
func (l *Link) Stats(dir int) Stats {
	c := &l.dirs[dir].c
	return Stats{
		Packets: c.packets.Load(), Bytes: c.bytes.Load(),
		DropLoss: c.dropLoss.Load(), DropQueue: c.dropQueue.Load(), DropDown: c.dropDown.Load(),
		MaxBacklogBytes: c.maxBacklogBytes.Load(), MaxBacklogPackets: c.maxBacklogPkts.Load(),
		ReadErrors: c.readErrs.Load(), WriteErrs: c.writeErrs.Load(),
		Age: time.Duration(nanotime() - l.start),
	}
}

// Close stops the link and closes both TUN devices, which removes them. It is idempotent and
// returns when every goroutine of the link has stopped.
func (l *Link) Close() error {
	var err error
	l.once.Do(func() {
		l.closed.Store(true)
		var one [8]byte
		one[0] = 1
		unix.Write(l.stop, one[:]) // wakes the readers' poll
		for _, d := range l.dirs {
			d.q.close()
		}
		l.wg.Wait()
		// Only now, with no reader left on the descriptors, close them.
		err = errors.Join(l.a.Close(), l.b.Close())
		unix.Close(l.stop)
	})
	return err
}

// nanotime is a monotonic clock in nanoseconds.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// read takes packets from the TUN device on its own OS thread, straight from the descriptor:
// the arrival time of a packet is when it is read, so a reader delayed by the runtime's scheduler
// would see a burst that never was, and fill the emulated queue with it.
func (d *direction) read(stop int) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, vnetHdrLen+65536)
	fds := []unix.PollFd{{Fd: int32(d.inFd), Events: unix.POLLIN}, {Fd: int32(stop), Events: unix.POLLIN}}
	for {
		n, err := unix.Read(d.inFd, buf)
		if err == unix.EAGAIN || err == unix.EINTR {
			if d.closed.Load() {
				return
			}
			if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
				return
			}
			if fds[1].Revents != 0 {
				return
			}
			continue
		}
		if err != nil || n <= 0 {
			if d.closed.Load() {
				return
			}
			// A TUN device that is going away (its peer namespace deleted) fails reads until it
			// is closed: count, and do not spin.
			d.c.readErrs.Add(1)
			time.Sleep(time.Millisecond)
			continue
		}
		now := nanotime()
		if s := d.next.Swap(nil); s != nil {
			d.shaper.Set(*s)
		}
		d.shaper.SetDown(d.down.Load())
		bytes, segs := wireSize(buf[:n], d.vnet)
		deliver, v := d.shaper.Admit(now, bytes, segs)
		switch v {
		case DropLoss:
			d.c.dropLoss.Add(uint64(segs))
			continue
		case DropQueue:
			d.c.dropQueue.Add(uint64(segs))
			continue
		case DropDown:
			d.c.dropDown.Add(uint64(segs))
			continue
		}
		if bp, bb := d.shaper.Backlog(now); uint64(bb) > d.c.maxBacklogBytes.Load() {
			d.c.maxBacklogBytes.Store(uint64(bb))
			d.c.maxBacklogPkts.Store(uint64(bp))
		}
		p := getBuf(n)
		copy(p.b, buf[:n])
		if !d.q.push(packet{deliver: deliver, buf: p, bytes: int32(bytes), segs: int32(segs)}) {
			putBuf(p)
			return
		}
	}
}

// write delivers packets at their times. It sleeps with clock_nanosleep on its own thread,
// because the runtime's timers wake up to a millisecond late, which would be seen in every RTT.
func (d *direction) write() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0)
	for {
		p, ok := d.q.pop()
		if !ok {
			return
		}
		for {
			wait := p.deliver - nanotime()
			if wait <= 0 || d.closed.Load() {
				break
			}
			ts := unix.NsecToTimespec(min(wait, int64(50*time.Millisecond)))
			unix.Nanosleep(&ts, nil)
		}
		if d.down.Load() {
			d.c.dropDown.Add(uint64(p.segs))
		} else if _, err := d.out.Write(p.buf.b); err != nil {
			if d.closed.Load() {
				putBuf(p.buf)
				return
			}
			d.c.writeErrs.Add(1)
		} else {
			d.c.packets.Add(uint64(p.segs))
			d.c.bytes.Add(uint64(p.bytes))
		}
		putBuf(p.buf)
	}
}

// packet is one packet on the delay line.
type packet struct {
	deliver     int64
	buf         *pbuf
	bytes, segs int32
}

// delayQueue is the FIFO between a direction's reader and writer. Delivery times are monotonic,
// so the head is always the next packet due. Its length is bounded by what the shaper admits: the
// queue bound plus what the delay holds at the link's rate.
type delayQueue struct {
	mu     sync.Mutex
	items  []packet
	head   int
	closed bool
	ready  chan struct{} // signalled when the queue goes from empty to non-empty
}

func (q *delayQueue) init() { q.ready = make(chan struct{}, 1) }

func (q *delayQueue) push(p packet) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	if q.head > 0 && q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	q.items = append(q.items, p)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return true
}

func (q *delayQueue) pop() (packet, bool) {
	for {
		q.mu.Lock()
		if q.closed {
			for _, p := range q.items[q.head:] {
				putBuf(p.buf)
			}
			q.items, q.head = nil, 0
			q.mu.Unlock()
			return packet{}, false
		}
		if q.head < len(q.items) {
			p := q.items[q.head]
			q.items[q.head] = packet{}
			q.head++
			if q.head > 4096 && q.head*2 > len(q.items) { // compact: keep memory bounded
				n := copy(q.items, q.items[q.head:])
				q.items, q.head = q.items[:n], 0
			}
			q.mu.Unlock()
			return p, true
		}
		q.mu.Unlock()
		<-q.ready
	}
}

func (q *delayQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pbuf is a pooled packet buffer; pools per size class keep a delay line full of small packets
// from pinning 64 KiB each.
type pbuf struct{ b []byte }

var classes = [...]int{2048, 16384, vnetHdrLen + 65536}
var pools [len(classes)]sync.Pool

func getBuf(n int) *pbuf {
	for i, c := range classes {
		if n <= c {
			if p, _ := pools[i].Get().(*pbuf); p != nil {
				p.b = p.b[:n]
				return p
			}
			return &pbuf{b: make([]byte, n, c)}
		}
	}
	return &pbuf{b: make([]byte, n)}
}

func putBuf(p *pbuf) {
	for i, c := range classes {
		if cap(p.b) == c {
			pools[i].Put(p)
			return
		}
	}
}
