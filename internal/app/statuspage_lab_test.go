package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
	"braid/internal/lb"
	"braid/internal/lisp/mapserver"
	"braid/internal/metrics"
	"braid/internal/proxy"
	"braid/internal/tunnel/session"
)

// roleSource is a made-up status of a role, whose counters grow by one step on every read.
type roleSource struct {
	mu  sync.Mutex
	n   uint64
	doc func(n uint64) any
}

func (s *roleSource) WriteMetrics(*metrics.Writer) {}

func (s *roleSource) StatusJSON() any {
	s.mu.Lock()
	s.n++
	n := s.n
	s.mu.Unlock()
	return s.doc(n)
}

// roleSources are the other roles the page draws: a proxy with one connection of two subflows
// carrying 6:4, a balancer with two backends carrying 1:3, a map server whose accepted
// registrations grow.
func roleSources() map[string]*roleSource {
	ap := netip.MustParseAddrPort
	return map[string]*roleSource{
		"proxy": {doc: func(n uint64) any {
			st := proxy.Status{Uptime: time.Duration(n) * time.Second, Tenants: []proxy.TenantStatus{{Name: "t1", Out: n, Active: 1, BytesUp: 1000 * n,
				PoolReady: map[string]int{"p1": 2}, Refused: map[string]uint64{"acl": 1}}},
				Connections: []proxy.ConnStatus{{ID: 7, Tenant: "t1", Role: "client", Peer: "p1", Src: ap("10.0.0.2:40000"), Dst: ap("192.0.2.1:443"),
					Age: time.Duration(n) * time.Second, BytesUp: 1_000_000 * n, Down: 100_000 * n, MPTCP: true, Subflows: []proxy.SubflowStatus{
						{Local: ap("10.1.0.1:40000"), Remote: ap("10.3.0.1:4780"), RTT: 5 * time.Millisecond, BytesSent: 600_000 * n},
						{Local: ap("10.2.0.1:40001"), Remote: ap("10.3.0.1:4780"), RTT: 30 * time.Millisecond, BytesSent: 400_000 * n},
					}}}}
			return struct {
				Role  string        `json:"role"`
				Proxy *proxy.Status `json:"proxy"`
			}{"proxy", &st}
		}},
		"lb": {doc: func(n uint64) any {
			return lb.Status{Role: "lb", Services: []netip.AddrPort{ap("10.100.0.1:80")}, Mode: "mac", Aware: true, Counters: map[string]uint64{"packets": 4 * n},
				Backends: []lb.BackendStatus{
					{Name: "b1", Index: 0, Weight: 1, State: "active", Health: "up", Flows: 2, Conns: n, Packets: 1000 * n, Bytes: 1_000_000 * n},
					{Name: "b2", Index: 1, Weight: 3, State: "active", Health: "up", Flows: 6, Conns: 3 * n, Packets: 3000 * n, Bytes: 3_000_000 * n},
				}}
		}},
		"mapserver": {doc: func(n uint64) any {
			return mapserverStatus{Role: "mapserver", Counters: map[string]uint64{"registrations_accepted": n, "registrations_refused": 0},
				Registrations: []mapserver.Registration{{Site: "s1", Prefix: netip.MustParsePrefix("10.1.0.0/16"), ETR: "10.0.0.1", TTL: 3,
					Locators: []mapserver.LocatorView{{Address: netip.MustParseAddr("10.0.0.1"), Priority: 1, Weight: 100, Reachable: true}}}}}
		}},
	}
}

// pageSnap is what testdata/statuspage.py reads from the page: window.braid's charts and
// series, each canvas's point count and ink, and every URL the page loaded.
type pageSnap struct {
	Samples, Errors int
	Role            string
	Charts          map[string]struct {
		Title, Unit string
		Lines       []struct{ Name, Key string }
	}
	Series   map[string][][2]float64
	Canvases []struct {
		ID     string
		Points int
		Width  int
		Ink    int
	}
	Resources []string
	Title     string
}

// sumLast is the sum over the lines of chart id of each line's value at the latest sample,
// and its largest such sum over the last n samples.
func (s *pageSnap) peakSum(id string, n int) float64 {
	c, ok := s.Charts[id]
	if !ok {
		return -1
	}
	best := 0.0
	for back := 1; back <= n; back++ {
		sum := 0.0
		for _, l := range c.Lines {
			pts := s.Series[l.Key]
			if len(pts) >= back {
				sum += pts[len(pts)-back][1]
			}
		}
		best = max(best, sum)
	}
	return best
}

