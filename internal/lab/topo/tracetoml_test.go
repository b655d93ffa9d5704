package topo

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A trace in a topology file: relative to the file's directory, per direction, with an offset;
// a direction's trace replaces the rate it inherits.
func TestLoadTraceLink(t *testing.T) {
	tp, err := Load("testdata/trace-link.toml")
	if err != nil {
		t.Fatal(err)
	}
	lte, dsl := tp.Links[0], tp.Links[1]
	up, down := lte.AB.Trace, lte.BA.Trace
	if up == nil || down == nil || up.File != filepath.Join("testdata", "traces", "cell.up") || down.File != filepath.Join("testdata", "traces", "cell.down") {
		t.Fatalf("lte traces %v and %v", up, down)
	}
	if up.Offset != 2*time.Millisecond || down.Offset != 0 || up.Len() != 4 || down.Len() != 5 {
		t.Errorf("lte: up %v (offset %v, %d lines), down %v (offset %v, %d lines)", up, up.Offset, up.Len(), down, down.Offset, down.Len())
	}
	if lte.AB.Rate != 0 || lte.AB.Delay != 40*time.Millisecond || lte.AB.Loss != 0.5 || lte.BA.Delay != 40*time.Millisecond {
		t.Errorf("lte shapes %+v / %+v: delay and loss apply beside a trace", lte.AB, lte.BA)
	}
	if dsl.AB.Rate != 20e6 || dsl.AB.Trace != nil || dsl.BA.Rate != 0 || dsl.BA.Trace == nil {
		t.Errorf("dsl: ab %+v, ba %+v; want ab at 20 Mbit/s and ba the trace alone", dsl.AB, dsl.BA)
	}
	// One file is read once: the two links' directions share its timestamps.
	if &dsl.BA.Trace.millis[0] != &up.millis[0] {
		t.Error("the same trace file was parsed twice")
	}
}

var badTraceFiles = []struct {
	name   string
	link   string // the [[link]] table's keys after a and b
	line   int
	reason string
}{
	{"rate and trace in one table", "rate = \"10mbit\"\ntrace = \"testdata/traces/cell.up\"\n", 10,
		"rate and trace are both set"},
	{"rate and trace in link.ab", "trace = \"testdata/traces/cell.up\"\n[link.ab]\nrate = 5\ntrace = \"testdata/traces/cell.up\"\n", 12,
		"rate and trace are both set"},
	{"missing trace file", "trace = \"testdata/traces/nope.up\"\n", 9,
		"testdata/traces/nope.up: cannot read trace: no such file or directory"},
	{"trace going back names its line", "[link.ba]\ntrace = \"testdata/traces/back.trace\"\n", 10,
		"testdata/traces/back.trace:3: timestamp 3 ms is before the previous one"},
	{"trace not a string", "trace = 5\n", 9, "trace must be a string"},
	{"offset without a trace", "rate = \"1mbit\"\ntrace_offset = \"1s\"\n", 10, "trace_offset without a trace"},
	{"offset beyond the period", "trace = \"testdata/traces/cell.up\"\ntrace_offset = \"4ms\"\n", 10,
		"trace_offset 4ms is not within the trace's period of 4ms"},
	{"bad offset", "trace = \"testdata/traces/cell.up\"\ntrace_offset = \"-1s\"\n", 10, `negative trace_offset "-1s"`},
	{"kernel link", "kernel = true\ntrace = \"testdata/traces/cell.up\"\n", 10, "a kernel link cannot replay a trace"},
}

func TestParseTraceErrors(t *testing.T) {
	for _, tt := range badTraceFiles {
		t.Run(tt.name, func(t *testing.T) {
			doc := "[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n\n[[link]]\na = \"a\"\nb = \"b\"\n" + tt.link
			_, err := Parse("lab.toml", []byte(doc))
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			first := strings.SplitN(err.Error(), "\n", 2)[0]
			if want := "lab.toml:" + strconv.Itoa(tt.line) + ": link a-b: "; !strings.HasPrefix(first, want) || !strings.Contains(first, tt.reason) {
				t.Errorf("error %q, want it to start with %q and contain %q", err, want, tt.reason)
			}
			var te *Error
			if !errors.As(err, &te) {
				t.Errorf("error %#v is not a *Error", err)
			}
		})
	}
}

// A topology built in Go is checked too: a rate beside a trace, or a trace summary, is refused.
func TestValidateTrace(t *testing.T) {
	tr, err := LoadTrace("testdata/traces/cell.up")
	if err != nil {
		t.Fatal(err)
	}
	summary := new(Trace)
	if err := summary.UnmarshalJSON([]byte(`{"File":"x","PeriodMillis":4,"Opportunities":4}`)); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		shape  Shape
		reason string
	}{
		{Shape{Trace: tr, Delay: time.Millisecond}, ""},
		{Shape{Trace: tr, Rate: 1e6}, "both a rate (1 Mbit/s) and a trace cell.up"},
		{Shape{Trace: summary}, "holds no timestamps"},
		{Shape{Trace: &Trace{File: "x", Offset: time.Hour, millis: tr.millis, period: tr.period, count: tr.count}}, "outside the period"},
	} {
		tp := &Topology{Name: "t", Hosts: []Host{{Name: "a"}, {Name: "b"}}, Links: []Link{{A: Endpoint{Host: "a"}, B: Endpoint{Host: "b"}, AB: tt.shape}}}
		err := tp.Validate()
		if tt.reason == "" && err != nil || tt.reason != "" && (err == nil || !strings.Contains(err.Error(), tt.reason)) {
			t.Errorf("shape %+v: Validate = %v, want %q", tt.shape, err, tt.reason)
		}
	}
}
