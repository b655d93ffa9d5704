package topo

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustTrace(t testing.TB, text string) *Trace {
	t.Helper()
	tr, err := ParseTrace("t.trace", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestParseTraceGood(t *testing.T) {
	for _, tt := range []struct {
		name, text string
		millis     []uint32
		mean       uint64 // bit/s
	}{
		{"one line is 12 Mbit/s", "1\n", []uint32{1}, 12e6},
		{"no final newline", "1", []uint32{1}, 12e6},
		{"repeats and gaps", "0\n2\n2\n2\n4\n", []uint32{0, 2, 2, 2, 4}, 5 * 1500 * 8 * 1000 / 4},
		{"CRLF, spaces, blank lines, leading zeros", " 3\r\n\r\n\t007 \n10\r\n", []uint32{3, 7, 10}, 3 * 1500 * 8 * 100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr := mustTrace(t, tt.text)
			if !slices.Equal(tr.millis, tt.millis) || tr.Len() != len(tt.millis) {
				t.Errorf("timestamps %v, want %v", tr.millis, tt.millis)
			}
			if got := tr.MeanRate(); got != tt.mean {
				t.Errorf("mean rate %d, want %d", got, tt.mean)
			}
			if tr.Period() != time.Duration(tt.millis[len(tt.millis)-1])*time.Millisecond {
				t.Errorf("period %v", tr.Period())
			}
		})
	}
}

func TestParseTraceBad(t *testing.T) {
	for _, tt := range []struct {
		name, text string
		line       int // 0: the whole file
		reason     string
	}{
		{"empty", "", 0, "empty trace"},
		{"only blank lines", "\n \n\r\n", 0, "empty trace"},
		{"goes back", "1\n5\n5\n4\n9\n", 4, "before the previous one"},
		{"negative", "1\n-3\n", 2, `invalid timestamp "-3"`},
		{"fraction", "1\n2.5\n", 2, `invalid timestamp "2.5"`},
		{"words", "1\n2\nthree\n", 3, `invalid timestamp "three"`},
		{"two numbers on a line", "1 2\n", 1, `invalid timestamp "1 2"`},
		{"too large", "99999999999999999999999\n", 1, "is above"},
		{"lasts 0 ms", "0\n0\n", 2, "lasts 0 ms"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := ParseTrace("cell.down", []byte(tt.text))
			var te *TraceError
			if !errors.As(err, &te) {
				t.Fatalf("ParseTrace = %v, %v; want a *TraceError", tr, err)
			}
			if te.File != "cell.down" || te.Line != tt.line || !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q (line %d), want cell.down line %d containing %q", err, te.Line, tt.line, tt.reason)
			}
			if tt.line > 0 && !strings.HasPrefix(err.Error(), "cell.down:") {
				t.Errorf("error %q does not start with the file and line", err)
			}
		})
	}
}

func TestLoadTraceUnreadable(t *testing.T) {
	_, err := LoadTrace("testdata/no-such.trace")
	var te *TraceError
	if !errors.As(err, &te) || te.File != "testdata/no-such.trace" || !strings.Contains(err.Error(), "cannot read trace") {
		t.Errorf("LoadTrace of a missing file: %v", err)
	}
}

// The opportunities of the endless replay, their times and the capacity between two times.
func TestTraceReplay(t *testing.T) {
	tr := mustTrace(t, "0\n2\n2\n5\n") // period 5 ms, 4 opportunities a period
	ms := time.Millisecond
	wantAt := []time.Duration{0, 2 * ms, 2 * ms, 5 * ms, 5 * ms, 7 * ms, 7 * ms, 10 * ms, 10 * ms}
	for j, want := range wantAt {
		if got := tr.At(int64(j)); got != want {
			t.Errorf("At(%d) = %v, want %v", j, got, want)
		}
	}
	for _, tt := range []struct {
		p    time.Duration
		want int64
	}{{0, 0}, {1, 1}, {2 * ms, 1}, {3 * ms, 3}, {5 * ms, 4}, {5*ms + 1, 5}, {12 * ms, 9}} {
		if got := tr.Next(tt.p); got != tt.want {
			t.Errorf("Next(%v) = %d, want %d", tt.p, got, tt.want)
		}
	}
	// (0, 5 ms] holds the opportunities at 2, 2 and 5 (and the next period's at 5 again).
	if got := tr.Bytes(0, 5*ms); got != 4*1500 {
		t.Errorf("Bytes(0, 5ms) = %d, want %d", got, 4*1500)
	}
	if got, want := tr.Bytes(-ms, 100*ms), int64(1+20*4)*1500; got != want {
		t.Errorf("Bytes(-1ms, 100ms) = %d, want %d", got, want)
	}
	if got := tr.Bytes(3*ms, 3*ms); got != 0 {
		t.Errorf("empty window: %d", got)
	}
	if o := tr.WithOffset(7 * ms).Offset; o != 2*ms {
		t.Errorf("WithOffset(7ms) on a 5 ms trace: offset %v, want 2ms", o)
	}
	if o := tr.WithOffset(-ms).Offset; o != 4*ms {
		t.Errorf("WithOffset(-1ms): offset %v, want 4ms", o)
	}
}

