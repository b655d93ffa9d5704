package pmnl

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

// ErrNoMPTCP is returned when the kernel has no mptcp_pm family: a kernel built without MPTCP
// (or older than 5.7).
var ErrNoMPTCP = errors.New("pmnl: the kernel has no MPTCP path manager (generic netlink family mptcp_pm not found; kernel without CONFIG_MPTCP?)")

// ErrOverrun is returned by Stream.Next when the kernel dropped events because the socket's
// buffer was full; the caller resynchronises its state and goes on reading.
var ErrOverrun = errors.New("pmnl: events lost (receive buffer overrun)")

// Error is a command the kernel refused. Err is the errno (errors.Is(err, syscall.EPERM) works)
// and Message the kernel's extended-ack text, such as "invalid token" or "subflow not found".
type Error struct {
	Op      string
	Err     error
	Message string
}

func (e *Error) Error() string {
	s := "pmnl: " + e.Op + ": " + e.Err.Error()
	if e.Message != "" {
		s += ": kernel says " + fmt.Sprintf("%q", e.Message)
	}
	switch {
	case errors.Is(e.Err, syscall.EPERM):
		s += " (needs CAP_NET_ADMIN in the namespace)"
	case errors.Is(e.Err, syscall.ENOTCONN):
		s += " (the connection is not fully established yet)"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

func wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var oe *netlink.OpError
	if errors.As(err, &oe) {
		inner := oe.Err
		var se *os.SyscallError
		if errors.As(inner, &se) {
			inner = se.Err
		}
		return &Error{Op: op, Err: inner, Message: oe.Message}
	}
	return fmt.Errorf("pmnl: %s: %w", op, err)
}

// Options say where to open the netlink socket.
type Options struct {
	// NetNS is a file descriptor of the network namespace to talk to; 0 is the caller's.
	NetNS int
}

func dial(o Options) (*genetlink.Conn, genetlink.Family, error) {
	c, err := genetlink.Dial(&netlink.Config{NetNS: o.NetNS})
	if err != nil {
		return nil, genetlink.Family{}, fmt.Errorf("pmnl: open generic netlink socket: %w", err)
	}
	f, err := family(c)
	if err != nil {
		c.Close()
		return nil, genetlink.Family{}, err
	}
	// Best effort: older kernels lack extended acks and we still want the errno.
	_ = c.SetOption(netlink.ExtendedAcknowledge, true)
	return c, f, nil
}

func family(c *genetlink.Conn) (genetlink.Family, error) {
	f, err := c.GetFamily(FamilyName)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT) {
			return genetlink.Family{}, ErrNoMPTCP
		}
		return genetlink.Family{}, wrapErr("resolve family "+FamilyName, err)
	}
	return f, nil
}

// Client sends path-manager commands. It is safe for concurrent use; commands are serialised.
type Client struct {
	mu     sync.Mutex
	c      *genetlink.Conn
	family genetlink.Family
}

// Dial opens a client in the namespace o names.
func Dial(o Options) (*Client, error) {
	c, f, err := dial(o)
	if err != nil {
		return nil, err
	}
	return &Client{c: c, family: f}, nil
}

// NewClient wraps an open generic-netlink connection (a genltest fake in tests) and resolves
// the family on it.
func NewClient(c *genetlink.Conn) (*Client, error) {
	f, err := family(c)
	if err != nil {
		return nil, err
	}
	_ = c.SetOption(netlink.ExtendedAcknowledge, true)
	return &Client{c: c, family: f}, nil
}

// Close closes the socket.
func (c *Client) Close() error { return c.c.Close() }

// execute sends one command and returns the replies (none for an acknowledged write).
func (c *Client) execute(ctx context.Context, op string, cmd uint8, flags netlink.HeaderFlags, enc func(*netlink.AttributeEncoder)) ([]genetlink.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pmnl: %s: %w", op, err)
	}
	var data []byte
	if enc != nil {
		ae := netlink.NewAttributeEncoder()
		enc(ae)
		b, err := ae.Encode()
		if err != nil {
			return nil, fmt.Errorf("pmnl: %s: encode: %w", op, err)
		}
		data = b
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.c.SetDeadline(dl)
	}
	defer interruptOn(ctx, c.c.SetDeadline)()
	msgs, err := c.c.Execute(genetlink.Message{
		Header: genetlink.Header{Command: cmd, Version: c.family.Version},
		Data:   data,
	}, c.family.ID, netlink.Request|flags)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("pmnl: %s: %w", op, ctx.Err())
		}
		return nil, wrapErr(op, err)
	}
	return msgs, nil
}

// interruptOn makes a blocked socket call return when ctx ends, by moving the socket's deadline
// into the past. The returned function must be called once the call has returned: it waits
// for a concurrent interruption to finish and clears the deadline, so the next call starts
// clean.
func interruptOn(ctx context.Context, setDeadline func(time.Time) error) (done func()) {
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = setDeadline(time.Unix(1, 0))
	})
	return func() {
		if !stop() {
			<-fired
		}
		_ = setDeadline(time.Time{})
	}
}