func (s *pageSnap) points(id string) int {
	n := 0
	for _, l := range s.Charts[id].Lines {
		n += len(s.Series[l.Key])
	}
	return n
}

// The tunnel's live status page in a real browser: headless Chromium (Debian's), driven by
// Selenium, opens the page a tunnel serves at its metrics address in a lab with two paths
// between two sites. The page loads with no console error and no request outside its origin,
// draws a rate, RTT, loss and state chart for each path, and its rate chart moves with
// traffic: idle it plots the probes' trickle, then with 20 Mbit/s of UDP through the tunnel
// the plotted sending rate summed over the paths reaches at least half of that.
func TestStatusPageBrowser(t *testing.T) {
	labtest.Require(t)
	chromium, ok1 := labtest.Tool(t, "chromium")
	driver, ok2 := labtest.Tool(t, "chromedriver")
	python, err := exec.LookPath("/usr/bin/python3")
	if err == nil {
		if out, perr := exec.Command(python, "-c", "import selenium").CombinedOutput(); perr != nil {
			err = fmt.Errorf("%v: %s", perr, strings.TrimSpace(string(out)))
		}
	}
	if err != nil && os.Getenv("BRAID_LAB_REQUIRED") == "1" {
		t.Fatalf("BRAID_LAB_REQUIRED=1 but Debian's python3 with selenium cannot run (scripts/deps.sh installs python3-selenium): %v", err)
	}
	if !ok1 || !ok2 || err != nil {
		labtest.Skip(t, "the browser test needs chromium, chromium-driver and python3-selenium (scripts/deps.sh installs them)")
	}
	script, _ := filepath.Abs("testdata/statuspage.py")

	tp := &topo.Topology{Name: "page", Hosts: []topo.Host{{Name: "a"}, {Name: "b"}}}
	for i := range 2 {
		tp.Links = append(tp.Links, topo.Link{
			A:  topo.Endpoint{Host: "a", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.1/24", i))}},
			B:  topo.Endpoint{Host: "b", Addrs: []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.9.%d.2/24", i))}},
			AB: topo.Shape{Delay: 2 * time.Millisecond}, BA: topo.Shape{Delay: 2 * time.Millisecond},
		})
	}
	l := labtest.Up(t, tp)
	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	dir := t.TempDir()
	var keys [2]session.PrivateKey
	for i := range keys {
		keys[i], _ = session.GenerateKey()
	}
	hosts := []string{"a", "b"}
	logs := make([]*strings.Builder, 2)
	for side, h := range hosts {
		var b strings.Builder
		fmt.Fprintf(&b, "[tunnel]\nprivate_key = %q\ninterface = \"braid0\"\naddress = [\"10.255.0.%d/24\"]\nmetrics = \"127.0.0.1:9473\"\n", keys[side].String(), side+1)
		for i := range 2 {
			fmt.Fprintf(&b, "[[tunnel.uplink]]\nname = \"up%d\"\ninterface = \"eth%d\"\naddress = \"10.9.%d.%d\"\n", i, i, i, side+1)
		}
		fmt.Fprintf(&b, "[[tunnel.peer]]\nname = \"other\"\npublic_key = %q\nroutes = [\"10.255.0.%d/32\"]\n", keys[1-side].Public().String(), 2-side)
		for i := range 2 {
			fmt.Fprintf(&b, "[[tunnel.peer.path]]\nuplink = \"up%d\"\nremote = \"10.9.%d.%d:4754\"\n", i, i, 2-side)
		}
		file := filepath.Join(dir, h+".toml")
		if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self, "tunnel", "--config", file)
		logs[side] = &strings.Builder{}
		cmd.Stderr = &lockedWriter{w: logs[side]}
		if err := l.Host(h).Start(cmd); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Both paths up before the page opens, so that its idle samples are idle.
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ := l.Host("a").Run(ctx, self, "status", "--addr", "127.0.0.1:9473", "--json")
		var st statusReport
		up := 0
		if json.Unmarshal(out, &st) == nil && st.Tunnel != nil && len(st.Tunnel.Peers) == 1 && st.Tunnel.Peers[0].Session {
			for _, pa := range st.Tunnel.Peers[0].Paths {
				if pa.State == "up" {
					up++
				}
			}
		}
		if up == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tunnel a has not its session and two paths up after 15 s:\n%s\nlog a:\n%s\nlog b:\n%s", out, logs[0], logs[1])
		}
		time.Sleep(200 * time.Millisecond)
	}

	serve := exec.Command(self, "traffic", "serve", "--listen", "10.255.0.2:5201")
	if err := l.Host("b").Start(serve); err != nil {
		t.Fatal(err)
	}
	const trafficFor = 8 * time.Second

	// The other roles' pages, served in a's namespace from made-up documents of their types.
	roles := roleSources()
	roleURLs := map[string]string{}
	args := []string{script, "http://127.0.0.1:9473/", driver, chromium, fmt.Sprint((trafficFor - 2*time.Second).Seconds())}
	for _, role := range []string{"proxy", "lb", "mapserver"} {
		ln, err := l.Host("a").Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := metrics.Serve(ln, roles[role])
		defer srv.Close()
		u := "http://" + srv.Addr() + "/"
		roleURLs[u] = role
		args = append(args, u)
	}
	browser := exec.CommandContext(ctx, python, args...)
	stdin, _ := browser.StdinPipe()
	stdout, _ := browser.StdoutPipe()
	var stderr strings.Builder
	browser.Stderr = &lockedWriter{w: &stderr}
	start := time.Now()
	if err := l.Host("a").Start(browser); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 16<<20)
	next := func(phase string, v any) {
		t.Helper()
		if !lines.Scan() {
			browser.Wait()
			t.Fatalf("the browser script ended before its %q report:\n%s", phase, stderr.String())
		}
		var head struct{ Phase string }
		if err := json.Unmarshal(lines.Bytes(), &head); err != nil || head.Phase != phase {
			t.Fatalf("browser script: want phase %q, got %.300s (%v)", phase, lines.Text(), err)
		}
		if err := json.Unmarshal(lines.Bytes(), v); err != nil {
			t.Fatalf("browser script %s report: %v", phase, err)
		}
	}
	var idle, busy struct{ Snap pageSnap }
	next("idle", &idle)
	t.Logf("page up in the browser after %.1f s: %d samples, %d charts", time.Since(start).Seconds(), idle.Snap.Samples, len(idle.Snap.Charts))

	udp := exec.CommandContext(ctx, self, "traffic", "udp", "10.255.0.2", "--rate", "20mbit", "--duration", trafficFor.String())
	var udpOut strings.Builder
	udp.Stdout, udp.Stderr = &lockedWriter{w: &udpOut}, &lockedWriter{w: &udpOut}
	if err := l.Host("a").Start(udp); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "go\n")
	next("traffic", &busy)
	pages := map[string]*pageSnap{}
	for range roleURLs {
		var r struct {
			URL  string
			Snap pageSnap
		}
		next("role", &r)
		pages[roleURLs[r.URL]] = &r.Snap
	}
	var log struct {
		Entries []struct{ Level, Message, Source string }
	}
	next("log", &log)
	stdin.Close()
	browser.Wait()
	udp.Wait()

	// The page: the tunnel's, drawn from its status document without a failed poll.
	s0, s1 := &idle.Snap, &busy.Snap
	if s1.Role != "tunnel" || s1.Title != "braid tunnel" {
		t.Errorf("the page shows role %q (title %q), want the tunnel", s1.Role, s1.Title)
	}
	if s1.Errors != 0 {
		t.Errorf("%d polls of status.json failed", s1.Errors)
	}
	for _, e := range log.Entries {
		if e.Level == "SEVERE" || e.Level == "WARNING" {
			t.Errorf("browser console %s: %s (%s)", e.Level, e.Message, e.Source)
		}
	}
	for _, u := range s1.Resources {
		if !strings.HasPrefix(u, "http://127.0.0.1:9473/") {
			t.Errorf("the page loaded %s, outside its origin", u)
		}
	}
	// A chart per measure, with a line per path, each drawn on a canvas.
	for _, m := range []string{"tx", "rx", "rtt", "loss", "state"} {
		id := "chart-other-" + m
		c, ok := s1.Charts[id]
		if !ok || len(c.Lines) != 2 {
			t.Errorf("chart %s: present %v, %d lines; want one line per path (2)", id, ok, len(c.Lines))
			continue
		}
		var drawn bool
		for _, cv := range s1.Canvases {
			if cv.ID == id {
				// Ink: pixels of the paths' lines' colours.
				drawn = cv.Width > 0 && cv.Points == s1.points(id) && cv.Points > 0 && cv.Ink > 0
			}
		}
		if !drawn {
			t.Errorf("chart %s: no canvas drawn with its %d points and the paths' lines", id, s1.points(id))
		}
	}
	// The rate chart moves with the traffic.
	idleRate, busyRate := s0.peakSum("chart-other-tx", 3), s1.peakSum("chart-other-tx", 4)
	t.Logf("plotted sending rate, summed over the paths: idle %.2f Mbit/s, with 20 Mbit/s of UDP %.2f Mbit/s; points %d -> %d; udp: %s",
		idleRate, busyRate, s0.points("chart-other-tx"), s1.points("chart-other-tx"), strings.TrimSpace(udpOut.String()))
	if idleRate < 0 || idleRate > 2 {
		t.Errorf("idle, the page plots %.2f Mbit/s sent, want at most 2 (probes only)", idleRate)
	}
	if busyRate < 10 || busyRate > 30 {
		t.Errorf("with 20 Mbit/s of UDP through the tunnel the page plots %.2f Mbit/s sent, want 10 to 30", busyRate)
	}
	if s1.points("chart-other-tx") <= s0.points("chart-other-tx") {
		t.Errorf("the rate chart did not grow: %d points, then %d", s0.points("chart-other-tx"), s1.points("chart-other-tx"))
	}
	for _, k := range []string{"tunnel/other/1/state", "tunnel/other/2/state"} {
		if pts := s1.Series[k]; len(pts) == 0 || pts[len(pts)-1][1] != 1 {
			t.Errorf("series %s does not end up: %v", k, pts)
		}
	}
	checkRolePages(t, pages)
	if t.Failed() {
		t.Logf("browser stderr:\n%s\nlog a:\n%s", stderr.String(), logs[0])
	}
}

