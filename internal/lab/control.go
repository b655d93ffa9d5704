package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"braid/internal/lab/emu"
	"braid/internal/lab/topo"
	"braid/internal/sock"
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
	// IfDown takes both ends' interfaces down, as a cable pulled out (Lab.SetLinkUp); IfUp
	// brings them up with their addresses and routes. Unlike Down, the hosts see it.
	IfDown bool `json:",omitempty"`
	IfUp   bool `json:",omitempty"`
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
	// IfDown: an interface of the link is down (Host.SetInterfaceUp, Lab.SetLinkUp).
	IfDown bool `json:",omitempty"`
	Stats  emu.Stats
}

// controlRequest is one request on the control socket: a link request, its fields at the top
// level as clients before the NAT events sent them, or an interface or a NAT request.
type controlRequest struct {
	LinkRequest
	Iface *IfaceRequest `json:",omitempty"`
	NAT   *NATRequest   `json:",omitempty"`
}

type controlReply struct {
	Error string       `json:",omitempty"`
	Links []LinkStatus `json:",omitempty"`
	Iface *IfaceStatus `json:",omitempty"`
	NATs  []NATStatus  `json:",omitempty"`
}

// ChangeLinks applies a request to the lab and returns the status of the links it names.
func (l *Lab) ChangeLinks(r LinkRequest) ([]LinkStatus, error) {
	if err := r.Set.Validate(); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	if r.Down && r.Up {
		return nil, errors.New("lab: --down and --up together")
	}
	if r.IfDown && r.IfUp {
		return nil, errors.New("lab: --if-down and --if-up together")
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
		if r.IfDown || r.IfUp {
			if err := l.SetLinkUp(t.lk.Spec.Name, r.IfUp); err != nil {
				return nil, err
			}
		}
		out = append(out, t.lk.Status()...)
	}
	return out, nil
}

// Status returns the state of both directions.
func (lk *Link) Status() []LinkStatus {
	ends := [2]string{lk.Spec.A.Host, lk.Spec.B.Host}
	ifDown := false
	for i, ep := range []topo.Endpoint{lk.Spec.A, lk.Spec.B} {
		if h := lk.hosts[i]; h != nil {
			if up, err := h.InterfaceUp(ep.Ifname); err == nil && !up {
				ifDown = true
			}
		}
	}
	out := make([]LinkStatus, 2)
	for d := range 2 {
		out[d] = LinkStatus{Link: lk.Spec.Name, From: ends[d], To: ends[1-d], Shape: lk.Shape(d), Cut: lk.IsCut(), IfDown: ifDown, Stats: lk.Stats(d)}
	}
	return out
}

// ServeControl answers link requests on a unix socket at path until ctx ends. It returns once
// the socket is listening; the returned function stops it and waits.
func (l *Lab) ServeControl(ctx context.Context, path string) (stop func(), err error) {
	// Private from the moment it exists (mode 0600, made in a 0700 directory and renamed into
	// place), and only root or the lab's user is served.
	ln, err := sock.ListenPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("lab: control socket: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				if err := sock.PeerAllowed(c); err != nil {
					c.Close()
					return
				}
				l.serveControlConn(c)
			})
		}
	})
	ctx, cancel := context.WithCancel(ctx)
	wg.Go(func() { <-ctx.Done(); ln.Close() })
	return func() { cancel(); wg.Wait(); os.Remove(path) }, nil
}

func (l *Lab) serveControlConn(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var req controlRequest
	var rep controlReply
	var err error
	if err = json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
		err = fmt.Errorf("lab: bad control request: %w", err)
	} else if req.Iface != nil {
		var st IfaceStatus
		if st, err = l.ChangeIface(*req.Iface); err == nil {
			rep.Iface = &st
		}
	} else if req.NAT != nil {
		rep.NATs, err = l.ChangeNAT(*req.NAT)
	} else {
		rep.Links, err = l.ChangeLinks(req.LinkRequest)
	}
	if err != nil {
		rep.Error = err.Error()
	}
	json.NewEncoder(c).Encode(rep)
}

// RequestLinks sends a link request to the running lab st.
func RequestLinks(st State, r LinkRequest) ([]LinkStatus, error) {
	rep, err := request(st, controlRequest{LinkRequest: r})
	return rep.Links, err
}

