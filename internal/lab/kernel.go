package lab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"braid/internal/lab/emu"
	"braid/internal/lab/topo"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// kernelLink is a link made of a kernel veth pair: the kernel's own speed and offloads, rate
// limited by a TBF qdisc on each end when asked. It is the baseline a user-space data path is
// measured against.
type kernelLink struct {
	hosts [2]*Host
	names [2]string // interface of each end
	mu    sync.Mutex
	rates [2]uint64
	cut   bool
	log   *slog.Logger
}

// buildKernelLink creates the veth pair of spec: made in A's namespace, its peer moved into B's.
func (l *Lab) buildKernelLink(spec topo.Link) (*Link, error) {
	ha, hb := l.hosts[spec.A.Host], l.hosts[spec.B.Host]
	var sfx [4]byte
	rand.Read(sfx[:])
	tmp := "brv" + hex.EncodeToString(sfx[:]) // the peer's name until it is in B's namespace
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: spec.A.Ifname, MTU: spec.MTU, TxQLen: 1000}, PeerName: tmp}
	if err := ha.NS.Netlink().LinkAdd(v); err != nil {
		return nil, fmt.Errorf("veth %s: %w", spec.A.Ifname, err)
	}
	fail := func(err error) (*Link, error) {
		if lk, e := ha.NS.Netlink().LinkByName(spec.A.Ifname); e == nil {
			ha.NS.Netlink().LinkDel(lk) // takes the peer with it, wherever it is
		}
		return nil, err
	}
	peer, err := ha.NS.Netlink().LinkByName(tmp)
	if err == nil {
		err = ha.NS.Netlink().LinkSetNsFd(peer, hb.NS.Handle())
	}
	if err == nil {
		peer, err = hb.NS.Netlink().LinkByName(tmp)
	}
	if err == nil {
		err = hb.NS.Netlink().LinkSetName(peer, spec.B.Ifname)
	}
	if err != nil {
		return fail(fmt.Errorf("veth peer %s in %s: %w", spec.B.Ifname, hb.Name, err))
	}
	for i, ep := range []topo.Endpoint{spec.A, spec.B} {
		if err := configureInterface([]*Host{ha, hb}[i], ep, spec.MTU); err != nil {
			return fail(fmt.Errorf("%s end: %w", ep.Host, err))
		}
	}
	k := &kernelLink{hosts: [2]*Host{ha, hb}, names: [2]string{spec.A.Ifname, spec.B.Ifname}, log: l.log}
	for d, s := range []topo.Shape{spec.AB, spec.BA} {
		if err := k.setRate(d, s.Rate); err != nil {
			return fail(err)
		}
	}
	return &Link{Spec: spec, Offload: true, shape: [2]topo.Shape{spec.AB, spec.BA}, kernel: k}, nil
}

// setRate puts a TBF of rate bit/s (0: none) on the sending end of direction d.
func (k *kernelLink) setRate(d int, rate uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rates[d] = rate
	if k.cut {
		return nil // Restore installs it
	}
	return k.apply(d)
}

// apply installs direction d's qdisc: TBF at its rate, none when unlimited, and while the link
// is cut a TBF with no queue at all, which drops every packet.
func (k *kernelLink) apply(d int) error {
	nl := k.hosts[d].NS.Netlink()
	link, err := nl.LinkByName(k.names[d])
	if err != nil {
		return fmt.Errorf("%s: %w", k.names[d], err)
	}
	attrs := netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
	rate := k.rates[d]
	if rate == 0 && !k.cut {
		err := nl.QdiscDel(&netlink.Tbf{QdiscAttrs: attrs})
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("qdisc of %s: %w", k.names[d], err)
		}
		return nil
	}
	bytesPerSec := max(rate/8, 1000)
	// A burst of 1 ms at the rate (at least 64 KiB, a TSO segment: TBF splits larger ones) and
	// a queue of 2 ms beyond it.
	burst := uint32(max(bytesPerSec/1000, 64<<10))
	limit := burst + uint32(bytesPerSec/500)
	if k.cut {
		limit = 0
	}
	q := &netlink.Tbf{QdiscAttrs: attrs, Rate: bytesPerSec, Limit: limit, Buffer: netlink.Xmittime(bytesPerSec, burst)}
	if err := nl.QdiscReplace(q); err != nil {
		return fmt.Errorf("tbf on %s: %w", k.names[d], err)
	}
	return nil
}

func (k *kernelLink) setCut(cut bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cut == cut {
		return
	}
	k.cut = cut
	for d := range 2 {
		if err := k.apply(d); err != nil {
			k.log.Error("link cut", "interface", k.names[d], "cut", cut, "err", err)
		}
	}
}

func (k *kernelLink) isCut() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cut
}

// stats reads direction d from the kernel: what the sending end transmitted, and what its
// qdisc dropped.
func (k *kernelLink) stats(d int) emu.Stats {
	var st emu.Stats
	nl := k.hosts[d].NS.Netlink()
	link, err := nl.LinkByName(k.names[d])
	if err != nil {
		return st
	}
	if s := link.Attrs().Statistics; s != nil {
		st.Packets, st.Bytes = s.TxPackets, s.TxBytes
	}
	qs, _ := nl.QdiscList(link)
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Attrs().Statistics != nil && q.Attrs().Statistics.Queue != nil {
			st.DropQueue += uint64(q.Attrs().Statistics.Queue.Drops)
		}
	}
	return st
}
