package tun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"braid/internal/wire/vnet"

	"golang.org/x/sys/unix"
)

// OpenOffload creates (or attaches to) the TUN interface name with offloads: every packet
// carries a virtio-net header, the kernel hands out TCP super-packets of up to 64 KiB (TSO,
// checksums left to the device) and takes them (GRO). ReadBatch splits what it reads into
// packets that need no offload; WriteBatch joins consecutive TCP segments before writing. One
// read or write then moves up to 64 segments, where a plain device moves one.
func OpenOffload(name string) (*Device, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("tun: open /dev/net/tun: %w", err)
	}
	fail := func(err error) (*Device, error) {
		unix.Close(fd)
		return nil, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fail(fmt.Errorf("tun: interface name %q: %w", name, err))
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fail(fmt.Errorf("tun: create %s: %w", name, err))
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, vnet.HdrLen); err != nil {
		return fail(fmt.Errorf("tun: virtio-net header size on %s: %w", name, err))
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6); err != nil {
		return fail(fmt.Errorf("tun: offloads on %s: %w", name, err))
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return fail(fmt.Errorf("tun: %w", err))
	}
	d := &Device{Name: ifr.Name(), file: os.NewFile(uintptr(fd), "tun:"+name)}
	d.offload, d.rbuf = true, make([]byte, vnet.HdrLen+65535)
	d.coalescers.New = func() any { return vnet.NewCoalescer(make([]byte, vnet.CoalescerBuffer)) }
	return d, nil
}

// offloadState is what a device opened with OpenOffload keeps.
type offloadState struct {
	offload    bool
	rbuf       []byte // ReadBatch's buffer: one super-packet (one reader at a time)
	wmu        sync.Mutex
	wbuf       []byte // Write's buffer, to put a header in front of one packet
	coalescers sync.Pool
	malformed  atomic.Uint64
	ir         idleReader
	closed     atomic.Bool
}

// ErrOffloadRead: Read was called on a device with offloads; use ReadBatch.
var ErrOffloadRead = errors.New("tun: a device with offloads is read with ReadBatch")

// ReadBatch reads into bufs[i][offset:] what the device has: one packet on a plain device, the
// segments of one super-packet on a device with offloads (at most len(bufs)); their lengths go
// into sizes. It returns how many; 0 with no error when the device handed out a packet it
// could not split (counted: Malformed). One goroutine reads at a time.
func (d *Device) ReadBatch(bufs [][]byte, offset int, sizes []int) (int, error) {
	if !d.offload {
		n, err := d.file.Read(bufs[0][offset:])
		if err != nil {
			return 0, err
		}
		sizes[0] = n
		return 1, nil
	}
	n, err := d.file.Read(d.rbuf)
	if err != nil {
		return 0, err
	}
	return d.split(n, bufs, offset, sizes)
}

// ReadBatchIdle is ReadBatch that, when the device has nothing to read, calls idle (at most
// once a call, in the calling goroutine) before it waits: a caller that gathers what it reads
// into larger sends (the xTR's trains) sends what it holds then, and not after every read.
// One goroutine reads at a time.
func (d *Device) ReadBatchIdle(bufs [][]byte, offset int, sizes []int, idle func()) (int, error) {
	buf := d.rbuf
	if !d.offload {
		buf = bufs[0][offset:]
	}
	n, err := d.readIdle(buf, idle)
	if err != nil {
		return 0, err
	}
	if !d.offload {
		sizes[0] = n
		return 1, nil
	}
	return d.split(n, bufs, offset, sizes)
}

// idleReader is ReadBatchIdle's read: its state and the method value, made once, so that a
// read allocates nothing.
type idleReader struct {
	raw  syscall.RawConn
	fn   func(fd uintptr) bool
	buf  []byte
	n    int
	err  error
	idle func()
}

func (d *Device) readIdle(buf []byte, idle func()) (int, error) {
	r := &d.ir
	if r.fn == nil {
		raw, err := d.file.SyscallConn()
		if err != nil {
			return 0, err
		}
		r.raw, r.fn = raw, r.read
	}
	r.buf, r.idle, r.n, r.err = buf, idle, 0, nil
	err := r.raw.Read(r.fn)
	r.buf, r.idle = nil, nil
	if err == nil {
		err = r.err
	}
	if err != nil {
		if d.closed.Load() {
			err = os.ErrClosed
		}
		return 0, &os.PathError{Op: "read", Path: d.file.Name(), Err: err}
	}
	return r.n, nil
}

func (r *idleReader) read(fd uintptr) bool {
	for {
		n, err := unix.Read(int(fd), r.buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// Readiness that comes while idle runs is not lost: the poller keeps it.
			if idle := r.idle; idle != nil {
				r.idle = nil
				idle()
			}
			return false
		case err != nil:
			r.err = err
		case n == 0:
			r.err = io.EOF
		}
		r.n = n
		return true
	}
}

// split splits the n bytes of d.rbuf (header and packet) into bufs.
func (d *Device) split(n int, bufs [][]byte, offset int, sizes []int) (int, error) {
	var h vnet.Hdr
	if _, err := h.Decode(d.rbuf[:n]); err != nil {
		d.malformed.Add(1)
		return 0, nil
	}
	k, err := vnet.Segment(h, d.rbuf[vnet.HdrLen:n], bufs, offset, sizes)
	if err != nil {
		d.malformed.Add(1)
		return 0, nil
	}
	return k, nil
}

// WriteBatch writes pkts in order; a device with offloads joins consecutive segments of a TCP
// flow into super-packets first. Safe for concurrent use. It returns the first error and
// still writes the rest.
func (d *Device) WriteBatch(pkts [][]byte) error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if !d.offload {
		for _, p := range pkts {
			_, err := d.file.Write(p)
			keep(err)
		}
		return first
	}
	c := d.coalescers.Get().(*vnet.Coalescer)
	defer d.coalescers.Put(c)
	for _, p := range pkts {
		if out := c.Add(p); out != nil {
			_, err := d.file.Write(out)
			keep(err)
		}
	}
	if out := c.Flush(); out != nil {
		_, err := d.file.Write(out)
		keep(err)
	}
	return first
}

// Malformed counts packets of a device with offloads that ReadBatch could not split.
func (d *Device) Malformed() uint64 { return d.malformed.Load() }
