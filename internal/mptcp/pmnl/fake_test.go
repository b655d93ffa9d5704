package pmnl

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"
)

// fakeKernel answers mptcp_pm requests the way the kernel does, with extended acks, and
// multicasts the events pushed to it. It records every request's bytes.
type fakeKernel struct {
	mu        sync.Mutex
	familyID  uint16
	noFamily  bool // a kernel without MPTCP
	deny      bool // the caller lacks CAP_NET_ADMIN
	userspace bool // net.mptcp.pm_type = 1
	endpoints []Addr
	limits    Limits
	conns     map[uint32][]Subflow
	requests  [][]byte // genetlink header + attributes of every mptcp_pm request
	flags     []netlink.HeaderFlags
	events    chan Event
	overrun   bool // the next multicast read fails with ENOBUFS
}

const fakeEventsGroup = 7

func newFakeKernel() *fakeKernel {
	return &fakeKernel{familyID: 0x1c, limits: Limits{Subflows: 2}, conns: map[uint32][]Subflow{}, events: make(chan Event, 16), userspace: true}
}

func (k *fakeKernel) conn() *genetlink.Conn {
	return genetlink.NewConn(nltest.Dial(k.serve))
}

// kernelError is a refusal with the kernel's message.
type kernelError struct {
	errno syscall.Errno
	msg   string
}

func (e kernelError) Error() string { return e.msg }

func (k *fakeKernel) serve(reqs []netlink.Message) ([]netlink.Message, error) {
	if len(reqs) == 0 {
		k.mu.Lock()
		overrun := k.overrun
		k.overrun = false
		k.mu.Unlock()
		if overrun {
			return nil, syscall.ENOBUFS
		}
		select {
		case e := <-k.events:
			b, err := e.Encode()
			if err != nil {
				return nil, err
			}
			gb, _ := genetlink.Message{Header: genetlink.Header{Command: uint8(e.Type), Version: 1}, Data: b}.MarshalBinary()
			return []netlink.Message{{Header: netlink.Header{Type: netlink.HeaderType(k.familyID)}, Data: gb}}, nil
		case <-time.After(10 * time.Millisecond):
			return nil, io.EOF
		}
	}
	req := reqs[0]
	var g genetlink.Message
	if err := g.UnmarshalBinary(req.Data); err != nil {
		return nil, err
	}
	reply := func(gms []genetlink.Message) []netlink.Message {
		var out []netlink.Message
		for _, m := range gms {
			b, _ := m.MarshalBinary()
			h := netlink.Header{Type: req.Header.Type, Sequence: req.Header.Sequence, PID: req.Header.PID}
			if req.Header.Flags&netlink.Dump == netlink.Dump {
				h.Flags = netlink.Multi
			}
			out = append(out, netlink.Message{Header: h, Data: b})
		}
		if req.Header.Flags&netlink.Dump == netlink.Dump {
			out = append(out, netlink.Message{Header: netlink.Header{Type: netlink.Done, Flags: netlink.Multi, Sequence: req.Header.Sequence, PID: req.Header.PID}, Data: make([]byte, 4)})
		}
		return out
	}
	if req.Header.Type == unix.GENL_ID_CTRL {
		if k.noFamily {
			return k.errorMsg(req, kernelError{syscall.ENOENT, ""}), nil
		}
		ae := netlink.NewAttributeEncoder()
		ae.Uint16(unix.CTRL_ATTR_FAMILY_ID, k.familyID)
		ae.String(unix.CTRL_ATTR_FAMILY_NAME, FamilyName)
		ae.Uint32(unix.CTRL_ATTR_VERSION, Version)
		ae.Nested(unix.CTRL_ATTR_MCAST_GROUPS, func(n *netlink.AttributeEncoder) error {
			for i, gr := range []struct {
				name string
				id   uint32
			}{{"mptcp_pm_cmds", 6}, {EventsGroup, fakeEventsGroup}} {
				n.Nested(uint16(i+1), func(m *netlink.AttributeEncoder) error {
					m.String(unix.CTRL_ATTR_MCAST_GRP_NAME, gr.name)
					m.Uint32(unix.CTRL_ATTR_MCAST_GRP_ID, gr.id)
					return nil
				})
			}
			return nil
		})
		b, _ := ae.Encode()
		return reply([]genetlink.Message{{Header: genetlink.Header{Command: unix.CTRL_CMD_NEWFAMILY, Version: 2}, Data: b}}), nil
	}
	if req.Header.Type != netlink.HeaderType(k.familyID) {
		return nil, fmt.Errorf("fake kernel: message type %d", req.Header.Type)
	}
	k.mu.Lock()
	k.requests = append(k.requests, append([]byte(nil), req.Data...))
	k.flags = append(k.flags, req.Header.Flags)
	gms, err := k.handle(g)
	k.mu.Unlock()
	if ke, ok := err.(kernelError); ok {
		return k.errorMsg(req, ke), nil
	}
	if err != nil {
		return nil, err
	}
	out := reply(gms)
	if len(out) == 0 && req.Header.Flags&netlink.Acknowledge != 0 {
		out = []netlink.Message{{Header: netlink.Header{Type: netlink.Error, Sequence: req.Header.Sequence, PID: req.Header.PID}, Data: append(make([]byte, 4), marshalHeader(req)...)}}
	}
	return out, nil
}

