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
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
// process. Otherwise it is a file (mode 0600); a stale one is replaced, but one that a running
// role still answers on is not taken over. Either way only root and this process's user may
// use the socket (the peer's credentials are checked). stop closes the socket, waits for the
// requests in progress and removes the socket file.
func serveControl[Req any](ctx context.Context, sockPath string, apply func(Req) error, status func() any) (stop func(), err error) {
	abstract := strings.HasPrefix(sockPath, "@")
	if !abstract {
		if err := os.MkdirAll(filepath.Dir(sockPath), 0o755); err != nil {
			return nil, fmt.Errorf("control socket: %w", err)
		}
		if c, err := net.DialTimeout("unix", sockPath, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s: another running role serves it; set 'control' to another path", sockPath)
		}
		os.Remove(sockPath)
	}
	ln, err := net.Listen("unix", sockPath)
	if err != nil {
		if abstract && errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("control socket %s: another role in this network namespace serves it; set 'control' to another name", sockPath)
		}
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if !abstract {
		os.Chmod(sockPath, 0o600)
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

// handleControl reads and applies the request on c.
func handleControl[Req any](c net.Conn, apply func(Req) error, status func() any) controlReply {
	if err := peerAllowed(c); err != nil {
		return controlReply{Error: err.Error()}
	}
	var raw json.RawMessage
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&raw); err != nil {
		return controlReply{Error: "bad request: " + err.Error()}
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

// peerAllowed lets root and this process's own user use a control socket: an abstract socket
// has no file mode to keep others out.
func peerAllowed(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", cerr)
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("permission denied: uid %d is neither root nor the role's user", cred.Uid)
	}
	return nil
}

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
