package mplb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"

	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/lb"
	"braid/internal/lb/xdp"
	"braid/internal/mptcp/pmnl"
)

// The MPLB paper's setup: a client with two links to the balancer, and backends that all hold
// the same virtual address, each on its own link from the balancer (the paper's backends shared
// one segment; one veth per backend is the same for MAC rewriting and keeps every backend's
// traffic countable).
var (
	MPLBVIP      = netip.MustParseAddr("10.100.0.1")
	MPLBClient   = [2]netip.Addr{netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("10.2.0.2")}
	mplbLBClient = [2]netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.2.0.1")}
)

// MPLBPort is the service port of the MPLB scenarios.
const MPLBPort = 80

// MPLBTopology is the client ("client", links c0 and c1 at clientRate, 0 for unlimited), the
// balancer ("lb", lc0 and lc1 toward the client, l<k> toward backend k) and n backends
// ("b<k>", eth0 10.3.<k>.2). All links are kernel veth pairs.
func MPLBTopology(n int, clientRate uint64) *topo.Topology {
	tp := &topo.Topology{Name: "mplb", Hosts: []topo.Host{
		{Name: "client", Routes: []topo.Route{{Dst: netip.PrefixFrom(MPLBVIP, 32), Via: mplbLBClient[0]}}},
		{Name: "lb", Forward: true},
	}}
	for i := 0; i < 2; i++ {
		s := topo.Shape{Rate: clientRate}
		tp.Links = append(tp.Links, topo.Link{Kernel: true, AB: s, BA: s,
			A: topo.Endpoint{Host: "client", Ifname: fmt.Sprintf("c%d", i), Addrs: []netip.Prefix{netip.PrefixFrom(MPLBClient[i], 24)}},
			B: topo.Endpoint{Host: "lb", Ifname: fmt.Sprintf("lc%d", i), Addrs: []netip.Prefix{netip.PrefixFrom(mplbLBClient[i], 24)}},
		})
	}
	for k := 0; k < n; k++ {
		name := fmt.Sprintf("b%d", k)
		gw := netip.AddrFrom4([4]byte{10, 3, byte(k), 1})
		tp.Hosts = append(tp.Hosts, topo.Host{Name: name, Routes: []topo.Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: gw}}})
		tp.Links = append(tp.Links, topo.Link{Kernel: true,
			A: topo.Endpoint{Host: "lb", Ifname: fmt.Sprintf("l%d", k), Addrs: []netip.Prefix{netip.PrefixFrom(gw, 24)}},
			B: topo.Endpoint{Host: name, Ifname: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 3, byte(k), 2}), 24)}},
		})
	}
	return tp
}

// MPLBPrepare finishes the topology: the VIP on every backend's loopback, and a routing table
// for the client's second address so that subflows from it leave through c1.
func MPLBPrepare(l *lab.Lab, n int) error {
	for k := 0; k < n; k++ {
		h := l.Host(fmt.Sprintf("b%d", k))
		nl := h.NS.Netlink()
		lo, err := nl.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("mplb: %s: %w", h.Name, err)
		}
		if err := nl.LinkSetUp(lo); err != nil {
			return fmt.Errorf("mplb: %s: lo up: %w", h.Name, err)
		}
		if err := nl.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: MPLBVIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return fmt.Errorf("mplb: %s: VIP on lo: %w", h.Name, err)
		}
	}
	c := l.Host("client")
	nl := c.NS.Netlink()
	c1, err := nl.LinkByName("c1")
	if err != nil {
		return fmt.Errorf("mplb: client: %w", err)
	}
	const table = 102
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: c1.Attrs().Index, Dst: &net.IPNet{IP: MPLBVIP.AsSlice(), Mask: net.CIDRMask(32, 32)},
		Gw: mplbLBClient[1].AsSlice(), Table: table}); err != nil {
		return fmt.Errorf("mplb: client: route in table %d: %w", table, err)
	}
	r := netlink.NewRule()
	r.Src = &net.IPNet{IP: MPLBClient[1].AsSlice(), Mask: net.CIDRMask(32, 32)}
	r.Table = table
	if err := nl.RuleAdd(r); err != nil {
		return fmt.Errorf("mplb: client: rule: %w", err)
	}
	return nil
}

// MPLBEndpoint makes the client's kernel path manager open a second subflow from its second
// address on every MPTCP connection, the existing ones too.
func MPLBEndpoint(ctx context.Context, l *lab.Lab) error {
	c := l.Host("client")
	nl := c.NS.Netlink()
	c1, err := nl.LinkByName("c1")
	if err != nil {
		return err
	}
	pm, err := pmnl.Dial(pmnl.Options{NetNS: c.NS.Handle()})
	if err != nil {
		return err
	}
	defer pm.Close()
	return pm.AddEndpoint(ctx, pmnl.Addr{ID: 2, Addr: MPLBClient[1], Flags: pmnl.FlagSubflow, IfIndex: int32(c1.Attrs().Index)})
}

