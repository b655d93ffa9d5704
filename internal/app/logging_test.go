package app

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The global --log-format reaches a daemon's logger: with json every line of a daemon that
// fails after it has started logging is a JSON object; a bad format is a usage error naming
// it; the top-level help documents the option.
func TestLogFormatFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // the format in effect
	}{
		{[]string{"x"}, "text"},
		{[]string{"--log-format", "json", "x"}, "json"},
		{[]string{"--log-format=json", "x"}, "json"},
		{[]string{"-log-format", "text", "x"}, "text"},
	} {
		e := env{}
		rest, err := parseGlobal(&e, c.args)
		if err != nil || len(rest) != 1 || rest[0] != "x" || e.defaultLogFormat() != c.want {
			t.Errorf("parseGlobal(%q): rest %q, format %q, err %v; want [x], %q", c.args, rest, e.defaultLogFormat(), err, c.want)
		}
	}
	for _, bad := range [][]string{{"--log-format", "yaml", "tunnel"}, {"--log-format"}, {"--log-format=", "lab"}} {
		code, _, errOut := run(bad...)
		if code != exitUsage || !strings.Contains(errOut, "log format") && !strings.Contains(errOut, "needs a value") {
			t.Errorf("braid %q: code %d, stderr %q; want a usage error about the log format", bad, code, errOut)
		}
	}
	if code, out, _ := run("--help"); code != exitOK || !strings.Contains(out, "--log-format text|json") {
		t.Errorf("braid --help does not document --log-format:\n%s", out)
	}
	// A daemon's own flag takes the global default, and wins over it: runDaemon, as every
	// daemon role runs, with a role that logs two lines and stops.
	load := func(string) (int, error) { return 0, nil }
	serve := func(_ context.Context, _ int, log *slog.Logger) error {
		log.Info("backend up", "backend", "b1")
		log.Warn("backend down", "backend", "b1", "err", "refused")
		return nil
	}
	for _, c := range []struct {
		args []string
		json bool
	}{
		{[]string{"--log-format", "json", "lb"}, true},
		{[]string{"lb", "--log-format", "json"}, true},
		{[]string{"--log-format", "json", "lb", "--log-format", "text"}, false},
		{[]string{"lb"}, false},
	} {
		var eb bytes.Buffer
		e := env{stdout: io.Discard, stderr: &eb}
		rest, err := parseGlobal(&e, c.args)
		if err != nil {
			t.Fatal(err)
		}
		if code := runDaemon(e, rest[0], "doc", append(rest[1:], "--config", "site.toml"), load, serve); code != exitOK {
			t.Fatalf("%q: exit %d: %s", c.args, code, eb.String())
		}
		lines := strings.Split(strings.TrimSpace(eb.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("%q: %d lines: %q", c.args, len(lines), eb.String())
		}
		for _, ln := range lines {
			var m map[string]any
			isJSON := json.Unmarshal([]byte(ln), &m) == nil
			if isJSON != c.json {
				t.Errorf("%q: line %q: JSON %v, want %v", c.args, ln, isJSON, c.json)
			}
			if isJSON && (m["backend"] != "b1" || m["msg"] == nil || m["level"] == nil) {
				t.Errorf("%q: JSON line lacks msg, level or backend: %q", c.args, ln)
			}
			if !isJSON && (!strings.Contains(ln, "backend=b1") || !strings.Contains(ln, "level=")) {
				t.Errorf("%q: text line is not key=value: %q", c.args, ln)
			}
		}
	}
	if code, _, errOut := run("lb", "--log-format", "xml", "--config", "x.toml"); code != exitUsage || !strings.Contains(errOut, `log format "xml"`) {
		t.Errorf("braid lb --log-format xml: code %d, stderr %q; want a usage error naming the format", code, errOut)
	}
}

// fakeClock is a time source the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func limitedLogger(clock *fakeClock) (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	h := slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})
	return slog.New(limitWarnings(h, 3, 10*time.Second, clock.now)), &b
}

type logLine struct {
	Level      string
	Msg        string
	Suppressed int
	Message    string
	Peer       string
}

