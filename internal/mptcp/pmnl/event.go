package pmnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/mdlayher/netlink"
)

// EventType is an MPTCP_EVENT_* value.
type EventType uint8

const (
	EventCreated         EventType = 1  // a connection was created (client: SYN sent; server: accepted)
	EventEstablished     EventType = 2  // fully established: subflows may be added
	EventClosed          EventType = 3  // the connection is gone
	EventAnnounced       EventType = 6  // the peer announced an address (ADD_ADDR)
	EventRemoved         EventType = 7  // the peer removed an address (REMOVE_ADDR)
	EventSubEstablished  EventType = 10 // a subflow joined
	EventSubClosed       EventType = 11 // a subflow closed
	EventSubPriority     EventType = 13 // the peer changed a subflow's backup flag (MP_PRIO)
	EventListenerCreated EventType = 15 // a listening socket was created
	EventListenerClosed  EventType = 16 // a listening socket was closed
)

var eventNames = map[EventType]string{
	EventCreated: "created", EventEstablished: "established", EventClosed: "closed",
	EventAnnounced: "announced", EventRemoved: "removed", EventSubEstablished: "sf_established",
	EventSubClosed: "sf_closed", EventSubPriority: "sf_priority",
	EventListenerCreated: "listener_created", EventListenerClosed: "listener_closed",
}

func (t EventType) String() string {
	if n, ok := eventNames[t]; ok {
		return n
	}
	return fmt.Sprintf("event%d", uint8(t))
}

// MarshalText names the event in JSON output.
func (t EventType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Event is one path-manager event. Fields the event does not carry are zero. Local and Remote
// are the kernel's saddr/sport and daddr/dport: for a listener only Local is set; for
// ANNOUNCED only Remote.
type Event struct {
	Type        EventType      `json:"type"`
	Token       uint32         `json:"token"`
	Local       netip.AddrPort `json:"local"`
	Remote      netip.AddrPort `json:"remote"`
	LocID       uint8          `json:"loc_id"`
	RemID       uint8          `json:"rem_id"`
	Backup      bool           `json:"backup"` // what the peer signalled (MP_JOIN B bit or MP_PRIO)
	Error       uint8          `json:"error,omitempty"`
	Flags       uint16         `json:"flags,omitempty"`
	Timeout     uint32         `json:"timeout,omitempty"`
	IfIndex     int32          `json:"ifindex,omitempty"`
	ResetReason uint32         `json:"reset_reason,omitempty"`
	ResetFlags  uint32         `json:"reset_flags,omitempty"`
	ServerSide  bool           `json:"server_side,omitempty"`
}

// String is one line in the spirit of ip mptcp monitor.
func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s]", strings.ToUpper(e.Type.String()))
	if e.Type != EventListenerCreated && e.Type != EventListenerClosed {
		fmt.Fprintf(&b, " token=%08x", e.Token)
	}
	switch e.Type {
	case EventAnnounced, EventRemoved:
		fmt.Fprintf(&b, " remid=%d", e.RemID)
		if e.Remote.Addr().IsValid() {
			fmt.Fprintf(&b, " daddr=%s dport=%d", e.Remote.Addr(), e.Remote.Port())
		}
	case EventSubEstablished, EventSubClosed, EventSubPriority:
		fmt.Fprintf(&b, " locid=%d remid=%d saddr=%s daddr=%s sport=%d dport=%d backup=%d",
			e.LocID, e.RemID, e.Local.Addr(), e.Remote.Addr(), e.Local.Port(), e.Remote.Port(), b2i(e.Backup))
		if e.IfIndex != 0 {
			fmt.Fprintf(&b, " ifindex=%d", e.IfIndex)
		}
		if e.Error != 0 {
			fmt.Fprintf(&b, " error=%d", e.Error)
		}
	case EventCreated, EventEstablished:
		fmt.Fprintf(&b, " saddr=%s daddr=%s sport=%d dport=%d", e.Local.Addr(), e.Remote.Addr(), e.Local.Port(), e.Remote.Port())
		if e.ServerSide {
			b.WriteString(" server_side=1")
		}
	case EventListenerCreated, EventListenerClosed:
		fmt.Fprintf(&b, " saddr=%s sport=%d", e.Local.Addr(), e.Local.Port())
	}
	if e.ResetReason != 0 || e.ResetFlags != 0 {
		fmt.Fprintf(&b, " reset_reason=%d reset_flags=0x%x", e.ResetReason, e.ResetFlags)
	}
	return b.String()
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// Decode decodes an event's attributes (the message body after the generic-netlink
// header). It overwrites the whole of *e; errors wrap ErrMalformed.
func (e *Event) Decode(cmd uint8, b []byte) error {
	attrs, err := parseAttrs(b)
	if err != nil {
		*e = Event{}
		return err
	}
	*e = Event{Type: EventType(cmd)}
	var family uint16
	var saddr, daddr netip.Addr
	var sport, dport uint16
	for _, at := range attrs {
		switch at.typ {
		case evToken:
			err = wantLen(at, 4, "token")
			if err == nil {
				e.Token = binary.NativeEndian.Uint32(at.data)
			}
		case evFamily:
			err = wantLen(at, 2, "family")
			if err == nil {
				family = binary.NativeEndian.Uint16(at.data)
				if family != afInet && family != afInet6 {
					err = fmt.Errorf("%w: event family %d", ErrMalformed, family)
				}
			}
		case evLocID, evRemID, evBackup, evError, evServerSide:
			err = wantLen(at, 1, "u8 attribute")
			if err == nil {
				v := at.data[0]
				switch at.typ {
				case evLocID:
					e.LocID = v
				case evRemID:
					e.RemID = v
				case evBackup:
					e.Backup = v != 0
				case evError:
					e.Error = v
				case evServerSide:
					e.ServerSide = v != 0
				}
			}
		case evSaddr4, evDaddr4:
			err = wantLen(at, 4, "IPv4 address")
			if err == nil {
				a := netip.AddrFrom4([4]byte(at.data))
				if at.typ == evSaddr4 {
					saddr = a
				} else {
					daddr = a
				}
			}
		case evSaddr6, evDaddr6:
			err = wantLen(at, 16, "IPv6 address")
			if err == nil {
				a := netip.AddrFrom16([16]byte(at.data))
				if at.typ == evSaddr6 {
					saddr = a
				} else {
					daddr = a
				}
			}
		case evSport, evDport:
			err = wantLen(at, 2, "port")
			if err == nil {
				p := binary.BigEndian.Uint16(at.data) // events carry ports in network order
				if at.typ == evSport {
					sport = p
				} else {
					dport = p
				}
			}
		case evFlags:
			err = wantLen(at, 2, "flags")
			if err == nil {
				e.Flags = binary.NativeEndian.Uint16(at.data)
			}
		case evTimeout, evIfIndex, evResetReason, evResetFlags:
			err = wantLen(at, 4, "u32 attribute")
			if err == nil {
				v := binary.NativeEndian.Uint32(at.data)
				switch at.typ {
				case evTimeout:
					e.Timeout = v
				case evIfIndex:
					e.IfIndex = int32(v)
				case evResetReason:
					e.ResetReason = v
				case evResetFlags:
					e.ResetFlags = v
				}
			}
		}
		if err != nil {
			*e = Event{}
			return err
		}
	}
	for _, a := range []netip.Addr{saddr, daddr} {
		if a.IsValid() && family != 0 && a.Is4() != (family == afInet) {
			*e = Event{}
			return fmt.Errorf("%w: address %s in family %d", ErrMalformed, a, family)
		}
	}
	e.Local = netip.AddrPortFrom(saddr, sport)
	e.Remote = netip.AddrPortFrom(daddr, dport)
	return nil
}

