// Package tun opens and configures the tunnel's TUN interface: one IP packet per read and per
// write, no packet-information header (Open), or with offloads, up to 64 TCP segments per read
// and per write (OpenOffload).
package tun

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"braid/internal/wire/vnet"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Device is an open TUN interface.
type Device struct {
	Name string
	file *os.File
	offloadState
}

// Open creates (or attaches to) the TUN interface name in the calling thread's network namespace.
func Open(name string) (*Device, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("tun: open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tun: interface name %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tun: create %s: %w", name, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tun: %w", err)
	}
	return &Device{Name: ifr.Name(), file: os.NewFile(uintptr(fd), "tun:"+name)}, nil
}

// Read reads one packet from a plain device.
func (d *Device) Read(b []byte) (int, error) {
	if d.offload {
		return 0, ErrOffloadRead
	}
	return d.file.Read(b)
}

// Write writes one packet (behind a header that asks for no offload, on a device with them).
func (d *Device) Write(b []byte) (int, error) {
	if !d.offload {
		return d.file.Write(b)
	}
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if cap(d.wbuf) < vnet.HdrLen+len(b) {
		d.wbuf = make([]byte, vnet.HdrLen+len(b))
	}
	w := d.wbuf[:vnet.HdrLen+len(b)]
	clear(w[:vnet.HdrLen])
	copy(w[vnet.HdrLen:], b)
	n, err := d.file.Write(w)
	return max(n-vnet.HdrLen, 0), err
}

// Close closes the device; a TUN interface that nothing holds disappears.
func (d *Device) Close() error {
	d.closed.Store(true)
	return d.file.Close()
}

// Configure sets the MTU and addresses of the interface and brings it up, through nl (a netlink
// handle of the interface's namespace).
func Configure(nl *netlink.Handle, name string, mtu int, addrs []netip.Prefix) error {
	link, err := nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("tun: %s: %w", name, err)
	}
	if err := nl.LinkSetMTU(link, mtu); err != nil {
		return fmt.Errorf("tun: mtu %d on %s: %w", mtu, name, err)
	}
	if err := nl.LinkSetTxQLen(link, 1000); err != nil {
		return fmt.Errorf("tun: txqueuelen of %s: %w", name, err)
	}
	for _, p := range addrs {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := nl.AddrAdd(link, a); err != nil {
			return fmt.Errorf("tun: address %s on %s: %w", p, name, err)
		}
	}
	if err := nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("tun: bring up %s: %w", name, err)
	}
	return nil
}

// SetMTU changes the MTU of the interface.
func SetMTU(nl *netlink.Handle, name string, mtu int) error {
	link, err := nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("tun: %s: %w", name, err)
	}
	if err := nl.LinkSetMTU(link, mtu); err != nil {
		return fmt.Errorf("tun: mtu %d on %s: %w", mtu, name, err)
	}
	return nil
}

// AddRoute routes prefix into the interface.
func AddRoute(nl *netlink.Handle, name string, prefix netip.Prefix) error {
	link, err := nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("tun: %s: %w", name, err)
	}
	r := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())},
		Scope:     netlink.SCOPE_LINK,
	}
	if err := nl.RouteReplace(r); err != nil {
		return fmt.Errorf("tun: route %s via %s: %w", prefix, name, err)
	}
	return nil
}

// DelRoute removes the route of prefix into the interface; one already gone is no error.
func DelRoute(nl *netlink.Handle, name string, prefix netip.Prefix) error {
	link, err := nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("tun: %s: %w", name, err)
	}
	r := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())},
		Scope:     netlink.SCOPE_LINK,
	}
	if err := nl.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("tun: route %s via %s: %w", prefix, name, err)
	}
	return nil
}

// SetReadDeadline makes reads that wait past t fail with os.ErrDeadlineExceeded; the zero time
// waits for ever. The tunnel waits for the device and its pacer at once with it.
func (d *Device) SetReadDeadline(t time.Time) error { return d.file.SetReadDeadline(t) }