func (c *Client) ack(ctx context.Context, op string, cmd uint8, enc func(*netlink.AttributeEncoder)) error {
	_, err := c.execute(ctx, op, cmd, netlink.Acknowledge, enc)
	return err
}

// AddEndpoint adds an in-kernel PM endpoint (ip mptcp endpoint add).
func (c *Client) AddEndpoint(ctx context.Context, a Addr) error {
	if !a.Addr.IsValid() {
		return errors.New("pmnl: add endpoint: an endpoint needs an address")
	}
	return c.ack(ctx, "add endpoint "+a.Addr.String(), cmdAddAddr, func(ae *netlink.AttributeEncoder) {
		encodeAddr(ae, attrAddr, a)
	})
}

// DelEndpoint removes the in-kernel PM endpoint with the given id. With id 0 the kernel does
// something else: it withdraws addr where it is a connection's initial address (address ID
// 0), sending REMOVE_ADDR; it does not look endpoints up by address (list them for that).
func (c *Client) DelEndpoint(ctx context.Context, id uint8, addr netip.Addr) error {
	if id == 0 && !addr.IsValid() {
		return errors.New("pmnl: delete endpoint: give an id or an address")
	}
	return c.ack(ctx, fmt.Sprintf("delete endpoint id %d", id), cmdDelAddr, func(ae *netlink.AttributeEncoder) {
		encodeAddr(ae, attrAddr, Addr{ID: id, Addr: addr})
	})
}

// Endpoint returns the in-kernel PM endpoint with the given id.
func (c *Client) Endpoint(ctx context.Context, id uint8) (Addr, error) {
	op := fmt.Sprintf("get endpoint id %d", id)
	msgs, err := c.execute(ctx, op, cmdGetAddr, 0, func(ae *netlink.AttributeEncoder) {
		encodeAddr(ae, attrAddr, Addr{ID: id})
	})
	if err != nil {
		return Addr{}, err
	}
	if len(msgs) != 1 {
		return Addr{}, fmt.Errorf("pmnl: %s: %d replies", op, len(msgs))
	}
	a, err := decodeAddrReply(msgs[0].Data)
	if err != nil {
		return Addr{}, fmt.Errorf("pmnl: %s: %w", op, err)
	}
	return a, nil
}

// Endpoints lists the in-kernel PM endpoints.
func (c *Client) Endpoints(ctx context.Context) ([]Addr, error) {
	return c.dumpAddrs(ctx, "list endpoints", nil)
}

// ConnAddrs lists the local addresses the userspace PM has registered for the connection
// with the given token.
func (c *Client) ConnAddrs(ctx context.Context, token uint32) ([]Addr, error) {
	return c.dumpAddrs(ctx, fmt.Sprintf("list addresses of token %08x", token), func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrToken, token)
	})
}

func (c *Client) dumpAddrs(ctx context.Context, op string, enc func(*netlink.AttributeEncoder)) ([]Addr, error) {
	msgs, err := c.execute(ctx, op, cmdGetAddr, netlink.Dump, enc)
	if err != nil {
		return nil, err
	}
	out := make([]Addr, 0, len(msgs))
	for _, m := range msgs {
		a, err := decodeAddrReply(m.Data)
		if err != nil {
			return nil, fmt.Errorf("pmnl: %s: %w", op, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// FlushEndpoints removes every in-kernel PM endpoint.
func (c *Client) FlushEndpoints(ctx context.Context) error {
	return c.ack(ctx, "flush endpoints", cmdFlushAddrs, nil)
}

// SetLimits sets the in-kernel PM's limits (each at most 8 on current kernels).
func (c *Client) SetLimits(ctx context.Context, l Limits) error {
	return c.ack(ctx, "set limits", cmdSetLimits, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrRcvAddAddrs, l.AddAddrAccepted)
		ae.Uint32(attrSubflows, l.Subflows)
	})
}

// Limits returns the in-kernel PM's limits.
func (c *Client) Limits(ctx context.Context) (Limits, error) {
	msgs, err := c.execute(ctx, "get limits", cmdGetLimits, 0, nil)
	if err != nil {
		return Limits{}, err
	}
	if len(msgs) != 1 {
		return Limits{}, fmt.Errorf("pmnl: get limits: %d replies", len(msgs))
	}
	l, err := decodeLimits(msgs[0].Data)
	if err != nil {
		return Limits{}, fmt.Errorf("pmnl: get limits: %w", err)
	}
	return l, nil
}

// SetEndpointFlags changes an in-kernel PM endpoint's flags (ip mptcp endpoint change): the
// endpoint is named by a.ID, or by a.Addr when the ID is 0. Changing backup sends MP_PRIO on
// the subflows from that endpoint.
func (c *Client) SetEndpointFlags(ctx context.Context, a Addr) error {
	return c.ack(ctx, fmt.Sprintf("set flags of endpoint id %d", a.ID), cmdSetFlags, func(ae *netlink.AttributeEncoder) {
		encodeAddr(ae, attrAddr, a)
	})
}

// Announce makes the userspace PM send ADD_ADDR for local on the connection token. local
// needs a non-zero ID; the signal flag is added.
func (c *Client) Announce(ctx context.Context, token uint32, local Addr) error {
	local.Flags |= FlagSignal
	return c.ack(ctx, fmt.Sprintf("announce %s on token %08x", local.Addr, token), cmdAnnounce, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrToken, token)
		encodeAddr(ae, attrAddr, local)
	})
}