// Encode appends the event's attributes as the kernel would send them: the family and the
// addresses when set, ports in network order, zero fields left out. The fake kernel of the
// tests and the fuzz round trips use it.
func (e Event) Encode() ([]byte, error) {
	ae := netlink.NewAttributeEncoder()
	if e.Token != 0 {
		ae.Uint32(evToken, e.Token)
	}
	addr := e.Local.Addr()
	if !addr.IsValid() {
		addr = e.Remote.Addr()
	}
	// The family is written only when it describes every address the event carries.
	if r := e.Remote.Addr(); r.IsValid() && r.Is4() != addr.Is4() {
		addr = netip.Addr{}
	}
	if addr.IsValid() {
		if addr.Is4() {
			ae.Uint16(evFamily, afInet)
		} else {
			ae.Uint16(evFamily, afInet6)
		}
	}
	put := func(a netip.Addr, t4, t6 uint16) {
		if a.Is4() {
			b := a.As4()
			ae.Bytes(t4, b[:])
		} else if a.IsValid() {
			b := a.As16()
			ae.Bytes(t6, b[:])
		}
	}
	put(e.Local.Addr(), evSaddr4, evSaddr6)
	put(e.Remote.Addr(), evDaddr4, evDaddr6)
	port := func(t uint16, p uint16) {
		if p != 0 {
			ae.Bytes(t, binary.BigEndian.AppendUint16(nil, p))
		}
	}
	port(evSport, e.Local.Port())
	port(evDport, e.Remote.Port())
	u8 := func(t uint16, v uint8) {
		if v != 0 {
			ae.Uint8(t, v)
		}
	}
	u8(evLocID, e.LocID)
	u8(evRemID, e.RemID)
	u8(evBackup, uint8(b2i(e.Backup)))
	u8(evError, e.Error)
	u8(evServerSide, uint8(b2i(e.ServerSide)))
	if e.Flags != 0 {
		ae.Uint16(evFlags, e.Flags)
	}
	u32 := func(t uint16, v uint32) {
		if v != 0 {
			ae.Uint32(t, v)
		}
	}
	u32(evTimeout, e.Timeout)
	u32(evIfIndex, uint32(e.IfIndex))
	u32(evResetReason, e.ResetReason)
	u32(evResetFlags, e.ResetFlags)
	return ae.Encode()
}