func marshalHeader(req netlink.Message) []byte {
	req.Header.Length = uint32(16 + len(req.Data))
	b, _ := req.MarshalBinary()
	return b
}

// errorMsg is an NLMSG_ERROR with the request echoed and the message as NLMSGERR_ATTR_MSG.
func (k *fakeKernel) errorMsg(req netlink.Message, e kernelError) []netlink.Message {
	data := binary.NativeEndian.AppendUint32(nil, uint32(-int32(e.errno)))
	data = append(data, marshalHeader(req)...)
	flags := netlink.HeaderFlags(0)
	if e.msg != "" {
		ab, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: 1, Data: append([]byte(e.msg), 0)}})
		data = append(data, ab...)
		flags = netlink.AcknowledgeTLVs
	}
	return []netlink.Message{{Header: netlink.Header{Type: netlink.Error, Flags: flags, Sequence: req.Header.Sequence, PID: req.Header.PID}, Data: data}}
}

// request is a decoded command.
type request struct {
	token     uint32
	hasToken  bool
	addr      *Addr
	remote    *Addr
	locID     *uint8
	limits    [2]*uint32
	rawFamily uint16
}

func decodeRequest(b []byte) (request, error) {
	var r request
	attrs, err := parseAttrs(b)
	if err != nil {
		return r, err
	}
	for _, a := range attrs {
		switch a.typ {
		case attrToken:
			r.token, r.hasToken = binary.NativeEndian.Uint32(a.data), true
		case attrAddr, attrAddrRemote:
			ad, err := decodeAddr(a.data)
			if err != nil {
				return r, err
			}
			if a.typ == attrAddr {
				r.addr = &ad
			} else {
				r.remote = &ad
			}
		case attrLocID:
			v := a.data[0]
			r.locID = &v
		case attrRcvAddAddrs, attrSubflows:
			v := binary.NativeEndian.Uint32(a.data)
			r.limits[a.typ-attrRcvAddAddrs] = &v
		}
	}
	return r, nil
}

func addrReply(a Addr) genetlink.Message {
	ae := netlink.NewAttributeEncoder()
	encodeAddr(ae, attrAddr, a)
	b, _ := ae.Encode()
	return genetlink.Message{Header: genetlink.Header{Command: cmdGetAddr, Version: Version}, Data: b}
}

