// Package metrics writes the Prometheus text exposition format (version 0.0.4) and serves a
// role's status endpoint: /metrics for Prometheus, /status (also /status.json) as JSON for
// `braid status`, and at / the live status page (package page) that polls it.
package metrics

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"braid/internal/metrics/page"
)

// Kind is a metric type.
type Kind string

const (
	Counter Kind = "counter"
	Gauge   Kind = "gauge"
)

// Writer writes metrics in the text format. Each metric name gets its HELP and TYPE lines once,
// before its first sample; samples of one name must be written together.
type Writer struct {
	w    *bufio.Writer
	seen map[string]bool
	err  error
}

// NewWriter returns a Writer on w; call Flush at the end.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriter(w), seen: map[string]bool{}}
}

// Sample writes one sample. labels are name, value pairs.
func (m *Writer) Sample(name string, kind Kind, help string, value float64, labels ...string) {
	if m.err != nil {
		return
	}
	if !m.seen[name] {
		m.seen[name] = true
		fmt.Fprintf(m.w, "# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(help), name, kind)
	}
	m.w.WriteString(name)
	if len(labels) > 0 {
		m.w.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				m.w.WriteByte(',')
			}
			fmt.Fprintf(m.w, "%s=\"%s\"", labels[i], escapeLabel(labels[i+1]))
		}
		m.w.WriteByte('}')
	}
	m.w.WriteByte(' ')
	m.w.WriteString(formatValue(value))
	_, m.err = m.w.WriteString("\n")
}

// Flush writes what is buffered and returns the first error.
func (m *Writer) Flush() error {
	if m.err != nil {
		return m.err
	}
	return m.w.Flush()
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(s)
}

// Source is what a role exposes: its metrics, and a status value encoded as JSON.
type Source interface {
	WriteMetrics(w *Writer)
	StatusJSON() any
}

// Server serves a Source on a TCP address.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	once sync.Once
}

// Listen starts serving src on addr ("127.0.0.1:9473"); it returns once the socket listens.
// Besides /metrics and /status it serves the live status page at / (package page).
func Listen(addr string, src Source) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return Serve(ln, src), nil
}

// Serve serves src on ln, as Listen does on its socket (for a listener made elsewhere: in
// another network namespace, say); Close closes ln.
func Serve(ln net.Listener, src Source) *Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		mw := NewWriter(w)
		src.WriteMetrics(mw)
		mw.Flush()
	})
	status := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(src.StatusJSON())
	}
	mux.HandleFunc("GET /status", status)
	mux.HandleFunc("GET /status.json", status)
	page.Register(mux)
	s := &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go s.srv.Serve(ln)
	return s
}

// Addr returns the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// PageURL returns the address of the live status page, for the role's log.
func (s *Server) PageURL() string { return "http://" + s.Addr() + "/" }

// Close stops the server; idempotent.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err = s.srv.Shutdown(ctx)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
	})
	return err
}

// SortedKeys returns the keys of m in order, for stable output.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