// Remove makes the userspace PM send REMOVE_ADDR for the local address id on the connection.
func (c *Client) Remove(ctx context.Context, token uint32, id uint8) error {
	return c.ack(ctx, fmt.Sprintf("remove id %d on token %08x", id, token), cmdRemove, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrToken, token)
		ae.Uint8(attrLocID, id)
	})
}

// Subflow names one subflow of a connection for the userspace PM.
type Subflow struct {
	Token  uint32
	Local  Addr // address, ID, port (0: any), flags (backup), interface
	Remote netip.AddrPort
}

func (s Subflow) String() string {
	return fmt.Sprintf("token %08x %s -> %s", s.Token, netip.AddrPortFrom(s.Local.Addr, s.Local.Port), s.Remote)
}

func (s Subflow) encode(ae *netlink.AttributeEncoder) {
	ae.Uint32(attrToken, s.Token)
	encodeAddr(ae, attrAddr, s.Local)
	encodeAddr(ae, attrAddrRemote, Addr{Addr: s.Remote.Addr(), Port: s.Remote.Port()})
}

// CreateSubflow makes the userspace PM open a subflow (MP_JOIN) from s.Local to s.Remote.
// A non-zero local port is bound exactly; FlagBackup sets the join's backup bit. Give each
// distinct local (address, port) its own non-zero ID.
func (c *Client) CreateSubflow(ctx context.Context, s Subflow) error {
	return c.ack(ctx, "create subflow "+s.String(), cmdSubflowCreate, s.encode)
}

// DestroySubflow makes the userspace PM close a subflow. Both ports are required.
func (c *Client) DestroySubflow(ctx context.Context, s Subflow) error {
	if s.Local.Port == 0 || s.Remote.Port() == 0 {
		return errors.New("pmnl: destroy subflow: the local and the remote port are both required")
	}
	return c.ack(ctx, "destroy subflow "+s.String(), cmdSubflowDestroy, s.encode)
}

// SetSubflowFlags sets the backup flag of a subflow of a userspace-PM connection (the kernel
// sends MP_PRIO on that subflow). s.Local.Port 0 matches any local port; s.Local.Flags carries
// the wanted flags (FlagBackup or none).
func (c *Client) SetSubflowFlags(ctx context.Context, s Subflow) error {
	return c.ack(ctx, fmt.Sprintf("set flags %q of subflow %s", s.Local.Flags, s), cmdSetFlags, s.encode)
}

// Stream receives path-manager events. Next is meant for one reader goroutine.
type Stream struct {
	c       *genetlink.Conn
	pending []genetlink.Message
	once    sync.Once
}

// Subscribe opens an event stream in the namespace o names. Subscribe before opening the
// connections whose CREATED events matter.
func Subscribe(o Options) (*Stream, error) {
	c, f, err := dial(o)
	if err != nil {
		return nil, err
	}
	s, err := subscribe(c, f)
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetReadBuffer(4 << 20) // bursts of subflow events must not overrun it
	return s, nil
}

// NewStream reads events from a connection that already receives the events group (a
// genltest fake in tests).
func NewStream(c *genetlink.Conn) *Stream { return &Stream{c: c} }

func subscribe(c *genetlink.Conn, f genetlink.Family) (*Stream, error) {
	for _, g := range f.Groups {
		if g.Name == EventsGroup {
			if err := c.JoinGroup(g.ID); err != nil {
				return nil, wrapErr("join group "+EventsGroup, err)
			}
			return NewStream(c), nil
		}
	}
	return nil, fmt.Errorf("pmnl: family %s has no group %s (kernel too old for PM events)", FamilyName, EventsGroup)
}

// Next returns the next event. It returns ctx's error when ctx ends, ErrOverrun (the stream
// goes on) when events were lost, and an error wrapping ErrMalformed (the stream goes on) for
// an event it cannot decode.
func (s *Stream) Next(ctx context.Context) (Event, error) {
	for len(s.pending) == 0 {
		if err := ctx.Err(); err != nil {
			return Event{}, err
		}
		done := interruptOn(ctx, s.c.SetReadDeadline)
		msgs, _, err := s.c.Receive()
		done()
		if err != nil {
			if ctx.Err() != nil {
				return Event{}, ctx.Err()
			}
			if errors.Is(err, syscall.ENOBUFS) {
				return Event{}, ErrOverrun
			}
			return Event{}, wrapErr("receive events", err)
		}
		s.pending = msgs
	}
	m := s.pending[0]
	s.pending = s.pending[1:]
	var e Event
	if err := e.Decode(m.Header.Command, m.Data); err != nil {
		return Event{}, fmt.Errorf("pmnl: event %s: %w", EventType(m.Header.Command), err)
	}
	return e, nil
}

// Close closes the stream; a Next in progress returns.
func (s *Stream) Close() error {
	var err error
	s.once.Do(func() { err = s.c.Close() })
	return err
}