func lines(t *testing.T, b *bytes.Buffer) []logLine {
	t.Helper()
	var out []logLine
	for _, ln := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if ln == "" {
			continue
		}
		var l logLine
		if err := json.Unmarshal([]byte(ln), &l); err != nil {
			t.Fatalf("%q: %v", ln, err)
		}
		out = append(out, l)
	}
	b.Reset()
	return out
}

func count(ls []logLine, msg string) (n, suppressed int) {
	for _, l := range ls {
		if l.Msg == msg {
			n++
			suppressed += l.Suppressed
		}
	}
	return n, suppressed
}

// A warning repeated 100 times in a window is written 3 times (the burst); the 97 others are
// counted and the count is reported by the message's next line after the window. Other
// messages and info lines are not held back by it; derived loggers share the limit; a message
// that stops gets its count reported on a line of its own.
func TestWarnRateLimit(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	log, b := limitedLogger(clock)
	peerLog := log.With("peer", "b")
	for i := 0; i < 100; i++ {
		peerLog.Warn("handshake refused", "i", i)
		log.Info("path state", "i", i)
		clock.t = clock.t.Add(10 * time.Millisecond) // 1 s in all: one window
	}
	log.Warn("backend down")
	ls := lines(t, b)
	if n, _ := count(ls, "handshake refused"); n != 3 {
		t.Errorf("handshake refused written %d times in one window, want the burst, 3", n)
	}
	if n, _ := count(ls, "path state"); n != 100 {
		t.Errorf("info lines written %d times, want all 100", n)
	}
	if n, _ := count(ls, "backend down"); n != 1 {
		t.Errorf("another warning written %d times, want 1: one message's limit holds back another", n)
	}
	if ls[0].Peer != "b" {
		t.Errorf("a derived logger's attributes are lost: %+v", ls[0])
	}

	// The next window: the first line carries the count of the last one.
	clock.t = clock.t.Add(10 * time.Second)
	peerLog.Warn("handshake refused")
	ls = lines(t, b)
	if n, s := count(ls, "handshake refused"); n != 1 || s != 97 {
		t.Errorf("after the window: %d lines carrying suppressed=%d, want 1 line carrying 97 (%+v)", n, s, ls)
	}

	// A message that stops: its count comes on a line of its own once its window is over and
	// anything else is logged.
	for i := 0; i < 10; i++ {
		log.Warn("token sweep")
	}
	lines(t, b)
	clock.t = clock.t.Add(11 * time.Second)
	log.Info("tunnel up")
	ls = lines(t, b)
	var reported int
	for _, l := range ls {
		if l.Msg == suppressedMsg && l.Message == "token sweep" {
			reported += l.Suppressed
			if l.Level != "WARN" {
				t.Errorf("the count of a warning is reported at level %s", l.Level)
			}
		}
	}
	if reported != 7 {
		t.Errorf("token sweep: %d suppressed lines reported, want 7 (10 - burst 3): %+v", reported, ls)
	}
	if n, _ := count(ls, "tunnel up"); n != 1 {
		t.Errorf("the line that triggered the report is lost: %+v", ls)
	}
	// Reported once only.
	clock.t = clock.t.Add(11 * time.Second)
	log.Info("tunnel down")
	if ls := lines(t, b); len(ls) != 1 {
		t.Errorf("after the report, one line logs %d: %+v", len(ls), ls)
	}
}

// The limiter tracks at most maxWarnKeys messages, however many different ones come.
func TestWarnRateLimitBounded(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	var b bytes.Buffer
	h := limitWarnings(slog.NewTextHandler(&b, nil), 3, time.Minute, clock.now).(*limitHandler)
	log := slog.New(h)
	for i := 0; i < 10*maxWarnKeys; i++ {
		log.Warn("refused from " + strings.Repeat("x", i%50) + string(rune('a'+i%26)) + time.Duration(i).String())
	}
	if n := len(h.l.keys); n > maxWarnKeys {
		t.Errorf("%d messages tracked, more than %d", n, maxWarnKeys)
	}
}
