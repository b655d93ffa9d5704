package emu

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// vnetHdrLen is the size of struct virtio_net_hdr that TUN puts before each packet with
// IFF_VNET_HDR.
const vnetHdrLen = 10

// virtio_net_hdr gso_type values (linux/virtio_net.h).
const (
	gsoNone  = 0
	gsoTCPv4 = 1
	gsoUDP   = 3
	gsoTCPv6 = 4
	gsoUDPL4 = 5
	gsoECN   = 0x80
)

// OpenTUN creates a TUN device called name in the calling thread's network namespace (call it
// from netns.NS.Do). With offload, packets carry a virtio_net_hdr and the kernel hands over and
// accepts TCP super-packets, and UDP ones where it can, of up to 64 KiB with partial checksums.
func OpenTUN(name string, offload bool) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("emu: open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("emu: tun name %q: %w", name, err)
	}
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if offload {
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("emu: TUNSETIFF %s: %w", name, err)
	}
	if offload {
		// UDP segmentation offload too (Linux 6.2) where the kernel has it, so that a train of
		// UDP datagrams sent with UDP_SEGMENT crosses the link whole, as a TCP super-packet does;
		// without it the kernel splits the train before the link.
		tso := unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tso|unix.TUN_F_USO4|unix.TUN_F_USO6); err != nil {
			if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tso); err != nil {
				unix.Close(fd)
				return nil, fmt.Errorf("emu: TUNSETOFFLOAD %s: %w", name, err)
			}
		}
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("emu: %w", err)
	}
	return os.NewFile(uintptr(fd), "tun:"+name), nil
}

// wireSize returns the IP bytes a packet puts on the wire and the number of segments it is made
// of. With a virtio_net_hdr in front, a GSO super-packet counts as the segments the kernel would
// have sent: its payload plus one copy of the headers per segment.
func wireSize(b []byte, vnet bool) (bytes, segs int) {
	if !vnet {
		return len(b), 1
	}
	if len(b) < vnetHdrLen {
		return 0, 1
	}
	hdr, pkt := b[:vnetHdrLen], b[vnetHdrLen:]
	gsoType := hdr[1] &^ gsoECN
	gsoSize := int(binary.NativeEndian.Uint16(hdr[4:6]))
	if gsoType == gsoNone || gsoSize == 0 {
		return len(pkt), 1
	}
	hl := headerLen(pkt, gsoType)
	if hl <= 0 || hl >= len(pkt) {
		return len(pkt), 1
	}
	payload := len(pkt) - hl
	segs = (payload + gsoSize - 1) / gsoSize
	return payload + segs*hl, segs
}

// headerLen returns the length of the IP and transport headers of pkt, or 0 if it cannot tell.
func headerLen(pkt []byte, gsoType byte) int {
	if len(pkt) < 20 {
		return 0
	}
	var ipLen int
	switch pkt[0] >> 4 {
	case 4:
		ipLen = int(pkt[0]&0x0f) * 4
	case 6:
		ipLen = 40
	default:
		return 0
	}
	switch gsoType {
	case gsoUDP, gsoUDPL4:
		return ipLen + 8
	}
	if len(pkt) < ipLen+20 {
		return 0
	}
	return ipLen + int(pkt[ipLen+12]>>4)*4
}
