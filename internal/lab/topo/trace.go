package topo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"braid/internal/units"
)

// A trace is recorded link capacity, in the format the network-emulation tools share (the
// cellular traces of Winstein et al., NSDI 2013, distributed with mahimahi; see lab/traces):
//
//	1        one integer per line: a time in milliseconds from the start of the trace;
//	1        each line is one opportunity for one 1500-byte packet to leave the bottleneck
//	3        queue; several opportunities in the same millisecond repeat the timestamp
//	...
//
// The timestamps never decrease, and the trace repeats from its beginning after its last
// timestamp: the period is the last timestamp, so a file holding only "1" is one opportunity
// every millisecond, a constant 12 Mbit/s. Opportunity j of the endless replay (cycle j/n,
// line j%n of n) is at trace time (j/n)·period + t[j%n]. Blank lines are ignored; leading and
// trailing spaces and CR line ends are allowed.
//
// The emulator counts opportunities in bytes (see package emu): each lets TraceOpportunity
// bytes leave at its instant, so the bytes a saturated trace link delivers per second are the
// trace's.

// TraceOpportunity is the number of IP bytes one line of a trace lets leave the queue.
const TraceOpportunity = 1500

// maxTraceMillis bounds a timestamp (about 24 days), so that times fit any arithmetic here.
const maxTraceMillis = 1 << 31

// Trace is a parsed trace and where its replay starts. A *Trace is immutable once parsed;
// WithOffset returns a copy that shares the timestamps.
type Trace struct {
	// File is the trace's path as resolved when it was loaded (or the name given to ParseTrace).
	File string
	// Offset is how far into the trace the replay starts, in [0, period).
	Offset time.Duration

	millis []uint32 // the timestamps, never decreasing; empty in a summary (see UnmarshalJSON)
	period int64    // the last timestamp, in ms
	count  int      // len(millis), kept for summaries
}

// TraceError is a problem in a trace file: "file:line: reason", or "file: reason" when the
// problem is not on one line (an unreadable or empty file).
type TraceError struct {
	File   string
	Line   int // 0: the whole file
	Reason string
}

func (e *TraceError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
	}
	return e.File + ": " + e.Reason
}

// maxTraceFile bounds the size of a trace file (the largest shipped one is 1.2 MB).
const maxTraceFile = 256 << 20

// LoadTrace reads and parses the trace file at path, a regular file of at most 256 MiB.
func LoadTrace(path string) (*Trace, error) {
	fail := func(err error) (*Trace, error) {
		reason := err.Error()
		if pe, ok := err.(*os.PathError); ok {
			reason = pe.Err.Error()
		}
		return nil, &TraceError{File: path, Reason: "cannot read trace: " + reason}
	}
	f, err := os.Open(path)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	switch fi, err := f.Stat(); {
	case err != nil:
		return fail(err)
	case !fi.Mode().IsRegular():
		return fail(fmt.Errorf("not a regular file (%v)", fi.Mode().Type()))
	case fi.Size() > maxTraceFile:
		return fail(fmt.Errorf("%d bytes, more than %d", fi.Size(), maxTraceFile))
	}
	data, err := io.ReadAll(io.LimitReader(f, maxTraceFile+1))
	if err != nil {
		return fail(err)
	}
	return ParseTrace(path, data)
}

// ParseTrace parses a trace; name is used in errors and as the trace's File. The error is a
// *TraceError.
func ParseTrace(name string, data []byte) (*Trace, error) {
	t := &Trace{File: name}
	line := 0
	last := int64(0)
	for len(data) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i], data[i+1:]
		} else {
			l, data = data, nil
		}
		l = bytes.TrimRight(l, "\r")
		l = bytes.Trim(l, " \t")
		if len(l) == 0 {
			continue
		}
		v, err := parseMillis(l)
		if err != nil {
			return nil, &TraceError{File: name, Line: line, Reason: err.Error()}
		}
		if v < last {
			return nil, &TraceError{File: name, Line: line, Reason: fmt.Sprintf("timestamp %d ms is before the previous one, %d ms: a trace never goes back", v, last)}
		}
		last = v
		t.millis = append(t.millis, uint32(v))
	}
	switch {
	case len(t.millis) == 0:
		return nil, &TraceError{File: name, Reason: "empty trace: no timestamps"}
	case last == 0:
		return nil, &TraceError{File: name, Line: line, Reason: "the trace lasts 0 ms: its last timestamp, the period it repeats with, must be above 0"}
	}
	t.period, t.count = last, len(t.millis)
	return t, nil
}

// parseMillis parses one timestamp: decimal digits only.
func parseMillis(b []byte) (int64, error) {
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("invalid timestamp %q: want a whole number of milliseconds", clip(b))
		}
	}
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || v > maxTraceMillis {
		return 0, fmt.Errorf("timestamp %q is above %d ms", clip(b), int64(maxTraceMillis))
	}
	return v, nil
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

