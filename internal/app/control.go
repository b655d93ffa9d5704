package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"braid/internal/config"
	"braid/internal/sock"
)

// controlReply answers one request on a role's control socket.
type controlReply struct {
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"` // what a request that succeeded did, when it says

	Status json.RawMessage `json:"status,omitempty"` // the role's /status document, for a status request
}

// controlAction is the part of every control request that names it; {"action": "status"}
// asks for the role's status document, which every role's control socket serves.
type controlAction struct {
	Action string `json:"action"`
}

// serveControl listens on the unix socket sockPath and applies each request, one JSON object
// per connection, answering with a controlReply; a status request is answered with status()
// (when status is not nil). A sockPath that starts with "@" is an abstract socket, which
// belongs to the network namespace: each namespace has its own, and it vanishes with the
// process. Otherwise it is a file, mode 0600 from the moment it exists (sock.ListenPrivate: made
// in a 0700 directory, then renamed into place), in a directory made 0700 when it does not
// exist; a stale one is replaced, but one that a running role still answers on is not taken
// over. Either way only root and this process's user may use the socket (the peer's
// credentials are checked, sock.PeerAllowed). stop closes the socket, waits for the
// requests in progress and removes the socket file.
func serveControl[Req any](ctx context.Context, sockPath string, apply func(Req) error, status func() any) (stop func(), err error) {
	abstract := strings.HasPrefix(sockPath, "@")
	if !abstract {
		if err := os.MkdirAll(filepath.Dir(sockPath), 0o700); err != nil {
			return nil, fmt.Errorf("control socket: %w", err)
		}
		if c, err := net.DialTimeout("unix", sockPath, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s: another running role serves it; set 'control' to another path", sockPath)
		}
	}
	var ln net.Listener
	if abstract {
		ln, err = net.Listen("unix", sockPath)
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("control socket %s: another role in this network namespace serves it; set 'control' to another name", sockPath)
		}
	} else {
		ln, err = sock.ListenPrivate(sockPath)
	}
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				json.NewEncoder(c).Encode(handleControl(c, apply, status))
			})
		}
	})
	ctx, cancel := context.WithCancel(ctx)
	wg.Go(func() { <-ctx.Done(); ln.Close() })
	return func() {
		cancel()
		wg.Wait()
		if !abstract {
			os.Remove(sockPath)
		}
	}, nil
}

// maxControlRequest bounds what a control request may be.
const maxControlRequest = 1 << 20

// handleControl reads and applies the request on c.
func handleControl[Req any](c net.Conn, apply func(Req) error, status func() any) controlReply {
	// The request is read before the peer is judged, so that a refused client, which writes
	// its request first, reads the refusal rather than a broken pipe; requests are small.
	var raw json.RawMessage
	derr := json.NewDecoder(bufio.NewReader(io.LimitReader(c, maxControlRequest))).Decode(&raw)
	if err := sock.PeerAllowed(c); err != nil {
		return controlReply{Error: err.Error()}
	}
	if derr != nil {
		return controlReply{Error: "bad request: " + derr.Error()}
	}
	var a controlAction
	if json.Unmarshal(raw, &a) == nil && a.Action == "status" && status != nil {
		b, err := json.Marshal(status())
		if err != nil {
			return controlReply{Error: "status: " + err.Error()}
		}
		return controlReply{Status: b}
	}
	var req Req
	if err := json.Unmarshal(raw, &req); err != nil {
		return controlReply{Error: "bad request: " + err.Error()}
	}
	if err := apply(req); err != nil {
		var done controlDone
		if errors.As(err, &done) {
			return controlReply{Message: string(done)}
		}
		return controlReply{Error: err.Error()}
	}
	return controlReply{}
}

// controlDone is what an apply returns for a request that succeeded with something to say
// (the reply's Message), not an error.
type controlDone string

func (d controlDone) Error() string { return string(d) }

// errNotRunning wraps a failure to reach a role's control socket.
var errNotRunning = errors.New("not running")

// callControl sends req to the control socket sockPath and returns the role's reply, or its
// error. A socket that cannot be reached gives an error wrapping errNotRunning.
func callControl(sockPath string, req any) (controlReply, error) {
	c, err := net.DialTimeout("unix", sockPath, 3*time.Second)
	if err != nil {
		return controlReply{}, fmt.Errorf("%w (control socket %s): %v", errNotRunning, sockPath, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return controlReply{}, err
	}
	var rep controlReply
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		return controlReply{}, err
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

// controlStatus asks the role on the control socket sockPath for its status document.
func controlStatus(sockPath string) ([]byte, error) {
	rep, err := callControl(sockPath, controlAction{Action: "status"})
	if err != nil {
		return nil, err
	}
	if len(rep.Status) == 0 {
		return nil, fmt.Errorf("control socket %s serves no status", sockPath)
	}
	return rep.Status, nil
}

// warnExposure logs at start what the configuration exposes beyond its owner: a metrics
// address that is not loopback, and key files that others than their owner may read.
func warnExposure(log *slog.Logger, metricsAddr string, keyFiles ...string) {
	if w := config.MetricsWarning(metricsAddr); w != "" {
		log.Warn(w)
	}
	for _, w := range config.KeyFileWarnings(keyFiles...) {
		log.Warn(w)
	}
}

// tunnelStartWarnings logs what a tunnel's configuration exposes: warnExposure's, and that
// mode mpt has no authentication.
func tunnelStartWarnings(log *slog.Logger, cfg *config.Tunnel) {
	metricsAddr, keyFile := "", ""
	if cfg.Metrics.IsValid() {
		metricsAddr = cfg.Metrics.String()
	}
	if cfg.Braid != nil {
		keyFile = cfg.Braid.PrivateKeyFile
	}
	warnExposure(log, metricsAddr, keyFile)
	if cfg.Mode == config.ModeMPT {
		log.Warn(mptUnauthenticated)
	}
}

// mptUnauthenticated is the warning a tunnel in mode "mpt" logs at start.
const mptUnauthenticated = `mode "mpt" has NO AUTHENTICATION AND NO ENCRYPTION (MPT's protocol has none): anyone who can send to this site's uplinks can inject packets into its networks as any address inside the peer's routes, and read what crosses; inner sources outside the peer's routes are dropped (drop_spoofed). Use it only where the paths are trusted, or inside IPsec, or use mode "braid"`
