package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// controlReply answers one request on a role's control socket.
type controlReply struct {
	Error string `json:"error,omitempty"`
}

// serveControl listens on the unix socket sockPath (mode 0600, replacing a stale one) and
// applies each request, one JSON object per connection, answering with a controlReply. stop
// closes the socket, waits for the requests in progress and removes the socket file.
func serveControl[Req any](ctx context.Context, sockPath string, apply func(Req) error) (stop func(), err error) {
	if err := os.MkdirAll(filepath.Dir(sockPath), 0o755); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	os.Remove(sockPath)
	ln, err := net.Listen("unix", sockPath)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	os.Chmod(sockPath, 0o600)
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
				var req Req
				var rep controlReply
				if err := json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
					rep.Error = "bad request: " + err.Error()
				} else if err := apply(req); err != nil {
					rep.Error = err.Error()
				}
				json.NewEncoder(c).Encode(rep)
			})
		}
	})
	ctx, cancel := context.WithCancel(ctx)
	wg.Go(func() { <-ctx.Done(); ln.Close() })
	return func() { cancel(); wg.Wait(); os.Remove(sockPath) }, nil
}

// errNotRunning wraps a failure to reach a role's control socket.
var errNotRunning = errors.New("not running")

// callControl sends req to the control socket sockPath and returns the role's error, if any.
// A socket that cannot be reached gives an error wrapping errNotRunning.
func callControl(sockPath string, req any) error {
	c, err := net.DialTimeout("unix", sockPath, 3*time.Second)
	if err != nil {
		return fmt.Errorf("%w (control socket %s): %v", errNotRunning, sockPath, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return err
	}
	var rep controlReply
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		return err
	}
	if rep.Error != "" {
		return errors.New(rep.Error)
	}
	return nil
}
