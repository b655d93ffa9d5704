package mplb

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/mptcp/pmnl"
)

// A fleet of balancers behind a router: the client's two links go to the router ("rt"), which
// reaches instance i ("lb<i>", eth0 10.4.<i>.2) over its own link and backend k ("b<k>", eth0
// 10.3.<k>.2) over another. The router runs BIRD; every instance announces the VIP to it over
// BGP (braid lb's [lb.bgp]), and BIRD installs one multipath route to the VIP with every
// instance that announces it as a next hop; the kernel spreads flows over them by a hash of
// the 5-tuple (fib_multipath_hash_policy = 1). Instances forward in ipip mode to the backends'
// addresses through the router, backends answer the client directly (direct server return).
const (
	FleetRouterAS   = 65000
	FleetInstanceAS = 65001
	fleetHashSeed   = 7
)

// FleetInstanceAddr is instance i's address (its BGP router id and next hop); the router's
// end of the link is FleetRouterAddr(i).
func FleetInstanceAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 4, byte(i), 2}) }

// FleetRouterAddr is the router's address toward instance i.
func FleetRouterAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 4, byte(i), 1}) }

// MPLBFleetTopology is the fleet: client, router, instances lb0..lb<instances-1>, backends
// b0..b<backends-1>. clientRate shapes the client's links (0: unlimited).
func MPLBFleetTopology(instances, backends int, clientRate uint64) *topo.Topology {
	tp := &topo.Topology{Name: "fleet", Hosts: []topo.Host{
		{Name: "client", Routes: []topo.Route{{Dst: netip.PrefixFrom(MPLBVIP, 32), Via: mplbLBClient[0]}}},
		{Name: "rt", Forward: true},
	}}
	for i := 0; i < 2; i++ {
		// The client's links go through the lab's emulator (TUN devices), not veth pairs: a veth
		// hands the router the sender's socket hash, which the router's ECMP would use instead
		// of hashing the headers, and which the client's kernel changes when a SYN times out.
		// A router fed by a wire hashes the headers: a retransmission takes its flow's path.
		s := topo.Shape{Rate: clientRate}
		tp.Links = append(tp.Links, topo.Link{AB: s, BA: s,
			A: topo.Endpoint{Host: "client", Ifname: fmt.Sprintf("c%d", i), Addrs: []netip.Prefix{netip.PrefixFrom(MPLBClient[i], 24)}},
			B: topo.Endpoint{Host: "rt", Ifname: fmt.Sprintf("rc%d", i), Addrs: []netip.Prefix{netip.PrefixFrom(mplbLBClient[i], 24)}},
		})
	}
	for i := 0; i < instances; i++ {
		name := fmt.Sprintf("lb%d", i)
		tp.Hosts = append(tp.Hosts, topo.Host{Name: name, Routes: []topo.Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: FleetRouterAddr(i)}}})
		tp.Links = append(tp.Links, topo.Link{Kernel: true,
			A: topo.Endpoint{Host: "rt", Ifname: fmt.Sprintf("rl%d", i), Addrs: []netip.Prefix{netip.PrefixFrom(FleetRouterAddr(i), 24)}},
			B: topo.Endpoint{Host: name, Ifname: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(FleetInstanceAddr(i), 24)}},
		})
	}
	for k := 0; k < backends; k++ {
		name := fmt.Sprintf("b%d", k)
		gw := netip.AddrFrom4([4]byte{10, 3, byte(k), 1})
		tp.Hosts = append(tp.Hosts, topo.Host{Name: name, Routes: []topo.Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: gw}}})
		tp.Links = append(tp.Links, topo.Link{Kernel: true,
			A: topo.Endpoint{Host: "rt", Ifname: fmt.Sprintf("rb%d", k), Addrs: []netip.Prefix{netip.PrefixFrom(gw, 24)}},
			B: topo.Endpoint{Host: name, Ifname: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(mplbBackendAddr(k), 24)}},
		})
	}
	return tp
}

// Fleet runs the routing daemon and the balancer instances of a fleet lab.
type Fleet struct {
	l        *lab.Lab
	dir      string
	braid    []string // the command that runs braid (program and leading arguments)
	env      []string
	backends int
	// TokenMode leaves the backends' stateless ports out of the instances' configuration: the
	// instances then steer joins by the tokens each learned itself (set before StartInstance).
	TokenMode bool

	mu   sync.Mutex
	inst map[int]*FleetInstance
	bird *exec.Cmd
}

// FleetInstance is one running braid lb.
type FleetInstance struct {
	Index int
	Cmd   *exec.Cmd
	log   *bytes.Buffer
	done  chan struct{}
}

// Done is closed when the instance's process has exited.
func (fi *FleetInstance) Done() <-chan struct{} { return fi.done }

// Log returns what the instance wrote.
func (fi *FleetInstance) Log() string { return fi.log.String() }

