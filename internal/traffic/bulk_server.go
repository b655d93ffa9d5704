package traffic

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// bulkTest is the server's state of one Bulk test: its control connection's handler owns it and
// the handlers of its data connections attach to it.
type bulkTest struct {
	h Header

	mu       sync.Mutex
	data     []net.Conn
	sealed   bool          // no more data connections may attach
	attached chan struct{} // closed when all Streams data connections are attached
	started  chan struct{} // closed when the window opens
	finished chan struct{} // closed when the window closes or the test is aborted
	dataWG   sync.WaitGroup

	bytes   atomic.Int64 // upload: payload received by all streams
	retrans atomic.Int64 // download: retransmits of the finished streams
}

func (t *bulkTest) seal() {
	t.mu.Lock()
	t.sealed = true
	t.mu.Unlock()
}

func (t *bulkTest) closeData() {
	t.mu.Lock()
	data := t.data
	t.mu.Unlock()
	for _, c := range data {
		c.Close()
	}
}

// waitData waits for the data handlers, closing their connections after d (or at once when
// the server closes). Data connections must be sealed first.
func (t *bulkTest) waitData(d time.Duration, closed <-chan struct{}) {
	done := make(chan struct{})
	go func() {
		t.dataWG.Wait()
		close(done)
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	case <-closed:
	}
	t.closeData()
	<-done
}

func (s *Server) serveBulkControl(c net.Conn, h Header) {
	t := &bulkTest{
		h:        h,
		attached: make(chan struct{}),
		started:  make(chan struct{}),
		finished: make(chan struct{}),
	}
	s.mu.Lock()
	if _, dup := s.bulk[h.TestID]; dup {
		s.mu.Unlock()
		s.reject(c, statusDuplicate)
		return
	}
	s.bulk[h.TestID] = t
	s.mu.Unlock()

	// The control reader: a stop record (download) or the client going away.
	stopc := make(chan struct{})
	gone := make(chan struct{})
	var rwg sync.WaitGroup
	defer func() {
		s.mu.Lock()
		delete(s.bulk, h.TestID)
		s.mu.Unlock()
		t.seal()
		select {
		case <-t.finished:
		default:
			close(t.finished)
		}
		t.closeData()
		t.waitData(0, s.closed)
		c.Close()
		rwg.Wait()
	}()
	if s.accept(c) != nil {
		return
	}
	rwg.Go(func() {
		defer close(gone)
		for {
			rec, err := readRecord(c, 0)
			if err != nil || rec.typ != recStop {
				return
			}
			select {
			case <-stopc:
			default:
				close(stopc)
			}
		}
	})

	timer := time.NewTimer(setupTimeout)
	defer timer.Stop()
	select {
	case <-t.attached:
	case <-timer.C:
		return
	case <-gone:
		return
	case <-s.closed:
		return
	}
	t.seal()
	if writeRecordTimeout(c, record{typ: recStart}, s.cfg.idleTimeout) != nil {
		return
	}
	start := time.Now()
	close(t.started)

	if h.Mode == ModeBulkDownload {
		timer.Reset(h.Duration + finishGrace + setupTimeout)
		select {
		case <-stopc:
		case <-timer.C:
			return
		case <-gone:
			return
		case <-s.closed:
			return
		}
		close(t.finished)
		t.waitData(finishGrace, s.closed)
		writeRecordTimeout(c, record{typ: recFinal, v: [6]uint64{2: uint64(t.retrans.Load())}}, s.cfg.idleTimeout)
		c.SetReadDeadline(time.Now().Add(finishGrace))
		<-gone // the client closes the control connection after the report
		return
	}

	// Upload: the server is the receiver and measures.
	base := t.bytes.Load()
	prev, prevAt := base, time.Duration(0)
	for k := time.Duration(1); ; k++ {
		at := min(k*h.Interval, h.Duration)
		timer.Reset(time.Until(start.Add(at)))
		select {
		case <-timer.C:
		case <-gone:
			return
		case <-s.closed:
			return
		}
		now, elapsed := t.bytes.Load(), time.Since(start)
		if elapsed <= prevAt {
			elapsed = prevAt + 1
		}
		if at < h.Duration {
			rec := record{typ: recSample, v: [6]uint64{uint64(k - 1), uint64(at), uint64(now - prev), uint64(elapsed - prevAt)}}
			if writeRecordTimeout(c, rec, s.cfg.idleTimeout) != nil {
				return
			}
			prev, prevAt = now, elapsed
			continue
		}
		// The last sample and the final report go out together.
		last := record{typ: recSample, v: [6]uint64{uint64(k - 1), uint64(at), uint64(now - prev), uint64(elapsed - prevAt)}}
		final := record{typ: recFinal, v: [6]uint64{uint64(now - base), uint64(elapsed)}}
		b1, b2 := last.encode(), final.encode()
		c.SetWriteDeadline(time.Now().Add(s.cfg.idleTimeout))
		if _, err := c.Write(append(b1[:], b2[:]...)); err != nil {
			return
		}
		break
	}
	close(t.finished)
	// The client closes its data connections when it reads the report; wait for that.
	t.waitData(finishGrace, s.closed)
	c.SetReadDeadline(time.Now().Add(finishGrace))
	<-gone
}

func (s *Server) serveBulkData(c net.Conn, h Header) {
	s.mu.Lock()
	t := s.bulk[h.TestID]
	s.mu.Unlock()
	if t == nil {
		s.reject(c, statusUnknownTest)
		return
	}
	t.mu.Lock()
	if t.sealed || len(t.data) >= int(t.h.Streams) {
		t.mu.Unlock()
		s.reject(c, statusBusy)
		return
	}
	t.data = append(t.data, c)
	t.dataWG.Add(1)
	if len(t.data) == int(t.h.Streams) {
		close(t.attached)
	}
	t.mu.Unlock()
	defer t.dataWG.Done()

	if s.accept(c) != nil {
		return
	}
	select {
	case <-t.started:
	case <-t.finished:
		return
	case <-s.closed:
		return
	}
	var next time.Time
	if t.h.Mode == ModeBulkUpload {
		buf := make([]byte, bulkChunk)
		for {
			progress(c, s.cfg.idleTimeout, &next)
			n, err := c.Read(buf)
			t.bytes.Add(int64(n))
			if err != nil {
				return
			}
		}
	}
	payload := bulkPayload()
	defer func() { t.retrans.Add(tcpRetransmits(c)) }()
	for {
		select {
		case <-t.finished:
			return
		default:
		}
		progress(c, s.cfg.idleTimeout, &next)
		if _, err := c.Write(payload); err != nil {
			return
		}
	}
}
