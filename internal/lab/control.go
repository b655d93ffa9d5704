package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"braid/internal/lab/emu"
	"braid/internal/lab/topo"
)

// The control channel of a running `braid lab up`: a unix socket, one JSON request and one JSON
// reply per connection.

// LinkRequest changes (or, with nothing set, only reports) the links between two hosts.
type LinkRequest struct {
	A, B string // hosts; with Name empty, every link between them
	Name string // one link by name; "*" for every link
	// Dir is "both" (default), "ab" (A to B, as named in the request) or "ba".
	Dir  string
	Set  ShapeChange
	Down bool // cut
	Up   bool // restore
}

// ShapeChange holds the fields to change; nil fields keep their value.
type ShapeChange struct {
	Rate         *uint64
	Delay        *time.Duration
	Jitter       *time.Duration
	Loss         *float64
	QueuePackets *int
	QueueBytes   *int
}

func (c ShapeChange) apply(s topo.Shape) topo.Shape {
	if c.Rate != nil {
		s.Rate, s.Trace = *c.Rate, nil // a rate set by hand replaces a trace
	}
	if c.Delay != nil {
		s.Delay = *c.Delay
	}
	if c.Jitter != nil {
		s.Jitter = *c.Jitter
	}
	if c.Loss != nil {
		s.Loss = *c.Loss
	}
	if c.QueuePackets != nil {
		s.QueuePackets = *c.QueuePackets
	}
	if c.QueueBytes != nil {
		s.QueueBytes = *c.QueueBytes
	}
	return s
}

// Validate checks a change before anything is applied.
func (c ShapeChange) Validate() error {
	switch {
	case c.Delay != nil && *c.Delay < 0:
		return errors.New("negative delay")
	case c.Jitter != nil && *c.Jitter < 0:
		return errors.New("negative jitter")
	case c.Loss != nil && (*c.Loss < 0 || *c.Loss > 100):
		return fmt.Errorf("loss %g %% is outside 0 to 100 %%", *c.Loss)
	case c.QueuePackets != nil && *c.QueuePackets < 0:
		return errors.New("negative queue")
	case c.QueueBytes != nil && *c.QueueBytes < 0:
		return errors.New("negative queue")
	}
	return nil
}

// LinkStatus describes one link direction.
type LinkStatus struct {
	Link  string
	From  string
	To    string
	Shape topo.Shape
	Cut   bool
	Stats emu.Stats
}

type controlReply struct {
	Error string       `json:",omitempty"`
	Links []LinkStatus `json:",omitempty"`
}

// ChangeLinks applies a request to the lab and returns the status of the links it names.
func (l *Lab) ChangeLinks(r LinkRequest) ([]LinkStatus, error) {
	if err := r.Set.Validate(); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	if r.Down && r.Up {
		return nil, errors.New("lab: --down and --up together")
	}
	type target struct {
		lk  *Link
		fwd int // direction index of A→B as named in the request
	}
	var targets []target
	for _, lk := range l.links {
		switch {
		case r.Name == "*":
			targets = append(targets, target{lk, 0})
		case r.Name != "":
			if lk.Spec.Name == r.Name {
				fwd := 0
				if r.A != "" && r.A == lk.Spec.B.Host {
					fwd = 1
				}
				targets = append(targets, target{lk, fwd})
			}
		case lk.Spec.A.Host == r.A && lk.Spec.B.Host == r.B:
			targets = append(targets, target{lk, 0})
		case lk.Spec.A.Host == r.B && lk.Spec.B.Host == r.A:
			targets = append(targets, target{lk, 1})
		}
	}
	if len(targets) == 0 {
		if r.Name != "" {
			return nil, fmt.Errorf("lab: no link named %q", r.Name)
		}
		return nil, fmt.Errorf("lab: no link between %q and %q", r.A, r.B)
	}
	var dirs []int
	switch r.Dir {
	case "", "both":
		dirs = []int{0, 1}
	case "ab":
		dirs = []int{0}
	case "ba":
		dirs = []int{1}
	default:
		return nil, fmt.Errorf("lab: direction %q is not both, ab or ba", r.Dir)
	}
	if r.Set.Delay != nil || r.Set.Jitter != nil || r.Set.Loss != nil || r.Set.QueuePackets != nil || r.Set.QueueBytes != nil {
		for _, t := range targets {
			if t.lk.kernel != nil {
				return nil, fmt.Errorf("lab: link %s is a kernel link: only its rate can change", t.lk.Spec.Name)
			}
		}
	}
	var out []LinkStatus
	for _, t := range targets {
		for _, d := range dirs {
			idx := d ^ t.fwd
			t.lk.SetShape(idx, r.Set.apply(t.lk.Shape(idx)))
		}
		if r.Down {
			t.lk.Cut()
		}
		if r.Up {
			t.lk.Restore()
		}
		out = append(out, t.lk.Status()...)
	}
	return out, nil
}

// Status returns the state of both directions.
func (lk *Link) Status() []LinkStatus {
	ends := [2]string{lk.Spec.A.Host, lk.Spec.B.Host}
	out := make([]LinkStatus, 2)
	for d := range 2 {
		out[d] = LinkStatus{Link: lk.Spec.Name, From: ends[d], To: ends[1-d], Shape: lk.Shape(d), Cut: lk.IsCut(), Stats: lk.Stats(d)}
	}
	return out
}

// ServeControl answers link requests on a unix socket at path until ctx ends. It returns once
// the socket is listening; the returned function stops it and waits.
func (l *Lab) ServeControl(ctx context.Context, path string) (stop func(), err error) {
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("lab: control socket: %w", err)
	}
	os.Chmod(path, 0o600)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { l.serveControlConn(c) })
		}
	})
	ctx, cancel := context.WithCancel(ctx)
	wg.Go(func() { <-ctx.Done(); ln.Close() })
	return func() { cancel(); wg.Wait(); os.Remove(path) }, nil
}

func (l *Lab) serveControlConn(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var req LinkRequest
	var rep controlReply
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
		rep.Error = "lab: bad control request: " + err.Error()
	} else if links, err := l.ChangeLinks(req); err != nil {
		rep.Error = err.Error()
	} else {
		rep.Links = links
	}
	json.NewEncoder(c).Encode(rep)
}

// RequestLinks sends a link request to the running lab st.
func RequestLinks(st State, r LinkRequest) ([]LinkStatus, error) {
	if st.Control == "" {
		return nil, fmt.Errorf("lab: lab %s (pid %d) has no control socket: it was not started by 'braid lab up'", st.ID, st.PID)
	}
	c, err := net.DialTimeout("unix", st.Control, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("lab: lab %s: %w", st.ID, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := json.NewEncoder(c).Encode(r); err != nil {
		return nil, fmt.Errorf("lab: lab %s: %w", st.ID, err)
	}
	var rep controlReply
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		return nil, fmt.Errorf("lab: lab %s: %w", st.ID, err)
	}
	if rep.Error != "" {
		return nil, errors.New(rep.Error)
	}
	return rep.Links, nil
}
