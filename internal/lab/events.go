package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"braid/internal/lab/topo"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Events that change a running lab while traffic flows, as the field changes a network under a
// tunnel: an interface goes down and comes back (a modem that drops), an address changes (DHCP
// renumbering), a NAT loses its mappings (FlushNAT in nat.go).

func netlinkAddr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD // the link is ours alone: no duplicate to detect, no wait
	}
	return a
}

func (h *Host) iface(ifname string) (netlink.Link, error) {
	link, err := h.NS.Netlink().LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("lab: host %s has no interface %q: %w", h.Name, ifname, err)
	}
	return link, nil
}

// SetInterfaceUp takes an interface of the host down, as `ip link set down` does (the host sees
// the link go down and the kernel removes the routes through it, and its IPv6 addresses), or
// brings it up again with the addresses and routes it had: those of the topology, as changed
// since by ReplaceAddr and ReplaceRoute. Packets that reach a down interface of an emulated
// link are lost.
func (h *Host) SetInterfaceUp(ifname string, up bool) error {
	link, err := h.iface(ifname)
	if err != nil {
		return err
	}
	if !up {
		if err := h.NS.Netlink().LinkSetDown(link); err != nil {
			return fmt.Errorf("lab: host %s: %s down: %w", h.Name, ifname, err)
		}
		return nil
	}
	if err := h.NS.Netlink().LinkSetUp(link); err != nil {
		return fmt.Errorf("lab: host %s: %s up: %w", h.Name, ifname, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.restoreLocked(link, ifname, nil)
}

// InterfaceUp reports whether the interface is administratively up.
func (h *Host) InterfaceUp(ifname string) (bool, error) {
	link, err := h.iface(ifname)
	if err != nil {
		return false, err
	}
	return link.Attrs().Flags&net.FlagUp != 0, nil
}

// Addrs returns the addresses the kernel has on the interface now, without IPv6 link-local ones.
func (h *Host) Addrs(ifname string) ([]netip.Prefix, error) {
	link, err := h.iface(ifname)
	if err != nil {
		return nil, err
	}
	list, err := h.NS.Netlink().AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("lab: host %s: addresses of %s: %w", h.Name, ifname, err)
	}
	var out []netip.Prefix
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap().IsLinkLocalUnicast() {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return out, nil
}

// ReplaceAddr changes an address of the interface: it removes old, then adds new (either may be
// the zero Prefix, to only add or only remove). Removing the last address of an interface makes
// the kernel drop the routes through it; the host's routes through the interface are installed
// again once new is there. A route whose gateway is in no subnet of the interface any more is
// reported in the error (the address has changed all the same): ReplaceRoute can move it. A
// NAT whose outside address goes drops the mappings made with it, as the kernel does.
func (h *Host) ReplaceAddr(ifname string, old, new netip.Prefix) error {
	link, err := h.iface(ifname)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	have := h.addrs[ifname]
	if old.IsValid() {
		if !slices.Contains(have, old) {
			return fmt.Errorf("lab: host %s: %s is not an address of %s (it has %v)", h.Name, old, ifname, have)
		}
		if err := h.NS.Netlink().AddrDel(link, netlinkAddr(old)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("lab: host %s: remove %s from %s: %w", h.Name, old, ifname, err)
		}
		have = slices.DeleteFunc(slices.Clone(have), func(p netip.Prefix) bool { return p == old })
		if h.nat != nil {
			// The kernel drops the mappings made with a masquerade address that goes, but later,
			// from a work queue: a packet sent meanwhile would still leave with the old address.
			h.forgetMappings(old.Addr())
		}
	}
	if new.IsValid() {
		if slices.Contains(have, new) {
			return fmt.Errorf("lab: host %s: %s is already an address of %s", h.Name, new, ifname)
		}
		if err := h.NS.Netlink().AddrAdd(link, netlinkAddr(new)); err != nil {
			h.addrs[ifname] = have
			return fmt.Errorf("lab: host %s: add %s to %s: %w", h.Name, new, ifname, err)
		}
		have = append(have, new)
	}
	h.addrs[ifname] = have
	if link.Attrs().Flags&net.FlagUp == 0 {
		return nil // SetInterfaceUp restores the routes
	}
	var lost []netip.Prefix
	if old.IsValid() {
		lost = []netip.Prefix{old}
	}
	return h.restoreLocked(link, ifname, lost)
}

// restoreLocked installs again what the host should have on the interface: its addresses, then
// the routes through it (by dev, or by a gateway in a subnet of the interface or of lost, the
// addresses just removed). Missing routes through other interfaces are left alone: those may be
// down.
func (h *Host) restoreLocked(link netlink.Link, ifname string, lost []netip.Prefix) error {
	nl := h.NS.Netlink()
	var errs []error
	for _, p := range h.addrs[ifname] {
		if err := nl.AddrAdd(link, netlinkAddr(p)); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("address %s: %w", p, err))
		}
	}
	on := func(via netip.Addr, ps []netip.Prefix) bool {
		return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(via) })
	}
	for _, r := range h.routes {
		switch {
		case r.Dev == ifname:
		case r.Dev == "" && r.Via.IsValid() && on(r.Via, h.addrs[ifname]):
		case r.Dev == "" && r.Via.IsValid() && on(r.Via, lost):
			if !h.routeExists(r) {
				errs = append(errs, fmt.Errorf("route %s via %s: the gateway is in no subnet of %s any more", r.Dst, r.Via, ifname))
			}
			continue
		default:
			continue
		}
		nr, err := netlinkRoute(h, r)
		if err == nil {
			err = nl.RouteAdd(nr)
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("route %s: %w", r.Dst, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lab: host %s: restoring %s: %w", h.Name, ifname, err)
	}
	return nil
}

// routeExists reports whether the kernel has a route to r's destination with r's metric.
func (h *Host) routeExists(r topo.Route) bool {
	family := netlink.FAMILY_V4
	if r.Dst.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	dst := &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())}
	routes, err := h.NS.Netlink().RouteListFiltered(family, &netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return false
	}
	for _, x := range routes {
		if x.Priority == r.Metric {
			return true
		}
	}
	return false
}

// SetLinkUp takes both ends of the named link down, as a cable pulled out, or brings them up
// again (see Host.SetInterfaceUp). Unlike Link.Cut, the hosts see it.
func (l *Lab) SetLinkUp(name string, up bool) error {
	lk := l.byName[name]
	if lk == nil {
		return fmt.Errorf("lab: no link named %q", name)
	}
	var errs []error
	for _, ep := range []topo.Endpoint{lk.Spec.A, lk.Spec.B} {
		errs = append(errs, l.hosts[ep.Host].SetInterfaceUp(ep.Ifname, up))
	}
	return errors.Join(errs...)
}
