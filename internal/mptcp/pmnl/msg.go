// Package pmnl is a typed client for the kernel's MPTCP path-manager generic-netlink family,
// "mptcp_pm": the in-kernel PM's endpoints and limits, the userspace PM's per-connection
// commands (announce, remove, subflow create and destroy, per-subflow flags), and the stream of
// path-manager events.
//
// A command is one generic-netlink message (no family header) whose attributes are:
//
//	1 ADDR (nest)  2 RCV_ADD_ADDRS u32  3 SUBFLOWS u32  4 TOKEN u32  5 LOC_ID u8  6 ADDR_REMOTE (nest)
//
// and an address nest is:
//
//	1 FAMILY u16  2 ID u8  3 ADDR4 (4 bytes, network order)  4 ADDR6 (16 bytes)
//	5 PORT u16 (host order)  6 FLAGS u32  7 IF_IDX s32
//
// Events use another attribute space, where ports are big-endian:
//
//	1 TOKEN u32  2 FAMILY u16  3 LOC_ID u8  4 REM_ID u8  5 SADDR4  6 SADDR6  7 DADDR4  8 DADDR6
//	9 SPORT be16  10 DPORT be16  11 BACKUP u8  12 ERROR u8  13 FLAGS u16  14 TIMEOUT u32
//	15 IF_IDX s32  16 RESET_REASON u32  17 RESET_FLAGS u32  18 SERVER_SIDE u8
//
// Integers other than ports in events are in host byte order. Everything is per network
// namespace: a Client talks to the namespace its socket was opened in.
package pmnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/mdlayher/netlink"
)

// Family facts.
const (
	FamilyName  = "mptcp_pm"
	EventsGroup = "mptcp_pm_events"
	Version     = 1
)

// Commands (MPTCP_PM_CMD_*).
const (
	cmdAddAddr        uint8 = 1
	cmdDelAddr        uint8 = 2
	cmdGetAddr        uint8 = 3
	cmdFlushAddrs     uint8 = 4
	cmdSetLimits      uint8 = 5
	cmdGetLimits      uint8 = 6
	cmdSetFlags       uint8 = 7
	cmdAnnounce       uint8 = 8
	cmdRemove         uint8 = 9
	cmdSubflowCreate  uint8 = 10
	cmdSubflowDestroy uint8 = 11
)

// Top-level command attributes (MPTCP_PM_ATTR_*).
const (
	attrAddr        = 1
	attrRcvAddAddrs = 2
	attrSubflows    = 3
	attrToken       = 4
	attrLocID       = 5
	attrAddrRemote  = 6
)

// Address nest attributes (MPTCP_PM_ADDR_ATTR_*).
const (
	addrFamily  = 1
	addrID      = 2
	addrAddr4   = 3
	addrAddr6   = 4
	addrPort    = 5
	addrFlags   = 6
	addrIfIndex = 7
)

// Event attributes (MPTCP_ATTR_*).
const (
	evToken       = 1
	evFamily      = 2
	evLocID       = 3
	evRemID       = 4
	evSaddr4      = 5
	evSaddr6      = 6
	evDaddr4      = 7
	evDaddr6      = 8
	evSport       = 9
	evDport       = 10
	evBackup      = 11
	evError       = 12
	evFlags       = 13
	evTimeout     = 14
	evIfIndex     = 15
	evResetReason = 16
	evResetFlags  = 17
	evServerSide  = 18
)

const (
	afInet  = 2
	afInet6 = 10
)

// ErrMalformed is returned for a message the kernel could not have sent: a truncated
// attribute, a wrong length, an unknown family.
var ErrMalformed = errors.New("pmnl: malformed message")

// Flags are an endpoint's or a subflow's flags (MPTCP_PM_ADDR_FLAG_*).
type Flags uint32

