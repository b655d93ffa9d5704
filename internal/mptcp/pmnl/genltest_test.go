package pmnl

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/genetlink/genltest"
	"github.com/mdlayher/netlink"
)

// The client against genltest's fake family: the family is resolved by name, requests carry
// the family's ID, command and flags, and a bare errno (no extended ack) still names the call.
func TestGenltest(t *testing.T) {
	fam := genetlink.Family{ID: 0x21, Name: FamilyName, Version: Version,
		Groups: []genetlink.MulticastGroup{{ID: 9, Name: EventsGroup}}}
	var limits []byte
	conn := genltest.Dial(genltest.ServeFamily(fam, func(g genetlink.Message, n netlink.Message) ([]genetlink.Message, error) {
		switch g.Header.Command {
		case cmdGetLimits:
			return genltest.CheckRequest(fam.ID, cmdGetLimits, netlink.Request, func(genetlink.Message, netlink.Message) ([]genetlink.Message, error) {
				return []genetlink.Message{{Header: genetlink.Header{Command: cmdGetLimits, Version: Version}, Data: limits}}, nil
			})(g, n)
		case cmdFlushAddrs:
			return nil, genltest.Error(int(syscall.EPERM))
		}
		return nil, genltest.Error(int(syscall.EOPNOTSUPP))
	}))
	c, err := NewClient(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(attrRcvAddAddrs, 3)
	ae.Uint32(attrSubflows, 5)
	limits, _ = ae.Encode()
	l, err := c.Limits(context.Background())
	if err != nil || l != (Limits{AddAddrAccepted: 3, Subflows: 5}) {
		t.Fatalf("limits %+v %v", l, err)
	}
	err = c.FlushEndpoints(context.Background())
	var pe *Error
	if !errors.As(err, &pe) || !errors.Is(err, syscall.EPERM) || pe.Op != "flush endpoints" || pe.Message != "" {
		t.Fatalf("flush: %v", err)
	}
	limits = []byte{8, 0, 3, 0, 1} // truncated attribute
	if _, err := c.Limits(context.Background()); !errors.Is(err, ErrMalformed) {
		t.Errorf("malformed reply: %v", err)
	}
}