// StartFleet prepares the router (ECMP over the 5-tuple, BIRD with a passive BGP session
// toward every instance; bird is the routing daemon's program) in dir. braid runs an instance
// ("braid" then "lb --config FILE"), with env added to its environment. backends is the
// number of backends in every instance's configuration; they use the stateless mode, and the
// caller prepares them (MPLBPrepare, MPLBStateless, MPLBDecap).
func StartFleet(l *lab.Lab, dir, bird string, braid []string, env []string, instances, backends int) (*Fleet, error) {
	f := &Fleet{l: l, dir: dir, braid: braid, env: env, backends: backends, inst: map[int]*FleetInstance{}}
	rt := l.Host("rt")
	if err := rt.NS.Sysctl("ipv4/fib_multipath_hash_policy", "1"); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	var conf strings.Builder
	fmt.Fprintf(&conf, `log "%s" all;
router id %s;
protocol device {}
protocol kernel {
	ipv4 { import none; export all; };
	merge paths on;
}
template bgp lbs {
	local as %d;
	passive on;
	ipv4 { import all; export none; };
}
`, filepath.Join(dir, "bird.log"), FleetRouterAddr(0), FleetRouterAS)
	for i := 0; i < instances; i++ {
		fmt.Fprintf(&conf, "protocol bgp lb%d from lbs { source address %s; neighbor %s as %d; }\n", i, FleetRouterAddr(i), FleetInstanceAddr(i), FleetInstanceAS)
	}
	cf := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(cf, []byte(conf.String()), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bird, "-f", "-c", cf, "-s", filepath.Join(dir, "bird.ctl"), "-P", filepath.Join(dir, "bird.pid"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := rt.Start(cmd); err != nil {
		return nil, err
	}
	f.bird = cmd
	// Started when its control socket exists; a configuration error ends it at once.
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := os.Stat(filepath.Join(dir, "bird.ctl")); err == nil {
			return f, nil
		}
		if cmd.Process.Signal(syscall.Signal(0)) != nil || time.Now().After(deadline) {
			return nil, fmt.Errorf("fleet: bird did not start: %s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BirdLog returns the routing daemon's log.
func (f *Fleet) BirdLog() string {
	b, _ := os.ReadFile(filepath.Join(f.dir, "bird.log"))
	return string(b)
}

// InstanceConfig is instance i's site file: the VIP's service, every backend in the ipip
// mode with its stateless port, the same hash seed everywhere (Maglev then places a flow the
// same way on every instance), and the BGP session to the router. drain is the time the
// instance keeps forwarding after withdrawing the VIP on SIGTERM.
func (f *Fleet) InstanceConfig(i int, drain time.Duration) (string, error) {
	rl, err := f.l.Host("rt").NS.Netlink().LinkByName(fmt.Sprintf("rl%d", i))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `[lb]
interface = "eth0"
attach = "generic"
mode = "ipip"
encap_source4 = "%s"
metrics = "%s"
hash_seed = %d
conn_table = 65536
embryonic_table = 16384
flood_rate = 1000
global_rate = 100
health_interval = "200ms"

[[lb.service]]
vip = "%s"

[lb.bgp]
local_as = %d
router_id = "%s"
hold_time = "3s"
drain = "%s"
[[lb.bgp.neighbor]]
address = "%s"
as = %d
`, FleetInstanceAddr(i), netip.AddrPortFrom(FleetInstanceAddr(i), 9476), fleetHashSeed, netip.AddrPortFrom(MPLBVIP, MPLBPort),
		FleetInstanceAS, FleetInstanceAddr(i), drain, FleetRouterAddr(i), FleetRouterAS)
	for k := 0; k < f.backends; k++ {
		// The router is the next hop toward every backend.
		fmt.Fprintf(&b, "\n[[lb.backend]]\nname = \"b%d\"\nmac = \"%s\"\naddress = \"%s\"\n", k, rl.Attrs().HardwareAddr, mplbBackendAddr(k))
		if !f.TokenMode {
			fmt.Fprintf(&b, "stateless_port = %d\n", MPLBStatelessPort(k))
		}
	}
	return b.String(), nil
}

// StartInstance starts braid lb in host lb<i>.
func (f *Fleet) StartInstance(i int, drain time.Duration) (*FleetInstance, error) {
	conf, err := f.InstanceConfig(i, drain)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(f.dir, fmt.Sprintf("lb%d.toml", i))
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	args := append(slices.Clone(f.braid[1:]), "lb", "--config", file)
	cmd := exec.Command(f.braid[0], args...)
	cmd.Env = append(os.Environ(), f.env...)
	fi := &FleetInstance{Index: i, Cmd: cmd, log: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &fleetLogWriter{b: fi.log}, &fleetLogWriter{b: fi.log}
	if err := f.l.Host(fmt.Sprintf("lb%d", i)).Start(cmd); err != nil {
		return nil, err
	}
	go func() {
		cmd.Wait()
		close(fi.done)
	}()
	f.mu.Lock()
	f.inst[i] = fi
	f.mu.Unlock()
	return fi, nil
}

type fleetLogWriter struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *fleetLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Kill kills instance i at once (SIGKILL): its program and its BGP session go with it.
func (f *Fleet) Kill(i int) error {
	f.mu.Lock()
	fi := f.inst[i]
	f.mu.Unlock()
	if fi == nil {
		return fmt.Errorf("fleet: no instance %d", i)
	}
	return fi.Cmd.Process.Signal(syscall.SIGKILL)
}

// Drain asks instance i to stop (SIGTERM): it withdraws the VIP, forwards for its drain
// time, then exits.
func (f *Fleet) Drain(i int) error {
	f.mu.Lock()
	fi := f.inst[i]
	f.mu.Unlock()
	if fi == nil {
		return fmt.Errorf("fleet: no instance %d", i)
	}
	return fi.Cmd.Process.Signal(syscall.SIGTERM)
}

// NextHops returns the next hops of the router's route to the VIP: the instances it spreads
// the VIP's traffic over.
func (f *Fleet) NextHops() ([]netip.Addr, error) {
	rs, err := f.l.Host("rt").NS.Netlink().RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Dst: &net.IPNet{IP: MPLBVIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}, netlink.RT_FILTER_DST)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, r := range rs {
		if a, ok := netip.AddrFromSlice(r.Gw); ok && r.Gw != nil {
			out = append(out, a.Unmap())
		}
		for _, nh := range r.MultiPath {
			if a, ok := netip.AddrFromSlice(nh.Gw); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out, nil
}

// WaitNextHops waits until the route to the VIP has exactly the instances want as next hops.
func (f *Fleet) WaitNextHops(ctx context.Context, want ...int) error {
	var w []netip.Addr
	for _, i := range want {
		w = append(w, FleetInstanceAddr(i))
	}
	slices.SortFunc(w, func(a, b netip.Addr) int { return a.Compare(b) })
	var got []netip.Addr
	for {
		var err error
		got, err = f.NextHops()
		if err == nil && slices.Equal(got, w) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: the route to the VIP goes via %v, want %v", got, w)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var viaRE = regexp.MustCompile(`via (\S+)`)

// InstanceOf returns the instance that the router sends a client's TCP packets from src to
// dst through, as its kernel computes it (ip route get, with the ports in the hash).
func (f *Fleet) InstanceOf(ctx context.Context, src, dst netip.AddrPort) (int, error) {
	out, err := f.l.Host("rt").Run(ctx, "ip", "route", "get", dst.Addr().String(), "from", src.Addr().String(), "iif", "rc0",
		"ipproto", "tcp", "sport", fmt.Sprint(src.Port()), "dport", fmt.Sprint(dst.Port()))
	if err != nil {
		return -1, fmt.Errorf("fleet: ip route get: %v: %s", err, out)
	}
	m := viaRE.FindSubmatch(out)
	if m == nil {
		return -1, fmt.Errorf("fleet: ip route get: no next hop in %q", out)
	}
	a, err := netip.ParseAddr(string(m[1]))
	if err != nil || !a.Is4() || a.As4()[0] != 10 || a.As4()[1] != 4 {
		return -1, fmt.Errorf("fleet: ip route get: next hop %q is no instance", m[1])
	}
	return int(a.As4()[2]), nil
}

// Counters returns instance i's data-plane counters (its /status).
func (f *Fleet) Counters(ctx context.Context, i int) (map[string]uint64, error) {
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	if err := fleetFetchJSON(ctx, f.l.Host("rt"), "http://"+netip.AddrPortFrom(FleetInstanceAddr(i), 9476).String()+"/status", &st); err != nil {
		return nil, err
	}
	return st.Counters, nil
}

// fleetFetchJSON GETs url from host h and decodes the JSON document into v.
func fleetFetchJSON(ctx context.Context, h *lab.Host, url string, v any) error {
	c := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return h.Dial(ctx, network, addr) }}}
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// MPLBFleetClientEndpoint makes the client open the subflow toward a backend's announced
// port (stateless mode) from its second address, over its second link: a fullmesh endpoint
// is used for announced addresses (a plain subflow endpoint would only join the VIP's
// service port, which the backends' C flag forbids).
func MPLBFleetClientEndpoint(ctx context.Context, l *lab.Lab) error {
	c := l.Host("client")
	c1, err := c.NS.Netlink().LinkByName("c1")
	if err != nil {
		return err
	}
	pm, err := pmnl.Dial(pmnl.Options{NetNS: c.NS.Handle()})
	if err != nil {
		return err
	}
	defer pm.Close()
	return pm.AddEndpoint(ctx, pmnl.Addr{ID: 2, Addr: MPLBClient[1], Flags: pmnl.FlagSubflow | pmnl.FlagFullmesh, IfIndex: int32(c1.Attrs().Index)})
}