// RequestIface sends an interface request to the running lab st.
func RequestIface(st State, r IfaceRequest) (IfaceStatus, error) {
	rep, err := request(st, controlRequest{Iface: &r})
	if err != nil {
		return IfaceStatus{}, err
	}
	if rep.Iface == nil {
		return IfaceStatus{}, fmt.Errorf("lab: lab %s does not know interface requests (an older braid?)", st.ID)
	}
	return *rep.Iface, nil
}

// RequestNAT sends a NAT request to the running lab st.
func RequestNAT(st State, r NATRequest) ([]NATStatus, error) {
	rep, err := request(st, controlRequest{NAT: &r})
	return rep.NATs, err
}

func request(st State, r controlRequest) (controlReply, error) {
	var rep controlReply
	if st.Control == "" {
		return rep, fmt.Errorf("lab: lab %s (pid %d) has no control socket: it was not started by 'braid lab up'", st.ID, st.PID)
	}
	c, err := net.DialTimeout("unix", st.Control, 5*time.Second)
	if err != nil {
		return rep, fmt.Errorf("lab: lab %s: %w", st.ID, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := json.NewEncoder(c).Encode(r); err != nil {
		return rep, fmt.Errorf("lab: lab %s: %w", st.ID, err)
	}
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		return rep, fmt.Errorf("lab: lab %s: %w", st.ID, err)
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

// IfaceRequest changes an interface of a host of the running lab, in this order: Down, the
// address change (Host.ReplaceAddr(Ifname, Del, Add)), Up. With nothing set it only reports.
type IfaceRequest struct {
	Host, Ifname string
	Down, Up     bool
	Del, Add     netip.Prefix // zero: none
}

// IfaceStatus describes an interface of a running lab.
type IfaceStatus struct {
	Host, Ifname string
	Up           bool
	Addrs        []netip.Prefix // as the kernel has them, without IPv6 link-local ones
}

// ChangeIface applies an interface request and returns the interface's state.
func (l *Lab) ChangeIface(r IfaceRequest) (IfaceStatus, error) {
	st := IfaceStatus{Host: r.Host, Ifname: r.Ifname}
	h := l.hosts[r.Host]
	switch {
	case h == nil:
		return st, fmt.Errorf("lab: no host %q", r.Host)
	case r.Down && r.Up:
		return st, errors.New("lab: --down and --up together")
	}
	if _, err := h.iface(r.Ifname); err != nil {
		return st, err
	}
	if r.Down {
		if err := h.SetInterfaceUp(r.Ifname, false); err != nil {
			return st, err
		}
	}
	if r.Del.IsValid() || r.Add.IsValid() {
		if err := h.ReplaceAddr(r.Ifname, r.Del, r.Add); err != nil {
			return st, err
		}
	}
	if r.Up {
		if err := h.SetInterfaceUp(r.Ifname, true); err != nil {
			return st, err
		}
	}
	var err error
	if st.Up, err = h.InterfaceUp(r.Ifname); err != nil {
		return st, err
	}
	st.Addrs, err = h.Addrs(r.Ifname)
	return st, err
}

// NATRequest flushes the mappings of a NAT host (every NAT host when Host is empty), or with
// Flush false only reports them.
type NATRequest struct {
	Host  string
	Flush bool
}

// NATStatus describes a NAT host: its configuration, how many entries a flush removed, and
// the mappings it has now.
type NATStatus struct {
	Host     string
	NAT      topo.NAT
	Flushed  int
	Mappings []Mapping
}

// ChangeNAT applies a NAT request and returns the state of the NATs it names.
func (l *Lab) ChangeNAT(r NATRequest) ([]NATStatus, error) {
	var hosts []*Host
	for _, h := range l.order {
		if h.nat != nil && (r.Host == "" || h.Name == r.Host) {
			hosts = append(hosts, h)
		}
	}
	if len(hosts) == 0 {
		switch {
		case r.Host == "":
			return nil, errors.New("lab: the lab has no NAT")
		case l.hosts[r.Host] == nil:
			return nil, fmt.Errorf("lab: no host %q", r.Host)
		}
		return nil, fmt.Errorf("%w: host %s", ErrNoNAT, r.Host)
	}
	var out []NATStatus
	for _, h := range hosts {
		st := NATStatus{Host: h.Name, NAT: *h.nat}
		var err error
		if r.Flush {
			if st.Flushed, err = h.FlushNAT(); err != nil {
				return out, err
			}
		}
		if st.Mappings, err = h.NATMappings(); err != nil {
			return out, err
		}
		out = append(out, st)
	}
	return out, nil
}