func (k *fakeKernel) handle(g genetlink.Message) ([]genetlink.Message, error) {
	r, err := decodeRequest(g.Data)
	if err != nil {
		return nil, kernelError{syscall.EINVAL, "malformed"}
	}
	write := g.Header.Command != cmdGetAddr && g.Header.Command != cmdGetLimits
	if write && k.deny {
		return nil, kernelError{syscall.EPERM, ""}
	}
	needUserspace := func() error {
		if !k.userspace {
			return kernelError{syscall.EINVAL, "userspace PM not selected"}
		}
		if _, ok := k.conns[r.token]; !ok {
			return kernelError{syscall.EINVAL, "invalid token"}
		}
		return nil
	}
	switch g.Header.Command {
	case cmdAddAddr:
		if r.addr == nil || !r.addr.Addr.IsValid() {
			return nil, kernelError{syscall.EINVAL, "missing address info"}
		}
		a := *r.addr
		for _, e := range k.endpoints {
			if e.Addr == a.Addr || (a.ID != 0 && e.ID == a.ID) {
				return nil, kernelError{syscall.EEXIST, ""}
			}
		}
		if a.ID == 0 {
			a.ID = uint8(len(k.endpoints) + 1)
		}
		k.endpoints = append(k.endpoints, a)
	case cmdDelAddr:
		if r.addr.ID == 0 {
			return nil, nil // withdraws the address from connections; endpoints stay
		}
		for i, e := range k.endpoints {
			if e.ID == r.addr.ID {
				k.endpoints = append(k.endpoints[:i], k.endpoints[i+1:]...)
				return nil, nil
			}
		}
		return nil, kernelError{syscall.EINVAL, "address not found"}
	case cmdGetAddr:
		if r.hasToken {
			if err := needUserspace(); err != nil {
				return nil, err
			}
			var out []genetlink.Message
			for _, s := range k.conns[r.token] {
				out = append(out, addrReply(s.Local))
			}
			return out, nil
		}
		if r.addr != nil {
			for _, e := range k.endpoints {
				if e.ID == r.addr.ID {
					return []genetlink.Message{addrReply(e)}, nil
				}
			}
			return nil, kernelError{syscall.EINVAL, "address not found"}
		}
		var out []genetlink.Message
		for _, e := range k.endpoints {
			out = append(out, addrReply(e))
		}
		return out, nil
	case cmdFlushAddrs:
		k.endpoints = nil
	case cmdSetLimits:
		for i, p := range r.limits {
			if p != nil && *p > 8 {
				return nil, kernelError{syscall.EINVAL, "limit greater than maximum"}
			}
			if p != nil && i == 0 {
				k.limits.AddAddrAccepted = *p
			} else if p != nil {
				k.limits.Subflows = *p
			}
		}
	case cmdGetLimits:
		ae := netlink.NewAttributeEncoder()
		ae.Uint32(attrRcvAddAddrs, k.limits.AddAddrAccepted)
		ae.Uint32(attrSubflows, k.limits.Subflows)
		b, _ := ae.Encode()
		return []genetlink.Message{{Header: genetlink.Header{Command: cmdGetLimits, Version: Version}, Data: b}}, nil
	case cmdSetFlags:
		if !r.hasToken {
			for i, e := range k.endpoints {
				if (r.addr.ID != 0 && e.ID == r.addr.ID) || (r.addr.ID == 0 && e.Addr == r.addr.Addr) {
					k.endpoints[i].Flags = e.Flags&^FlagBackup | r.addr.Flags&FlagBackup
					return nil, nil
				}
			}
			return nil, kernelError{syscall.EINVAL, "address not found"}
		}
		if err := needUserspace(); err != nil {
			return nil, err
		}
		for i, s := range k.conns[r.token] {
			if s.Local.Addr == r.addr.Addr && (r.addr.Port == 0 || s.Local.Port == r.addr.Port) && r.remote != nil && s.Remote == netip.AddrPortFrom(r.remote.Addr, r.remote.Port) {
				k.conns[r.token][i].Local.Flags = r.addr.Flags & FlagBackup
				return nil, nil
			}
		}
		return nil, kernelError{syscall.EINVAL, "subflow not found"}
	case cmdAnnounce:
		if err := needUserspace(); err != nil {
			return nil, err
		}
		if r.addr == nil || r.addr.ID == 0 {
			return nil, kernelError{syscall.EINVAL, "invalid addr id"}
		}
		if r.addr.Flags&FlagSignal == 0 {
			return nil, kernelError{syscall.EINVAL, "invalid addr flags"}
		}
	case cmdRemove:
		if err := needUserspace(); err != nil {
			return nil, err
		}
		if r.locID == nil {
			return nil, kernelError{syscall.EINVAL, "missing attribute"}
		}
	case cmdSubflowCreate, cmdSubflowDestroy:
		if err := needUserspace(); err != nil {
			return nil, err
		}
		if r.addr == nil || r.remote == nil {
			return nil, kernelError{syscall.EINVAL, "missing address"}
		}
		if r.addr.Addr.Is4() != r.remote.Addr.Is4() {
			return nil, kernelError{syscall.EINVAL, "families mismatch"}
		}
		s := Subflow{Token: r.token, Local: *r.addr, Remote: netip.AddrPortFrom(r.remote.Addr, r.remote.Port)}
		if g.Header.Command == cmdSubflowCreate {
			if r.addr.Flags&FlagSignal != 0 {
				return nil, kernelError{syscall.EINVAL, "invalid addr flags"}
			}
			k.conns[r.token] = append(k.conns[r.token], s)
			return nil, nil
		}
		if r.addr.Port == 0 {
			return nil, kernelError{syscall.EINVAL, "missing local port"}
		}
		for i, c := range k.conns[r.token] {
			if c.Local.Addr == s.Local.Addr && c.Local.Port == s.Local.Port && c.Remote == s.Remote {
				k.conns[r.token] = append(k.conns[r.token][:i], k.conns[r.token][i+1:]...)
				return nil, nil
			}
		}
		return nil, kernelError{syscall.ESRCH, "subflow not found"}
	default:
		return nil, kernelError{syscall.EOPNOTSUPP, ""}
	}
	return nil, nil
}
