package traffic

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"net"
	"time"
)

// FileOptions configure a File transfer.
type FileOptions struct {
	Size    int64  // bytes to transfer; required, at most MaxFileSize
	Seed    uint64 // selects the deterministic pseudo-random content
	Reverse bool   // the server sends and the client receives (download)
	// IdleTimeout bounds any stretch without progress; default 10 s. The transfer as a whole is
	// bounded only by the context.
	IdleTimeout time.Duration
}

// Digest is a SHA-256 sum; it prints and marshals as hex.
type Digest [sha256.Size]byte

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// MarshalText encodes d as hex.
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// FileResult is the outcome of a File transfer.
type FileResult struct {
	Reverse bool  `json:"reverse"`
	Size    int64 `json:"size"`  // bytes that were to be transferred
	Bytes   int64 `json:"bytes"` // bytes the receiver got
	// Duration runs, for an upload, from the first byte sent to the receiver's report that it
	// has everything; for a download, from sending the request to the last byte received.
	Duration       time.Duration `json:"duration_ns"`
	Goodput        float64       `json:"goodput_bits_per_second"` // Bytes over Duration
	SentSHA256     Digest        `json:"sent_sha256"`
	ReceivedSHA256 Digest        `json:"received_sha256"`
	Intact         bool          `json:"intact"` // the sums are equal and Bytes == Size
}

func (r FileResult) String() string {
	dir := "upload"
	if r.Reverse {
		dir = "download"
	}
	verdict := fmt.Sprintf("intact (sha256 %.16s…)", r.ReceivedSHA256)
	if !r.Intact {
		verdict = fmt.Sprintf("CORRUPT: received %d of %d bytes, sha256 %.16s… != sent %.16s…",
			r.Bytes, r.Size, r.ReceivedSHA256, r.SentSHA256)
	}
	return fmt.Sprintf("file %s: %s in %.2f s (%s), %s", dir, formatBytes(r.Size), r.Duration.Seconds(),
		formatBits(r.Goodput), verdict)
}

const fileChunk = 128 << 10

// progressEvery is how often a receiver reports progress while a file arrives.
const progressEvery = time.Second

// sendStream writes size bytes of the stream of seed to c, hashing them into sum.
func sendStream(c net.Conn, size int64, seed uint64, sum hash.Hash, idle time.Duration) error {
	gen := newStream(seed)
	buf := make([]byte, fileChunk)
	var next time.Time
	for left := size; left > 0; {
		b := buf[:min(int64(len(buf)), left)]
		gen.Read(b)
		sum.Write(b)
		progress(c, idle, &next)
		if _, err := c.Write(b); err != nil {
			return err
		}
		left -= int64(len(b))
	}
	return nil
}

