package metrics

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestWriterFormat(t *testing.T) {
	var b strings.Builder
	w := NewWriter(&b)
	w.Sample("braid_rx_bytes_total", Counter, "Bytes received.", 12, "path", "fibre")
	w.Sample("braid_rx_bytes_total", Counter, "Bytes received.", 3, "path", `lte"2`)
	w.Sample("braid_up", Gauge, "Whether up.\nSecond line", 1)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := `# HELP braid_rx_bytes_total Bytes received.
# TYPE braid_rx_bytes_total counter
braid_rx_bytes_total{path="fibre"} 12
braid_rx_bytes_total{path="lte\"2"} 3
# HELP braid_up Whether up.\nSecond line
# TYPE braid_up gauge
braid_up 1
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

type fake struct{}

func (fake) WriteMetrics(w *Writer) { w.Sample("x_total", Counter, "x", 1) }
func (fake) StatusJSON() any        { return map[string]int{"x": 1} }

func TestServer(t *testing.T) {
	s, err := Listen("127.0.0.1:0", fake{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for path, want := range map[string]string{"/metrics": "x_total 1", "/status": `"x": 1`, "/status.json": `"x": 1`, "/": "ui/app.js"} {
		resp, err := http.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), want) {
			t.Errorf("%s: %q lacks %q", path, body, want)
		}
	}
	s.Close()
	s.Close()
}
