package info

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// sockDestroy is SOCK_DESTROY (linux/sock_diag.h): abort the socket an inet_diag_req_v2 names.
const sockDestroy = 21

// ErrNoDestroy is returned by Abort when the kernel cannot destroy sockets through sock_diag
// (CONFIG_INET_DIAG_DESTROY missing) or the caller lacks CAP_NET_ADMIN.
var ErrNoDestroy = errors.New("info: the kernel does not let sockets be aborted through sock_diag (CONFIG_INET_DIAG_DESTROY, CAP_NET_ADMIN)")

// Abort aborts the TCP socket (an MPTCP subflow, typically) from local to remote, as `ss -K`
// does: the kernel sends a reset and drops whatever the socket still had queued, sent or not.
// Closing a subflow through the path manager (SUBFLOW_DESTROY) is graceful instead: TCP keeps
// sending what the subflow had queued before its FIN. ifIndex is the device the socket is
// bound to, if any (0: none); the kernel matches it exactly.
func (d *Diag) Abort(local, remote netip.AddrPort, ifIndex int) error {
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	if local.Addr().Is4() != remote.Addr().Is4() {
		return fmt.Errorf("info: abort %v -> %v: mixed address families", local, remote)
	}
	_, err := d.c.Execute(netlink.Message{
		Header: netlink.Header{Type: sockDestroy, Flags: netlink.Request | netlink.Acknowledge},
		Data:   destroyRequest(local, remote, ifIndex),
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w: %v", ErrNoDestroy, err)
	default:
		return fmt.Errorf("info: abort %v -> %v: %w", local, remote, err)
	}
}

// destroyRequest is the inet_diag_req_v2 naming one TCP socket: inet_diag_sockid holds the
// socket's own address and port as source, the peer's as destination, both big-endian, the
// bound device and no cookie (INET_DIAG_NOCOOKIE).
func destroyRequest(local, remote netip.AddrPort, ifIndex int) []byte {
	b := make([]byte, diagReqSize)
	b[0] = unix.AF_INET6
	if local.Addr().Is4() {
		b[0] = unix.AF_INET
	}
	b[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(b[4:], allButListenState)
	id := b[8:]
	binary.BigEndian.PutUint16(id[0:], local.Port())
	binary.BigEndian.PutUint16(id[2:], remote.Port())
	la, ra := local.Addr().AsSlice(), remote.Addr().AsSlice()
	copy(id[4:20], la)
	copy(id[20:36], ra)
	binary.NativeEndian.PutUint32(id[36:], uint32(ifIndex))
	binary.NativeEndian.PutUint32(id[40:], ^uint32(0))
	binary.NativeEndian.PutUint32(id[44:], ^uint32(0))
	return b
}