// checkRolePages judges the pages of the made-up roles: each shows its role, polled without
// error, and plots what its document says.
func checkRolePages(t *testing.T, pages map[string]*pageSnap) {
	t.Helper()
	for _, role := range []string{"proxy", "lb", "mapserver"} {
		p := pages[role]
		if p == nil || p.Role != role || p.Samples < 3 || p.Errors != 0 {
			t.Errorf("%s page: %+v; want its role, 3 polls or more, no failed poll", role, p)
			delete(pages, role)
		}
	}
	last := func(p *pageSnap, key string) float64 {
		if p == nil {
			return -1
		}
		if pts := p.Series[key]; len(pts) > 0 {
			return pts[len(pts)-1][1]
		}
		return -1
	}
	if p := pages["proxy"]; p != nil {
		if c := p.Charts["chart-proxy-subflows"]; len(c.Lines) != 2 || p.points("chart-proxy-subflows") < 4 {
			t.Errorf("proxy page: subflow chart with %d lines and %d points; want 2 lines, 2 points each or more", len(c.Lines), p.points("chart-proxy-subflows"))
		} else if a, b := last(p, c.Lines[0].Key), last(p, c.Lines[1].Key); b <= 0 || a/b < 1.4 || a/b > 1.6 {
			t.Errorf("proxy page: subflows plotted at %.2f and %.2f Mbit/s, want 6:4", a, b)
		}
		if last(p, "proxy/connections") != 1 || last(p, "proxy/subflows") != 2 {
			t.Errorf("proxy page: %v connections, %v subflows plotted; want 1 and 2", last(p, "proxy/connections"), last(p, "proxy/subflows"))
		}
	}
	if p := pages["lb"]; p != nil {
		a, b := last(p, "lb/b1/share"), last(p, "lb/b2/share")
		if len(p.Charts["chart-lb-share"].Lines) != 2 || a < 24 || a > 26 || b < 74 || b > 76 {
			t.Errorf("lb page: traffic shares plotted %.1f %% and %.1f %%, want 25 and 75", a, b)
		}
	}
	if p := pages["mapserver"]; p != nil {
		v := last(p, "mapserver/counter/registrations_accepted")
		t.Logf("role pages: proxy subflows %.2f and %.2f Mbit/s, lb shares %.1f %% and %.1f %%, mapserver %.2f registrations/s",
			last(pages["proxy"], "proxy/c7/10.1.0.1:40000/10.3.0.1:4780/rate"), last(pages["proxy"], "proxy/c7/10.2.0.1:40001/10.3.0.1:4780/rate"),
			last(pages["lb"], "lb/b1/share"), last(pages["lb"], "lb/b2/share"), v)
		if v <= 0 {
			t.Errorf("mapserver page: accepted registrations plotted at %.2f/s, want a positive rate", v)
		}
	}
}