// The traces shipped in lab/traces parse and have the mean rates their README gives (to its
// one decimal).
func TestShippedTraces(t *testing.T) {
	for _, tt := range []struct {
		file   string
		period time.Duration
		mean   float64 // Mbit/s, as in lab/traces/README.md
	}{
		{"TMobile-LTE-short.down", 140 * time.Second, 16.7},
		{"TMobile-LTE-short.up", 140 * time.Second, 13.3},
		{"Verizon-LTE-short.down", 140 * time.Second, 5.0},
		{"Verizon-LTE-short.up", 140 * time.Second, 6.0},
		{"ATT-LTE-driving-2016.down", 120 * time.Second, 4.6},
		{"ATT-LTE-driving-2016.up", 120 * time.Second, 1.9},
	} {
		tr, err := LoadTrace(filepath.Join("..", "..", "..", "lab", "traces", tt.file))
		if err != nil {
			t.Fatal(err)
		}
		if d := tr.Period() - tt.period; d.Abs() > time.Second {
			t.Errorf("%s: period %v, want about %v", tt.file, tr.Period(), tt.period)
		}
		if m := float64(tr.MeanRate()) / 1e6; math.Abs(m-tt.mean) > 0.06 {
			t.Errorf("%s: mean %.2f Mbit/s, want %.1f", tt.file, m, tt.mean)
		}
	}
}

// Over the control socket a trace travels as a summary, which describes but cannot shape.
func TestTraceJSON(t *testing.T) {
	tr := mustTrace(t, "1\n1\n2\n").WithOffset(time.Millisecond)
	b, err := json.Marshal(Shape{Trace: tr, Delay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("millis")) || len(b) > 300 {
		t.Errorf("JSON of a trace shape is not a summary: %s", b)
	}
	var s Shape
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Trace.String() != tr.String() || s.Trace.MeanRate() != tr.MeanRate() || s.Trace.Replayable() {
		t.Errorf("decoded %v (replayable %v), want a summary of %v", s.Trace, s.Trace.Replayable(), tr)
	}
	if got := s.RateText(); got != "trace t.trace +1ms (mean 18 Mbit/s)" {
		t.Errorf("RateText = %q", got)
	}
}

// FuzzParseTrace checks the parser's properties: errors are *TraceError values naming the file
// and a line of it; a parsed trace never goes back, lasts more than 0 ms, counts one
// opportunity per timestamp line, and its written form parses back to the same trace.
func FuzzParseTrace(f *testing.F) {
	for _, seed := range []string{"1\n", "0\n2\n2\n4\n", " 3\r\n\r\n007\n", "", "1\n-3\n", "5\n4\n", "0\n", "1 2\n", "99999999999999999999\n"} {
		f.Add([]byte(seed))
	}
	if b, err := os.ReadFile("../../../lab/traces/ATT-LTE-driving-2016.up"); err == nil {
		f.Add(b[:2000])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.trace"
		lines := bytes.Count(data, []byte("\n")) + 1
		tr, err := ParseTrace(name, data)
		if err != nil {
			var te *TraceError
			if tr != nil || !errors.As(err, &te) || te.File != name || te.Line < 0 || te.Line > lines || !strings.HasPrefix(err.Error(), name+":") {
				t.Fatalf("ParseTrace = %v, %#v", tr, err)
			}
			return
		}
		if tr.Len() == 0 || tr.Period() <= 0 || !tr.Replayable() {
			t.Fatalf("accepted an empty trace: %+v", tr)
		}
		for i := 1; i < len(tr.millis); i++ {
			if tr.millis[i] < tr.millis[i-1] {
				t.Fatalf("timestamps go back at %d: %v", i, tr.millis)
			}
		}
		if tr.Bytes(0, tr.Period()) != int64(tr.Len())*TraceOpportunity {
			t.Fatalf("one period holds %d bytes for %d opportunities", tr.Bytes(0, tr.Period()), tr.Len())
		}
		var buf bytes.Buffer
		tr.WriteTo(&buf)
		again, err := ParseTrace(name, buf.Bytes())
		if err != nil || !slices.Equal(again.millis, tr.millis) || again.Period() != tr.Period() {
			t.Fatalf("round trip: %v, %v", again, err)
		}
	})
}

func TestLoadTraceNotAFile(t *testing.T) {
	for _, path := range []string{"/dev/zero", "testdata"} {
		if _, err := LoadTrace(path); err == nil || !strings.Contains(err.Error(), path+": cannot read trace") {
			t.Errorf("LoadTrace(%s): %v", path, err)
		}
	}
}
