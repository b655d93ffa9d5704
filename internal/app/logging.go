package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// logFormats are the values of --log-format, the global option and each daemon's.
var logFormats = []string{"text", "json"}

// parseGlobal takes braid's global options from the front of args (before the command):
// --log-format text|json, also as --log-format=json. It returns the rest.
func parseGlobal(e *env, args []string) (rest []string, err error) {
	for len(args) > 0 {
		a := args[0]
		var v string
		switch {
		case a == "--log-format" || a == "-log-format":
			if len(args) < 2 {
				return nil, fmt.Errorf("%s needs a value: %s", a, strings.Join(logFormats, " or "))
			}
			v, args = args[1], args[2:]
		case strings.HasPrefix(a, "--log-format=") || strings.HasPrefix(a, "-log-format="):
			_, v, _ = strings.Cut(a, "=")
			args = args[1:]
		default:
			return args, nil
		}
		if err := checkLogFormat(v); err != nil {
			return nil, err
		}
		e.logFormat = v
	}
	return args, nil
}

func checkLogFormat(f string) error {
	for _, k := range logFormats {
		if f == k {
			return nil
		}
	}
	return fmt.Errorf("log format %q is not %s", f, strings.Join(logFormats, " or "))
}

// logFormat is the format a command logs in unless its own --log-format says otherwise.
func (e env) defaultLogFormat() string {
	if e.logFormat == "" {
		return "text"
	}
	return e.logFormat
}

// newLogger returns the logger of a daemon: format text or json on stderr, debug lines with
// verbose, and warnings rate-limited per message (limitWarnings).
func newLogger(e env, format string, verbose bool) (*slog.Logger, error) {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return newLoggerLevel(e.stderr, format, level)
}

func newLoggerLevel(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	if format == "" {
		format = "text"
	}
	if err := checkLogFormat(format); err != nil {
		return nil, err
	}
	o := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if format == "json" {
		h = slog.NewJSONHandler(w, o)
	} else {
		h = slog.NewTextHandler(w, o)
	}
	return slog.New(limitWarnings(h, warnBurst, warnInterval, time.Now)), nil
}

// A message logged at warning level or above may be written warnBurst times per warnInterval;
// more are counted and not written. A busy failure (a flood of refused packets, a peer that
// keeps failing its handshake) then shows as a few lines and a count, not as a log that hides
// everything else.
const (
	warnBurst    = 5
	warnInterval = 10 * time.Second
	// maxWarnKeys bounds the messages tracked; the oldest window is forgotten first.
	maxWarnKeys = 256
)

// warnLimiter is the state the handlers of one logger share (WithAttrs and WithGroup make new
// handlers on the same limiter).
type warnLimiter struct {
	mu       sync.Mutex
	burst    int
	interval time.Duration
	now      func() time.Time
	keys     map[string]*warnWindow
	nextScan time.Time // when windows are next looked at for counts to report
}

// warnWindow is one message's current window: from start, written lines and suppressed ones.
type warnWindow struct {
	start      time.Time
	written    int
	suppressed int
	level      slog.Level
}

// limitHandler writes through h, rate-limiting warnings per message.
type limitHandler struct {
	h slog.Handler
	l *warnLimiter
}

// limitWarnings wraps h: each message at warning level or above is written at most burst times
// per interval. What is held back is counted: the first line of the message written after
// its window carries suppressed=N, and a message that does not come back gets a line of its
// own ("log lines suppressed", with the message and the count) once its window has ended and
// anything else is logged.
func limitWarnings(h slog.Handler, burst int, interval time.Duration, now func() time.Time) slog.Handler {
	return &limitHandler{h: h, l: &warnLimiter{burst: burst, interval: interval, now: now, keys: map[string]*warnWindow{}}}
}

func (h *limitHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.h.Enabled(ctx, level)
}

func (h *limitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &limitHandler{h: h.h.WithAttrs(as), l: h.l}
}

func (h *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{h: h.h.WithGroup(name), l: h.l}
}

// suppressedMsg is the message of the line that reports a count no later line carried.
const suppressedMsg = "log lines suppressed"

func (h *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	now := h.l.now()
	write, carried, expired := h.l.admit(now, r.Level, r.Message)
	for _, x := range expired {
		rec := slog.NewRecord(now, x.level, suppressedMsg, 0)
		rec.AddAttrs(slog.String("message", x.msg), slog.Int("suppressed", x.n), slog.Duration("window", h.l.interval))
		if err := h.h.Handle(ctx, rec); err != nil {
			return err
		}
	}
	if !write {
		return nil
	}
	if carried > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", carried))
	}
	return h.h.Handle(ctx, r)
}

// expiredCount is a count of suppressed lines whose window ended without a later line.
type expiredCount struct {
	msg   string
	n     int
	level slog.Level
}

// admit says whether a line of level and msg is written now, the count of its message's
// lines suppressed in the window before (to be carried by this line), and the counts of other
// messages whose windows have ended.
func (l *warnLimiter) admit(now time.Time, level slog.Level, msg string) (write bool, carried int, expired []expiredCount) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !now.Before(l.nextScan) && len(l.keys) > 0 {
		l.nextScan = now.Add(l.interval / 4)
		for k, w := range l.keys {
			if k == msg || now.Sub(w.start) < l.interval {
				continue
			}
			if w.suppressed > 0 {
				expired = append(expired, expiredCount{msg: k, n: w.suppressed, level: w.level})
			}
			delete(l.keys, k)
		}
	}
	if level < slog.LevelWarn {
		return true, 0, expired
	}
	w := l.keys[msg]
	if w != nil && now.Sub(w.start) >= l.interval {
		carried = w.suppressed
		w = nil
	}
	if w == nil {
		if len(l.keys) >= maxWarnKeys {
			l.forgetOldestLocked()
		}
		w = &warnWindow{start: now}
		l.keys[msg] = w
	}
	w.level = max(w.level, level)
	if w.written < l.burst {
		w.written++
		return true, carried, expired
	}
	w.suppressed++
	return false, carried, expired
}

// forgetOldestLocked drops the window that started first (its count is lost: only when more
// than maxWarnKeys different messages warn within one interval).
func (l *warnLimiter) forgetOldestLocked() {
	var oldest string
	var at time.Time
	for k, w := range l.keys {
		if oldest == "" || w.start.Before(at) {
			oldest, at = k, w.start
		}
	}
	delete(l.keys, oldest)
}
