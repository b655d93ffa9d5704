package roles

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"braid/internal/lab"
	"braid/internal/proxy"
	"braid/internal/proxy/ident"
)

// ProxyProc is a braid proxy process running in a lab host.
type ProxyProc struct {
	Host *lab.Host
	File string
	Cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// StartProxy writes site to dir and runs 'bin proxy --config' in h; env is added to the
// process's environment (BRAID_TEST_MAIN=1 when bin is a test binary).
func StartProxy(h *lab.Host, bin, dir string, site []byte, env ...string) (*ProxyProc, error) {
	file := filepath.Join(dir, h.Name+".toml")
	if err := os.WriteFile(file, site, 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "proxy", "--config", file)
	cmd.Env = append(os.Environ(), env...)
	pp := &ProxyProc{Host: h, File: file, Cmd: cmd, out: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = pp.out, pp.out
	if err := h.Start(cmd); err != nil {
		return nil, err
	}
	go func() { pp.err = cmd.Wait(); close(pp.done) }()
	return pp, nil
}

// Log returns what the process wrote.
func (pp *ProxyProc) Log() string { return pp.out.String() }

// Done is closed when the process has exited.
func (pp *ProxyProc) Done() <-chan struct{} { return pp.done }

// Err is the process's exit status, once Done.
func (pp *ProxyProc) Err() error { return pp.err }

// Signal sends sig to the process.
func (pp *ProxyProc) Signal(sig syscall.Signal) error { return pp.Cmd.Process.Signal(sig) }

// Stop ends the process with SIGTERM and waits up to 10 s (then kills it).
func (pp *ProxyProc) Stop() error {
	pp.Signal(syscall.SIGTERM)
	select {
	case <-pp.done:
	case <-time.After(10 * time.Second):
		pp.Cmd.Process.Kill()
		<-pp.done
	}
	return pp.err
}

// ProxyStatusDoc is the proxy's /status document.
type ProxyStatusDoc struct {
	Role        string        `json:"role"`
	Proxy       *proxy.Status `json:"proxy"`
	PathManager string        `json:"path_manager"`
	Announced   uint64        `json:"announced"`
}

// ProxyStatus reads the /status of the proxy running in h.
func ProxyStatus(ctx context.Context, h *lab.Host) (*ProxyStatusDoc, error) {
	c := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return h.Dial(ctx, network, addr) }}}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+ProxyMetrics+"/status", nil)
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc ProxyStatusDoc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, err
	}
	if doc.Proxy == nil {
		return nil, fmt.Errorf("scenario: %s: status of role %q, not a proxy", h.Name, doc.Role)
	}
	return &doc, nil
}

// WaitProxyPair waits until both proxies answer and each has a pooled connection to the other
// for tenant blue (with pool 0: until both answer).
func WaitProxyPair(ctx context.Context, a, b *ProxyProc, pooled bool, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		ok := true
		for _, pp := range []*ProxyProc{a, b} {
			select {
			case <-pp.done:
				return fmt.Errorf("scenario: proxy in %s exited: %v\n%s", pp.Host.Name, pp.err, pp.Log())
			default:
			}
			st, err := ProxyStatus(ctx, pp.Host)
			if err != nil {
				last, ok = err, false
				break
			}
			if pooled {
				for _, t := range st.Proxy.Tenants {
					if t.Name == "blue" {
						for _, n := range t.PoolReady {
							if n == 0 {
								ok, last = false, fmt.Errorf("%s: no pooled connection yet", pp.Host.Name)
							}
						}
					}
				}
			}
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("scenario: proxies not ready within %v: %v", within, last)
}

// ProxyKeys returns a fresh key pair for each proxy.
func ProxyKeys() (k1, k2 ident.PrivateKey, err error) {
	if k1, err = ident.Generate(); err != nil {
		return
	}
	k2, err = ident.Generate()
	return
}

// ProxyMetrics is the metrics address of a proxy started with its defaults (the role's default).
const ProxyMetrics = "127.0.0.1:9478"
