package traffic

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// BulkOptions configure a Bulk test.
type BulkOptions struct {
	Duration time.Duration // length of the measurement window; default 10 s
	Interval time.Duration // length of one sample; default 1 s, at most Duration
	Reverse  bool          // the server sends and the client receives (download)
	Streams  int           // parallel TCP connections; default 1, at most MaxStreams
	// OnSample, if set, is called with each sample as soon as it is known, synchronously on
	// the goroutine running Bulk.
	OnSample func(Sample)
}

// BulkResult is the outcome of a Bulk test. Everything is measured at the receiver: for an
// upload the server counts the payload it received in the window and reports it, for a download
// the client counts.
type BulkResult struct {
	Reverse     bool          `json:"reverse"`
	Streams     int           `json:"streams"`
	Bytes       int64         `json:"bytes"`       // payload received in the window
	Duration    time.Duration `json:"duration_ns"` // measured length of the window
	Goodput     float64       `json:"goodput_bits_per_second"`
	Steady      float64       `json:"steady_bits_per_second"` // median of the samples after the first
	Samples     []Sample      `json:"samples"`
	Retransmits int64         `json:"retransmits"` // TCP_INFO total_retrans of the senders; 0 if unknown
}

func (r BulkResult) String() string {
	dir := "upload"
	if r.Reverse {
		dir = "download"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bulk %s: %s over %.1f s", dir, formatBits(r.Goodput), r.Duration.Seconds())
	if r.Streams > 1 {
		fmt.Fprintf(&b, ", %d streams", r.Streams)
	}
	fmt.Fprintf(&b, " (steady %s, %d retransmits, %s received)", formatBits(r.Steady), r.Retransmits, formatBytes(r.Bytes))
	return b.String()
}

// MeanAfter is the goodput of the samples after the first skip ones: their bytes over their time
// (0 if there are none). Unlike Steady, a second that reads little because a lost segment held
// the receiver's data back and the next second that reads it all cancel out, so a link's rate
// is not exceeded by catching up; skip leaves out the start-up.
func (r BulkResult) MeanAfter(skip int) float64 {
	if skip >= len(r.Samples) {
		return 0
	}
	var n int64
	var d time.Duration
	for _, s := range r.Samples[skip:] {
		n, d = n+s.Bytes, d+s.Duration
	}
	return bitsPerSecond(n, d)
}

// bulkChunk is the size of one write of bulk payload.
const bulkChunk = 128 << 10

// bulkPayload is the read-only content of bulk streams: random, so that no compression on the
// path flatters the result.
var bulkPayload = sync.OnceValue(func() []byte {
	b := make([]byte, bulkChunk)
	newStream(0x62756c6b).Read(b)
	return b
})

func newTestID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// Bulk measures TCP goodput to (or, with Reverse, from) the server at addr.
func Bulk(ctx context.Context, dial DialFunc, addr string, o BulkOptions) (BulkResult, error) {
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	o.Interval = min(o.Interval, o.Duration)
	if o.Streams == 0 {
		o.Streams = 1
	}
	if o.Duration < MinDuration || o.Duration > MaxDuration || o.Interval < MinInterval ||
		o.Streams < 1 || o.Streams > MaxStreams {
		return BulkResult{}, fmt.Errorf("traffic: bulk: bad options (duration %v, interval %v, streams %d)",
			o.Duration, o.Interval, o.Streams)
	}
	sess := newSession(ctx, dial)
	defer sess.close()

	mode := ModeBulkUpload
	if o.Reverse {
		mode = ModeBulkDownload
	}
	h := Header{Mode: mode, TestID: newTestID(), Duration: o.Duration, Interval: o.Interval, Streams: uint16(o.Streams)}
	ctl, err := sess.dialConn("tcp", addr)
	if err != nil {
		return BulkResult{}, err
	}
	if err := handshake(ctl, h, nil); err != nil {
		return BulkResult{}, sess.wrap("bulk: control connection", err)
	}
	data := make([]net.Conn, o.Streams)
	for i := range data {
		c, err := sess.dialConn("tcp", addr)
		if err != nil {
			return BulkResult{}, err
		}
		if err := handshake(c, Header{Mode: ModeBulkData, TestID: h.TestID}, nil); err != nil {
			return BulkResult{}, sess.wrap("bulk: data connection", err)
		}
		c.SetDeadline(time.Time{})
		data[i] = c
	}
	ctl.SetReadDeadline(time.Now().Add(setupTimeout))
	if _, err := readRecord(ctl, recStart); err != nil {
		return BulkResult{}, sess.wrap("bulk: waiting for the start", err)
	}
	start := time.Now()

	r := &bulkRun{o: o, ctl: ctl, data: data, start: start, errc: make(chan error, 1)}
	defer r.stop()
	var res BulkResult
	if o.Reverse {
		res, err = r.download()
	} else {
		res, err = r.upload()
	}
	if err != nil {
		return BulkResult{}, sess.wrap("bulk", err)
	}
	res.Reverse, res.Streams = o.Reverse, o.Streams
	res.Goodput = bitsPerSecond(res.Bytes, res.Duration)
	res.Steady = res.Goodput
	if len(res.Samples) > 1 {
		v := make([]float64, 0, len(res.Samples)-1)
		for _, s := range res.Samples[1:] {
			v = append(v, s.BitsPerSecond)
		}
		res.Steady = median(v)
	}
	return res, nil
}

// bulkRun is the running part of one client Bulk test.
type bulkRun struct {
	o         BulkOptions
	ctl       net.Conn
	data      []net.Conn
	start     time.Time
	wg        sync.WaitGroup // the stream goroutines
	finishing atomic.Bool    // set before the data connections are closed on purpose
	errc      chan error     // the first failure of a stream
	stopOnce  sync.Once
}

// fail records a stream's failure and closes the control connection so that a Bulk blocked on it
// notices.
func (r *bulkRun) fail(err error) {
	if r.finishing.Load() {
		return
	}
	select {
	case r.errc <- err:
	default:
	}
	r.ctl.Close()
}

// failure prefers a stream's error to err, the error that made Bulk notice.
func (r *bulkRun) failure(err error) error {
	select {
	case serr := <-r.errc:
		return fmt.Errorf("stream: %w", serr)
	default:
		return err
	}
}

// stop aborts the data connections (no lingering of unsent data) and waits for the streams.
func (r *bulkRun) stop() {
	r.stopOnce.Do(func() {
		r.finishing.Store(true)
		for _, c := range r.data {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			c.Close()
		}
		r.wg.Wait()
	})
}

func (r *bulkRun) upload() (BulkResult, error) {
	payload := bulkPayload()
	for _, c := range r.data {
		r.wg.Go(func() {
			var next time.Time
			for {
				progress(c, ioTimeout, &next)
				if _, err := c.Write(payload); err != nil {
					r.fail(err)
					return
				}
			}
		})
	}
	var res BulkResult
	r.ctl.SetReadDeadline(r.start.Add(r.o.Duration + finishGrace))
	for {
		rec, err := readRecord(r.ctl, 0)
		if err != nil {
			return BulkResult{}, r.failure(fmt.Errorf("control connection: %w", err))
		}
		switch rec.typ {
		case recSample:
			n, d := int64(rec.v[2]), time.Duration(rec.v[3])
			s := Sample{At: time.Duration(rec.v[1]), BitsPerSecond: bitsPerSecond(n, d), Bytes: n, Duration: d}
			res.Samples = append(res.Samples, s)
			if r.o.OnSample != nil {
				r.o.OnSample(s)
			}
		case recFinal:
			res.Bytes, res.Duration = int64(rec.v[0]), time.Duration(rec.v[1])
			for _, c := range r.data {
				res.Retransmits += tcpRetransmits(c)
			}
			r.stop()
			return res, nil
		default:
			return BulkResult{}, fmt.Errorf("control connection: %w: unexpected type %d", errRecord, rec.typ)
		}
	}
}

func (r *bulkRun) download() (BulkResult, error) {
	var got atomic.Int64
	for _, c := range r.data {
		r.wg.Go(func() {
			buf := make([]byte, bulkChunk)
			var next time.Time
			for {
				progress(c, ioTimeout, &next)
				n, err := c.Read(buf)
				got.Add(int64(n))
				if err != nil {
					r.fail(err)
					return
				}
			}
		})
	}
	// The control connection stays quiet until we send the stop; its reader delivers the final
	// record then, or tells us early that the server went away.
	type ctlResult struct {
		rec record
		err error
	}
	ctlc := make(chan ctlResult, 1)
	r.ctl.SetReadDeadline(r.start.Add(r.o.Duration + finishGrace + ioTimeout))
	go func() {
		rec, err := readRecord(r.ctl, 0)
		ctlc <- ctlResult{rec, err}
	}()
	ctlDone := false
	defer func() {
		if !ctlDone {
			r.ctl.Close()
			<-ctlc
		}
	}()

	var res BulkResult
	var prev int64
	var prevAt time.Duration
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for k := time.Duration(1); ; k++ {
		at := min(k*r.o.Interval, r.o.Duration)
		timer.Reset(time.Until(r.start.Add(at)))
		select {
		case <-timer.C:
		case err := <-r.errc:
			return BulkResult{}, fmt.Errorf("stream: %w", err)
		case cr := <-ctlc:
			ctlDone = true
			err := cr.err
			if err == nil {
				err = fmt.Errorf("%w: unexpected record type %d before the end of the test", errRecord, cr.rec.typ)
			}
			return BulkResult{}, r.failure(fmt.Errorf("control connection: %w", err))
		}
		now, elapsed := got.Load(), time.Since(r.start)
		s := Sample{At: at, BitsPerSecond: bitsPerSecond(now-prev, elapsed-prevAt), Bytes: now - prev, Duration: elapsed - prevAt}
		res.Samples = append(res.Samples, s)
		if r.o.OnSample != nil {
			r.o.OnSample(s)
		}
		prev, prevAt = now, elapsed
		if at == r.o.Duration {
			res.Bytes, res.Duration = now, elapsed
			break
		}
	}
	// Window over: ask for the sender's report and drop the data connections at once (the
	// server's writers fail and record their retransmits), then read the report.
	r.finishing.Store(true)
	if err := writeRecordTimeout(r.ctl, record{typ: recStop}, ioTimeout); err != nil {
		return BulkResult{}, fmt.Errorf("control connection: %w", err)
	}
	r.stop()
	cr := <-ctlc
	ctlDone = true
	if cr.err != nil {
		return BulkResult{}, fmt.Errorf("control connection: final report: %w", cr.err)
	}
	if cr.rec.typ != recFinal {
		return BulkResult{}, fmt.Errorf("control connection: %w: type %d, want final", errRecord, cr.rec.typ)
	}
	res.Retransmits = int64(cr.rec.v[2])
	return res, nil
}