// MPLBBalancer is braid lb running in the "lb" host of an MPLB lab.
type MPLBBalancer struct {
	Plane *xdp.Dataplane
	LB    *lb.LB
	stop  context.CancelFunc
	done  chan struct{}
}

// MPLBBackendSpec returns the backend spec of backend k: its MAC, and the balancer's interface
// toward it.
func MPLBBackendSpec(l *lab.Lab, k int, weight uint32) (lb.BackendSpec, error) {
	b := l.Host(fmt.Sprintf("b%d", k))
	eth, err := b.NS.Netlink().LinkByName("eth0")
	if err != nil {
		return lb.BackendSpec{}, err
	}
	out, err := l.Host("lb").NS.Netlink().LinkByName(fmt.Sprintf("l%d", k))
	if err != nil {
		return lb.BackendSpec{}, err
	}
	return lb.BackendSpec{Name: b.Name, Weight: weight,
		Target: xdp.Backend{MAC: eth.Attrs().HardwareAddr, IfIndex: out.Attrs().Index, Addr: mplbBackendAddr(k)}}, nil
}

func mplbBackendAddr(k int) netip.Addr { return netip.AddrFrom4([4]byte{10, 3, byte(k), 2}) }

// MPLBDecap attaches d's decapsulation program to the interface of backends 0..n-1 (the lab's
// kernels have no IP-in-IP device): it strips the outer header of what the balancer sends in
// ipip mode, and the backend's stack sees the client's packet to the VIP.
func MPLBDecap(l *lab.Lab, n int, d *xdp.Dataplane) error {
	for k := 0; k < n; k++ {
		h := l.Host(fmt.Sprintf("b%d", k))
		eth, err := h.NS.Netlink().LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("mplb: %s: %w", h.Name, err)
		}
		if err := h.NS.Do(func() error { return d.AttachDecap(eth.Attrs().Index, xdp.AttachGeneric) }); err != nil {
			return fmt.Errorf("mplb: %s: %w", h.Name, err)
		}
	}
	return nil
}

// MPLBEncapSource is the balancer's source address of encapsulated packets.
var MPLBEncapSource = netip.MustParseAddr("10.3.0.1")

// StartMPLBBalancer loads the XDP program, attaches it to the balancer's client-facing links
// (generic XDP: redirects between veths then need nothing on the receiving side) and runs the
// control plane with backends 0..n-1 of weight 1. cfg sets the data plane's behaviour (Aware,
// HashAddrs); its SrcMAC is filled in. adjust, if any, changes each backend's spec.
func StartMPLBBalancer(l *lab.Lab, n int, cfg xdp.Config, adjust ...func(k int, s *lb.BackendSpec)) (*MPLBBalancer, error) {
	h := l.Host("lb")
	d, err := xdp.Load(xdp.Options{Conns: 1 << 16, Tokens: 1 << 14})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*MPLBBalancer, error) {
		d.Close()
		return nil, err
	}
	var specs []lb.BackendSpec
	for k := 0; k < n; k++ {
		s, err := MPLBBackendSpec(l, k, 1)
		if err != nil {
			return fail(err)
		}
		for _, f := range adjust {
			f(k, &s)
		}
		specs = append(specs, s)
	}
	first, err := h.NS.Netlink().LinkByName(fmt.Sprintf("l%d", 0))
	if err != nil {
		return fail(err)
	}
	cfg.SrcMAC = first.Attrs().HardwareAddr
	if !cfg.Src4.IsValid() {
		cfg.Src4 = MPLBEncapSource
	}
	ctl, err := lb.New(d, lb.Options{Services: []netip.AddrPort{netip.AddrPortFrom(MPLBVIP, MPLBPort)}, Plane: cfg}, specs)
	if err != nil {
		return fail(err)
	}
	for i := 0; i < 2; i++ {
		lk, err := h.NS.Netlink().LinkByName(fmt.Sprintf("lc%d", i))
		if err != nil {
			return fail(err)
		}
		// bpf_link_create resolves the interface in the calling thread's namespace.
		if err := h.NS.Do(func() error { return d.Attach(lk.Attrs().Index, xdp.AttachGeneric) }); err != nil {
			return fail(err)
		}
	}
	return &MPLBBalancer{Plane: d, LB: ctl}, nil
}

// Close detaches the program and frees its maps.
func (b *MPLBBalancer) Close() error { return b.Plane.Close() }

// MPLBServers are the backends' servers: each accepts MPTCP connections on VIP:port and answers
// every byte it reads with its own backend number, so a client learns where it landed.
type MPLBServers struct {
	mu    sync.Mutex
	conns [][]net.Conn // accepted, per backend
	lns   []net.Listener
	wg    sync.WaitGroup
}