const (
	FlagSignal   Flags = 1 << 0 // announce the address to the peer (ADD_ADDR)
	FlagSubflow  Flags = 1 << 1 // open subflows from the address
	FlagBackup   Flags = 1 << 2 // subflows from it are backup
	FlagFullmesh Flags = 1 << 3 // one subflow from it to every known remote address
	FlagImplicit Flags = 1 << 4 // created by the kernel for a subflow it accepted
	FlagLaminar  Flags = 1 << 5 // (6.18) one subflow per remote address from this endpoint
)

var flagNames = []struct {
	f    Flags
	name string
}{{FlagSignal, "signal"}, {FlagSubflow, "subflow"}, {FlagBackup, "backup"}, {FlagFullmesh, "fullmesh"}, {FlagImplicit, "implicit"}, {FlagLaminar, "laminar"}}

// String lists the flags as ip mptcp does: "signal,backup".
func (f Flags) String() string {
	var parts []string
	for _, n := range flagNames {
		if f&n.f != 0 {
			parts = append(parts, n.name)
			f &^= n.f
		}
	}
	if f != 0 {
		parts = append(parts, fmt.Sprintf("0x%x", uint32(f)))
	}
	return strings.Join(parts, ",")
}

// ParseFlags reads a comma-separated list of flag names (the inverse of String).
func ParseFlags(s string) (Flags, error) {
	var f Flags
	if s == "" {
		return 0, nil
	}
next:
	for _, p := range strings.Split(s, ",") {
		for _, n := range flagNames {
			if p == n.name {
				f |= n.f
				continue next
			}
		}
		return 0, fmt.Errorf("pmnl: unknown flag %q (known: signal, subflow, backup, fullmesh, implicit, laminar)", p)
	}
	return f, nil
}

// Addr is an address as the path manager sees it: an in-kernel endpoint, a connection's local
// address for the userspace PM, or a remote address. ID 0 and Port 0 mean "not given".
type Addr struct {
	ID      uint8
	Addr    netip.Addr
	Port    uint16
	Flags   Flags
	IfIndex int32
}

func (a Addr) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "id %d %s", a.ID, a.Addr)
	if a.Port != 0 {
		fmt.Fprintf(&b, " port %d", a.Port)
	}
	if a.Flags != 0 {
		fmt.Fprintf(&b, " %s", strings.ReplaceAll(a.Flags.String(), ",", " "))
	}
	if a.IfIndex != 0 {
		fmt.Fprintf(&b, " ifindex %d", a.IfIndex)
	}
	return b.String()
}

// Limits are the in-kernel PM's per-connection limits.
type Limits struct {
	AddAddrAccepted uint32 // ADD_ADDRs accepted from the peer
	Subflows        uint32 // additional subflows
}

// encodeAddr writes an address nest. The family is always written (from Addr, or from
// family when Addr is unset, for requests naming only an ID).
func encodeAddr(ae *netlink.AttributeEncoder, typ uint16, a Addr) {
	ae.Nested(typ, func(n *netlink.AttributeEncoder) error {
		switch {
		case a.Addr.Is4():
			n.Uint16(addrFamily, afInet)
		case a.Addr.IsValid():
			n.Uint16(addrFamily, afInet6)
		}
		if a.Addr.Is4() {
			b := a.Addr.As4()
			n.Bytes(addrAddr4, b[:])
		} else if a.Addr.IsValid() {
			b := a.Addr.As16()
			n.Bytes(addrAddr6, b[:])
		}
		if a.ID != 0 {
			n.Uint8(addrID, a.ID)
		}
		if a.Port != 0 {
			n.Uint16(addrPort, a.Port) // host order: the kernel applies htons itself
		}
		if a.Flags != 0 {
			n.Uint32(addrFlags, uint32(a.Flags))
		}
		if a.IfIndex != 0 {
			n.Int32(addrIfIndex, a.IfIndex)
		}
		return nil
	})
}

// attr is one decoded netlink attribute.
type attr struct {
	typ  uint16
	data []byte
}