// WriteTo writes t in the trace format, one timestamp a line: ParseTrace of the output gives
// back t (normalised: no blank lines, spaces or CRs, no leading zeros).
func (t *Trace) WriteTo(w io.Writer) (int64, error) {
	var buf []byte
	for _, m := range t.millis {
		buf = strconv.AppendUint(buf, uint64(m), 10)
		buf = append(buf, '\n')
	}
	n, err := w.Write(buf)
	return int64(n), err
}

// WithOffset returns a copy of t whose replay starts off into the trace (taken modulo the
// period, so a negative offset counts back from the end).
func (t *Trace) WithOffset(off time.Duration) *Trace {
	c := *t
	p := t.Period()
	if p > 0 {
		off %= p
		if off < 0 {
			off += p
		}
	}
	c.Offset = off
	return &c
}

// Len is the number of opportunities in one period.
func (t *Trace) Len() int { return t.count }

// Period is how long the trace lasts before it repeats: its last timestamp.
func (t *Trace) Period() time.Duration { return time.Duration(t.period) * time.Millisecond }

// MeanRate is the trace's capacity averaged over its period, in bit/s of IP packets.
func (t *Trace) MeanRate() uint64 {
	if t.period == 0 {
		return 0
	}
	return uint64(t.count) * TraceOpportunity * 8 * 1000 / uint64(t.period)
}

// Replayable reports whether t holds its timestamps (a summary decoded from JSON does not).
func (t *Trace) Replayable() bool { return t != nil && len(t.millis) > 0 && t.period > 0 }

// At returns the trace time of opportunity j of the endless replay (j ≥ 0).
func (t *Trace) At(j int64) time.Duration {
	n := int64(len(t.millis))
	c, i := j/n, j%n
	return time.Duration(c*t.period+int64(t.millis[i])) * time.Millisecond
}

// Next returns the index of the first opportunity of the endless replay at trace time p or
// later (p ≥ 0).
func (t *Trace) Next(p time.Duration) int64 {
	n := int64(len(t.millis))
	period := time.Duration(t.period) * time.Millisecond
	c := int64(p / period)
	within := p - time.Duration(c)*period
	// The first timestamp ≥ within; within < period = the last timestamp, so there is one.
	i := sort.Search(len(t.millis), func(k int) bool { return time.Duration(t.millis[k])*time.Millisecond >= within })
	return c*n + int64(i)
}

// count returns the number of opportunities of the endless replay at trace times ≤ p.
func (t *Trace) countTo(p time.Duration) int64 {
	if p < 0 {
		return 0
	}
	n := int64(len(t.millis))
	period := time.Duration(t.period) * time.Millisecond
	c := int64(p / period)
	within := p - time.Duration(c)*period
	i := sort.Search(len(t.millis), func(k int) bool { return time.Duration(t.millis[k])*time.Millisecond > within })
	return c*n + int64(i)
}

// Bytes is the capacity of the trace between trace times from (excluded) and to (included):
// the opportunities in (from, to] times TraceOpportunity.
func (t *Trace) Bytes(from, to time.Duration) int64 {
	if !t.Replayable() || to <= from {
		return 0
	}
	return (t.countTo(to) - t.countTo(from)) * TraceOpportunity
}

// String describes the trace for humans: its file's base name, the offset if any, and the
// mean rate, e.g. "trace TMobile-LTE-short.down +30s (mean 16.7 Mbit/s)".
func (t *Trace) String() string {
	if t == nil {
		return "no trace"
	}
	s := "trace " + filepath.Base(t.File)
	if t.Offset != 0 {
		s += " +" + t.Offset.String()
	}
	return s + " (mean " + units.FormatRate(t.MeanRate()) + ")"
}

// traceSummary is what a trace looks like in JSON (lab status over the control socket): its
// description, not its thousands of timestamps.
type traceSummary struct {
	File          string
	Offset        time.Duration
	PeriodMillis  int64
	Opportunities int
}

// MarshalJSON encodes a summary of t: file, offset, period and number of opportunities.
func (t *Trace) MarshalJSON() ([]byte, error) {
	return json.Marshal(traceSummary{File: t.File, Offset: t.Offset, PeriodMillis: t.period, Opportunities: t.count})
}

// UnmarshalJSON decodes a summary: enough for Len, Period, MeanRate and String, but not
// Replayable, so it cannot shape a link.
func (t *Trace) UnmarshalJSON(b []byte) error {
	var s traceSummary
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*t = Trace{File: s.File, Offset: s.Offset, period: s.PeriodMillis, count: s.Opportunities}
	return nil
}

// RateText describes the capacity of a shape for humans: its rate, or its trace.
func (s Shape) RateText() string {
	if s.Trace != nil {
		return s.Trace.String()
	}
	return units.FormatRate(s.Rate)
}

// MeanRate is the shape's rate, or its trace's mean rate; 0 means unlimited.
func (s Shape) MeanRate() uint64 {
	if s.Trace != nil {
		return s.Trace.MeanRate()
	}
	return s.Rate
}
