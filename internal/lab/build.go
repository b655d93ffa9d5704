package lab

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"sync"

	"braid/internal/lab/emu"
	"braid/internal/lab/topo"

	"github.com/vishvananda/netlink"
)

// offloadMinRate is the slowest link on which auto mode passes TSO super-packets through. Below
// it the emulator takes MTU-sized packets, so that packet timing is exact where it matters most
// (a 64 KiB super-packet takes 5 ms at 100 Mbit/s); above it, per-packet work would make the
// emulator the bottleneck.
const offloadMinRate = 200_000_000

// useOffload decides the packet mode of a link.
func useOffload(spec topo.Link) bool {
	switch spec.Offload {
	case topo.OffloadOn:
		return true
	case topo.OffloadOff:
		return false
	}
	for _, s := range []topo.Shape{spec.AB, spec.BA} {
		// Random loss must hit single packets, not whole super-packets.
		if s.Loss > 0 || s.MeanRate() != 0 && s.MeanRate() < offloadMinRate { // a trace's mean
			return false
		}
	}
	return true
}

func (l *Lab) buildLink(spec topo.Link, seed uint64) (*Link, error) {
	if spec.Kernel {
		return l.buildKernelLink(spec)
	}
	offload := useOffload(spec)
	ends := [2]topo.Endpoint{spec.A, spec.B}
	var files [2]*os.File
	for i, ep := range ends {
		h := l.hosts[ep.Host]
		err := h.NS.Do(func() error {
			f, err := emu.OpenTUN(ep.Ifname, offload)
			files[i] = f
			return err
		})
		if err == nil {
			err = configureInterface(h, ep, spec.MTU)
		}
		if err != nil {
			for _, f := range files {
				if f != nil {
					f.Close()
				}
			}
			return nil, fmt.Errorf("%s end: %w", ep.Host, err)
		}
	}
	lk := &Link{Spec: spec, Offload: offload, shape: [2]topo.Shape{spec.AB, spec.BA}}
	el, err := emu.NewLink(files[0], files[1], offload, spec.MTU, spec.AB, spec.BA, seed)
	if err != nil {
		files[0].Close()
		files[1].Close()
		return nil, err
	}
	lk.emu = el
	return lk, nil
}

func configureInterface(h *Host, ep topo.Endpoint, mtu int) error {
	nl := h.NS.Netlink()
	link, err := nl.LinkByName(ep.Ifname)
	if err != nil {
		return fmt.Errorf("interface %s: %w", ep.Ifname, err)
	}
	if err := nl.LinkSetMTU(link, mtu); err != nil {
		return fmt.Errorf("mtu of %s: %w", ep.Ifname, err)
	}
	if err := nl.LinkSetTxQLen(link, 1000); err != nil {
		return fmt.Errorf("txqueuelen of %s: %w", ep.Ifname, err)
	}
	for _, p := range ep.Addrs {
		if err := nl.AddrAdd(link, netlinkAddr(p)); err != nil {
			return fmt.Errorf("address %s on %s: %w", p, ep.Ifname, err)
		}
	}
	if err := nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up %s: %w", ep.Ifname, err)
	}
	return nil
}

func (l *Lab) addRoutes(h *Host, routes []topo.Route) error {
	for _, r := range routes {
		nr, err := netlinkRoute(h, r)
		if err != nil {
			return err
		}
		if err := h.NS.Netlink().RouteAdd(nr); err != nil {
			return fmt.Errorf("route %s: %w", r.Dst, err)
		}
	}
	return nil
}

func netlinkRoute(h *Host, r topo.Route) (*netlink.Route, error) {
	nr := &netlink.Route{
		Dst:      &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		Priority: r.Metric,
	}
	if r.Via.IsValid() {
		nr.Gw = r.Via.AsSlice()
	}
	if r.Dev != "" {
		link, err := h.NS.Netlink().LinkByName(r.Dev)
		if err != nil {
			return nil, fmt.Errorf("route %s: interface %s: %w", r.Dst, r.Dev, err)
		}
		nr.LinkIndex = link.Attrs().Index
		if !r.Via.IsValid() {
			nr.Scope = netlink.SCOPE_LINK
		}
	}
	return nr, nil
}

// safeBuffer is a bytes.Buffer that a process's stdout and stderr may write concurrently.
type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// ReplaceRoute installs r in the host, replacing any route to the same destination.
func (h *Host) ReplaceRoute(r topo.Route) error {
	nr, err := netlinkRoute(h, r)
	if err != nil {
		return err
	}
	if err := h.NS.Netlink().RouteReplace(nr); err != nil {
		return fmt.Errorf("lab: host %s: route %s: %w", h.Name, r.Dst, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, o := range h.routes {
		if o.Dst == r.Dst && o.Metric == r.Metric {
			h.routes[i] = r
			return nil
		}
	}
	h.routes = append(h.routes, r)
	return nil
}