// parseAttrs splits b into attributes, checking every length.
func parseAttrs(b []byte) ([]attr, error) {
	var out []attr
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(b))
		}
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return nil, fmt.Errorf("%w: attribute length %d of %d bytes", ErrMalformed, l, len(b))
		}
		out = append(out, attr{typ: binary.NativeEndian.Uint16(b[2:4]) & 0x3fff, data: b[4:l]})
		al := (l + 3) &^ 3
		if al > len(b) {
			al = len(b)
		}
		b = b[al:]
	}
	return out, nil
}

func wantLen(a attr, n int, what string) error {
	if len(a.data) != n {
		return fmt.Errorf("%w: %s is %d bytes, want %d", ErrMalformed, what, len(a.data), n)
	}
	return nil
}

// decodeAddr reads an address nest.
func decodeAddr(b []byte) (Addr, error) {
	attrs, err := parseAttrs(b)
	if err != nil {
		return Addr{}, err
	}
	var a Addr
	var family uint16
	for _, at := range attrs {
		switch at.typ {
		case addrFamily:
			if err := wantLen(at, 2, "address family"); err != nil {
				return Addr{}, err
			}
			family = binary.NativeEndian.Uint16(at.data)
		case addrID:
			if err := wantLen(at, 1, "address id"); err != nil {
				return Addr{}, err
			}
			a.ID = at.data[0]
		case addrAddr4:
			if err := wantLen(at, 4, "IPv4 address"); err != nil {
				return Addr{}, err
			}
			a.Addr = netip.AddrFrom4([4]byte(at.data))
		case addrAddr6:
			if err := wantLen(at, 16, "IPv6 address"); err != nil {
				return Addr{}, err
			}
			a.Addr = netip.AddrFrom16([16]byte(at.data))
		case addrPort:
			if err := wantLen(at, 2, "port"); err != nil {
				return Addr{}, err
			}
			a.Port = binary.NativeEndian.Uint16(at.data)
		case addrFlags:
			if err := wantLen(at, 4, "flags"); err != nil {
				return Addr{}, err
			}
			a.Flags = Flags(binary.NativeEndian.Uint32(at.data))
		case addrIfIndex:
			if err := wantLen(at, 4, "interface index"); err != nil {
				return Addr{}, err
			}
			a.IfIndex = int32(binary.NativeEndian.Uint32(at.data))
		}
	}
	if family != 0 && family != afInet && family != afInet6 {
		return Addr{}, fmt.Errorf("%w: address family %d", ErrMalformed, family)
	}
	if a.Addr.IsValid() && family != 0 && a.Addr.Is4() != (family == afInet) {
		return Addr{}, fmt.Errorf("%w: address %s in family %d", ErrMalformed, a.Addr, family)
	}
	return a, nil
}

// decodeAddrReply reads the ADDR attribute of a GET_ADDR reply.
func decodeAddrReply(b []byte) (Addr, error) {
	attrs, err := parseAttrs(b)
	if err != nil {
		return Addr{}, err
	}
	for _, at := range attrs {
		if at.typ == attrAddr {
			return decodeAddr(at.data)
		}
	}
	return Addr{}, fmt.Errorf("%w: reply without an address", ErrMalformed)
}

// decodeLimits reads a GET_LIMITS reply.
func decodeLimits(b []byte) (Limits, error) {
	attrs, err := parseAttrs(b)
	if err != nil {
		return Limits{}, err
	}
	var l Limits
	for _, at := range attrs {
		switch at.typ {
		case attrRcvAddAddrs, attrSubflows:
			if err := wantLen(at, 4, "limit"); err != nil {
				return Limits{}, err
			}
			v := binary.NativeEndian.Uint32(at.data)
			if at.typ == attrSubflows {
				l.Subflows = v
			} else {
				l.AddAddrAccepted = v
			}
		}
	}
	return l, nil
}