// File transfers Size bytes to (or, with Reverse, from) the server at addr and checks that they
// arrive intact. A corrupted transfer is not an error: it returns Intact false.
func File(ctx context.Context, dial DialFunc, addr string, o FileOptions) (FileResult, error) {
	if o.IdleTimeout == 0 {
		o.IdleTimeout = ioTimeout
	}
	mode := ModeFileUpload
	if o.Reverse {
		mode = ModeFileDownload
	}
	h := Header{Mode: mode, Size: uint64(max(0, o.Size)), Seed: o.Seed}
	if err := h.Validate(); err != nil {
		return FileResult{}, fmt.Errorf("traffic: file: bad options: %w", err)
	}
	if o.IdleTimeout < 0 {
		return FileResult{}, fmt.Errorf("traffic: file: bad options: negative idle timeout %v", o.IdleTimeout)
	}
	sess := newSession(ctx, dial)
	defer sess.close()
	c, err := sess.dialConn("tcp", addr)
	if err != nil {
		return FileResult{}, err
	}
	res := FileResult{Reverse: o.Reverse, Size: o.Size}
	if !o.Reverse {
		if err := handshake(c, h, nil); err != nil {
			return FileResult{}, sess.wrap("file", err)
		}
		start := time.Now()
		sum := sha256.New()
		if err := sendStream(c, o.Size, o.Seed, sum, o.IdleTimeout); err != nil {
			return FileResult{}, sess.wrap("file: sending", err)
		}
		sum.Sum(res.SentSHA256[:0])
		for {
			c.SetReadDeadline(time.Now().Add(o.IdleTimeout))
			rec, err := readRecord(c, 0)
			if err != nil {
				return FileResult{}, sess.wrap("file: waiting for the report", err)
			}
			if rec.typ == recProgress {
				continue
			}
			if rec.typ != recFileReport {
				return FileResult{}, fmt.Errorf("traffic: file: %w: type %d", errRecord, rec.typ)
			}
			res.Duration = time.Since(start)
			res.Bytes = int64(rec.v[0])
			res.ReceivedSHA256 = wordsToSum(rec.v[1:5])
			break
		}
	} else {
		start := time.Now()
		if err := handshake(c, h, nil); err != nil {
			return FileResult{}, sess.wrap("file", err)
		}
		sum := sha256.New()
		n, err := receiveStream(c, o.Size, sum, o.IdleTimeout, nil)
		res.Bytes = n
		if err != nil {
			return FileResult{}, sess.wrap("file: receiving", err)
		}
		res.Duration = time.Since(start)
		sum.Sum(res.ReceivedSHA256[:0])
		c.SetReadDeadline(time.Now().Add(o.IdleTimeout))
		rec, err := readRecord(c, recFileSum)
		if err != nil {
			return FileResult{}, sess.wrap("file: reading the sender's sum", err)
		}
		res.SentSHA256 = wordsToSum(rec.v[1:5])
	}
	res.Goodput = bitsPerSecond(res.Bytes, res.Duration)
	res.Intact = res.Bytes == res.Size && res.SentSHA256 == res.ReceivedSHA256
	return res, nil
}

// receiveStream reads up to size bytes from c into sum. It returns early, without error, at
// EOF. tick, if set, is called at least every progressEvery with the bytes so far.
func receiveStream(c net.Conn, size int64, sum hash.Hash, idle time.Duration, tick func(int64) error) (int64, error) {
	buf := make([]byte, fileChunk)
	var got int64
	var next time.Time
	lastTick := time.Now()
	for got < size {
		progress(c, idle, &next)
		n, err := c.Read(buf[:min(int64(len(buf)), size-got)])
		sum.Write(buf[:n])
		got += int64(n)
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		if tick != nil && time.Since(lastTick) >= progressEvery {
			lastTick = time.Now()
			if err := tick(got); err != nil {
				return got, err
			}
		}
	}
	return got, nil
}

func (s *Server) serveFileUpload(c net.Conn, h Header) {
	if s.accept(c) != nil {
		return
	}
	sum := sha256.New()
	idle := s.cfg.idleTimeout
	n, err := receiveStream(c, int64(h.Size), sum, idle, func(n int64) error {
		return writeRecordTimeout(c, record{typ: recProgress, v: [6]uint64{uint64(n)}}, idle)
	})
	if err != nil {
		return
	}
	var d Digest
	sum.Sum(d[:0])
	rep := record{typ: recFileReport, v: [6]uint64{uint64(n)}}
	w := sumToWords(d)
	copy(rep.v[1:], w[:])
	writeRecordTimeout(c, rep, idle)
}

func (s *Server) serveFileDownload(c net.Conn, h Header) {
	if s.accept(c) != nil {
		return
	}
	sum := sha256.New()
	if sendStream(c, int64(h.Size), h.Seed, sum, s.cfg.idleTimeout) != nil {
		return
	}
	var d Digest
	sum.Sum(d[:0])
	rec := record{typ: recFileSum}
	w := sumToWords(d)
	copy(rec.v[1:], w[:])
	writeRecordTimeout(c, rec, s.cfg.idleTimeout)
}