// StartMPLBServers starts a server in each of backends 0..n-1.
func StartMPLBServers(l *lab.Lab, n int) (*MPLBServers, error) {
	s := &MPLBServers{conns: make([][]net.Conn, n)}
	for k := 0; k < n; k++ {
		var ln net.Listener
		err := l.Host(fmt.Sprintf("b%d", k)).NS.Do(func() error {
			var lc net.ListenConfig
			lc.SetMultipathTCP(true)
			var err error
			ln, err = lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(MPLBVIP, MPLBPort).String())
			return err
		})
		if err != nil {
			s.Close()
			return nil, err
		}
		s.lns = append(s.lns, ln)
		s.wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				s.mu.Lock()
				s.conns[k] = append(s.conns[k], c)
				s.mu.Unlock()
				s.wg.Go(func() { serveBackendNumber(c, byte(k)) })
			}
		})
	}
	return s, nil
}

func serveBackendNumber(c net.Conn, k byte) {
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if buf[0] == 'D' && n >= 9 {
				// "D" + 8-byte size: send that many bytes (a download), then the number.
				size := binary.BigEndian.Uint64(buf[1:9])
				if err := sendBytes(c, size, buf); err != nil {
					return
				}
			}
			if _, err := c.Write([]byte{k}); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func sendBytes(w io.Writer, size uint64, buf []byte) error {
	for i := range buf {
		buf[i] = byte(i)
	}
	for size > 0 {
		n := min(uint64(len(buf)), size)
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		size -= n
	}
	return nil
}

// Conns returns the connections backend k accepted.
func (s *MPLBServers) Conns(k int) []net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]net.Conn(nil), s.conns[k]...)
}

// Close stops the servers and closes their connections.
func (s *MPLBServers) Close() {
	for _, ln := range s.lns {
		ln.Close()
	}
	s.mu.Lock()
	for _, cs := range s.conns {
		for _, c := range cs {
			c.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// MPLBDial opens an MPTCP connection from the client to the VIP.
func MPLBDial(ctx context.Context, l *lab.Lab) (*net.TCPConn, error) {
	var c net.Conn
	err := l.Host("client").NS.Spawn(func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(MPLBClient[0], 0))}
		d.SetMultipathTCP(true)
		var err error
		c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(MPLBVIP, MPLBPort).String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// MPLBAsk sends one byte and returns the backend number the server answers with.
func MPLBAsk(c net.Conn) (int, error) {
	if _, err := c.Write([]byte{'?'}); err != nil {
		return -1, err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return -1, err
	}
	return int(b[0]), nil
}

// MPLBDownload asks for size bytes, reads them and the backend number; it returns the number.
func MPLBDownload(c net.Conn, size uint64) (int, error) {
	req := make([]byte, 9)
	req[0] = 'D'
	binary.BigEndian.PutUint64(req[1:], size)
	if _, err := c.Write(req); err != nil {
		return -1, err
	}
	if _, err := io.CopyN(io.Discard, c, int64(size)); err != nil {
		return -1, err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return -1, err
	}
	return int(b[0]), nil
}

// IsReset reports whether err is a connection reset.
func IsReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// MPLBStatelessPort is backend k's own port on the VIP in the stateless mode.
func MPLBStatelessPort(k int) uint16 { return uint16(5000 + k) }

// MPLBStateless prepares the stateless mode: every backend refuses joins to the VIP's service
// port (net.mptcp.allow_join_initial_addr_port = 0, so its SYN/ACK carries the C flag) and
// announces the VIP with its own port (an in-kernel PM 'signal' endpoint, which also listens
// there); the client accepts one announced address per connection.
func MPLBStateless(ctx context.Context, l *lab.Lab, n int) error {
	for k := 0; k < n; k++ {
		h := l.Host(fmt.Sprintf("b%d", k))
		if err := h.NS.Sysctl("mptcp/allow_join_initial_addr_port", "0"); err != nil {
			return err
		}
		lo, err := h.NS.Netlink().LinkByName("lo")
		if err != nil {
			return err
		}
		pm, err := pmnl.Dial(pmnl.Options{NetNS: h.NS.Handle()})
		if err != nil {
			return err
		}
		err = pm.AddEndpoint(ctx, pmnl.Addr{ID: 1, Addr: MPLBVIP, Port: MPLBStatelessPort(k), Flags: pmnl.FlagSignal, IfIndex: int32(lo.Attrs().Index)})
		pm.Close()
		if err != nil {
			return fmt.Errorf("mplb: %s: signal endpoint: %w", h.Name, err)
		}
	}
	pm, err := pmnl.Dial(pmnl.Options{NetNS: l.Host("client").NS.Handle()})
	if err != nil {
		return err
	}
	defer pm.Close()
	return pm.SetLimits(ctx, pmnl.Limits{Subflows: 2, AddAddrAccepted: 1})
}
