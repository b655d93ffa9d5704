package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"braid/bench/internal/drive"
	"braid/internal/experiment/kit"
	"braid/internal/experiment/roles"
	"braid/internal/lab"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
	"braid/internal/tunnel/session"
)

const hubSites = 4

// hubTopology: a hub whose one uplink (10.20.0.1 on wan) is behind a router r, and hubSites
// sites, site i joined to r by a kernel veth (10.20.i.2 to r's 10.20.i.1). Unshaped: the
// hub's CPU is the limit. All sites reach the hub at one address and port, as a hub's sites
// do.
func hubTopology() *topo.Topology {
	pf, ad := netip.MustParsePrefix, netip.MustParseAddr
	tp := &topo.Topology{Name: "tunhub", Hosts: []topo.Host{
		{Name: "hub", Routes: []topo.Route{{Dst: pf("10.20.0.0/16"), Via: ad("10.20.0.2")}}},
		{Name: "r", Forward: true}}}
	tp.Links = append(tp.Links, topo.Link{Name: "r-hub", Kernel: true,
		A: topo.Endpoint{Host: "r", Addrs: []netip.Prefix{pf("10.20.0.2/24")}},
		B: topo.Endpoint{Host: "hub", Ifname: "wan", Addrs: []netip.Prefix{pf("10.20.0.1/24")}}})
	for i := 1; i <= hubSites; i++ {
		s := fmt.Sprintf("s%d", i)
		tp.Hosts = append(tp.Hosts, topo.Host{Name: s, Routes: []topo.Route{{Dst: pf("10.20.0.0/24"), Via: ad(fmt.Sprintf("10.20.%d.1", i))}}})
		tp.Links = append(tp.Links, topo.Link{Name: s + "-r", Kernel: true,
			A: topo.Endpoint{Host: s, Ifname: "up", Addrs: []netip.Prefix{pf(fmt.Sprintf("10.20.%d.2/24", i))}},
			B: topo.Endpoint{Host: "r", Addrs: []netip.Prefix{pf(fmt.Sprintf("10.20.%d.1/24", i))}}})
	}
	return tp
}

// hubResult is one hub run: the sites' summed goodput and the hub process's CPU per core
// (cores busy, 1 = one core all the time).
type hubResult struct {
	goodput float64
	perCore []float64
}

// hubTable runs the hub row: hubSites sites sending one bulk flow each at once through one
// hub, with the hub's uplinks read by one socket each and by one per core, alternating, runs
// times each.
func hubTable(ctx context.Context, w io.Writer, braid string, runs int, dur time.Duration) {
	cores := runtime.NumCPU()
	fmt.Fprintf(w, "### A hub on every core\n\n%d sites send one TCP flow each at once for %v to a hub's one uplink, through a router,\n"+
		"over unshaped veths (`braid tunnel` processes, encryption on); the hub's uplink is read by 1\n"+
		"socket, then by %d (`shards`, one per CPU). The hub's CPU per core is its threads' time by the core they ran on,\n"+
		"sampled every 100 ms. Medians of %d runs; the machine is shared, so absolute rates are noisy.\n\n",
		hubSites, dur, cores, runs)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| hub\t| aggregate goodput\t| hub CPU per core (cores busy)\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|")
	for _, shards := range []int{1, cores} {
		var good []float64
		per := make([][]float64, cores)
		for range runs {
			r := hubRun(ctx, braid, shards, dur)
			good = append(good, r.goodput)
			for c := range cores {
				if c < len(r.perCore) {
					per[c] = append(per[c], r.perCore[c])
				}
			}
		}
		var cs []string
		for c := range cores {
			cs = append(cs, fmt.Sprintf("cpu%d %.2f", c, kit.Median(per[c])))
		}
		fmt.Fprintf(tw, "| shards = %d\t| %.1f Mbit/s\t| %s\t|\n", shards, kit.Median(good)/1e6, strings.Join(cs, ", "))
	}
	tw.Flush()
	fmt.Fprintln(w)
}

// hubRun starts the hub and the sites as `braid tunnel` processes with the hub's shards, and
// runs one bulk flow from every site at once.
func hubRun(ctx context.Context, braid string, shards int, dur time.Duration) hubResult {
	l, err := lab.Up(ctx, hubTopology(), lab.Options{})
	if err != nil {
		drive.Fatal(err)
	}
	defer l.Close()
	dir, err := os.MkdirTemp("", "braid-hub-")
	if err != nil {
		drive.Fatal(err)
	}
	defer os.RemoveAll(dir)
	keys := make([]session.PrivateKey, hubSites+1)
	for i := range keys {
		keys[i], _ = session.GenerateKey()
	}
	var hub strings.Builder
	fmt.Fprintf(&hub, "[tunnel]\nprivate_key = %q\naddress = \"10.254.0.1/24\"\ncontrol = %q\nshards = %d\n", keys[0].String(), filepath.Join(dir, "hub.sock"), shards)
	fmt.Fprintf(&hub, "[[tunnel.uplink]]\nname = \"wan\"\ninterface = \"wan\"\naddress = \"10.20.0.1\"\n")
	for i := 1; i <= hubSites; i++ {
		fmt.Fprintf(&hub, "[[tunnel.peer]]\nname = \"s%d\"\npublic_key = %q\nroutes = [\"10.254.0.%d/32\"]\n", i, keys[i].Public().String(), 10+i)
		fmt.Fprintf(&hub, "[[tunnel.peer.path]]\nuplink = \"wan\"\nremote = \"10.20.%d.2:%d\"\n", i, roles.TunnelPort)
	}
	var procs []*exec.Cmd
	defer func() {
		for _, c := range procs {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
		}
	}()
	start := func(host, file string) *exec.Cmd {
		path := filepath.Join(dir, host+".toml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			drive.Fatal(err)
		}
		cmd := exec.Command(braid, "tunnel", "--config", path)
		logf, err := os.Create(filepath.Join(dir, host+".log"))
		if err != nil {
			drive.Fatal(err)
		}
		cmd.Stderr = logf
		if err := l.Host(host).Start(cmd); err != nil {
			drive.Fatal(err)
		}
		procs = append(procs, cmd)
		return cmd
	}
	hubCmd := start("hub", hub.String())
	for i := 1; i <= hubSites; i++ {
		var s strings.Builder
		fmt.Fprintf(&s, "[tunnel]\nprivate_key = %q\naddress = \"10.254.0.%d/24\"\ncontrol = %q\n", keys[i].String(), 10+i, filepath.Join(dir, fmt.Sprintf("s%d.sock", i)))
		fmt.Fprintf(&s, "[[tunnel.uplink]]\nname = \"u\"\ninterface = \"up\"\naddress = \"10.20.%d.2\"\n", i)
		fmt.Fprintf(&s, "[[tunnel.peer]]\nname = \"hub\"\npublic_key = %q\nroutes = [\"10.254.0.1/32\"]\n", keys[0].Public().String())
		fmt.Fprintf(&s, "[[tunnel.peer.path]]\nuplink = \"u\"\nremote = \"10.20.0.1:%d\"\n", roles.TunnelPort)
		start(fmt.Sprintf("s%d", i), s.String())
	}
	for i := 1; i <= hubSites; i++ {
		if err := kit.WaitReachable(ctx, l.Host(fmt.Sprintf("s%d", i)), "10.254.0.1:5201"); err != nil {
			logs, _ := exec.Command("sh", "-c", "tail -n 5 "+filepath.Join(dir, "*.log")).CombinedOutput()
			drive.Fatalf("site %d: %v\n%s", i, err, logs)
		}
	}
	srv := exec.Command(braid, "traffic", "serve", "--listen", "10.254.0.1:5201", "--udp", "off")
	if err := l.Host("hub").Start(srv); err != nil {
		drive.Fatal(err)
	}
	procs = append(procs, srv)
	// The server listens once it has started: wait for it to accept.
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := l.Host("s1").Dial(ctx, "tcp", "10.254.0.1:5201")
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			drive.Fatalf("traffic server at the hub: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sampler := sampleCores(hubCmd.Process.Pid)
	var wg sync.WaitGroup
	res := make([]traffic.BulkResult, hubSites+1)
	for i := 1; i <= hubSites; i++ {
		wg.Go(func() {
			var out, errb bytes.Buffer
			cmd := exec.CommandContext(ctx, braid, "traffic", "bulk", "10.254.0.1:5201", "--duration", dur.String(), "--json")
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := l.Host(fmt.Sprintf("s%d", i)).Start(cmd); err != nil {
				drive.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				drive.Fatalf("bulk from s%d: %v\n%s", i, err, errb.String())
			}
			if err := json.Unmarshal(out.Bytes(), &res[i]); err != nil {
				drive.Fatalf("bulk from s%d: %v", i, err)
			}
		})
	}
	wg.Wait()
	r := hubResult{perCore: sampler.stop()}
	for i := 1; i <= hubSites; i++ {
		r.goodput += res[i].Steady
	}
	return r
}

// coreSampler attributes a process's CPU time to cores: every 100 ms, each thread's new user
// and system time goes to the core it last ran on (/proc/PID/task/TID/stat, fields 14, 15
// and 39).
type coreSampler struct {
	done    chan struct{}
	result  chan []float64
	started time.Time
}

func sampleCores(pid int) *coreSampler {
	s := &coreSampler{done: make(chan struct{}), result: make(chan []float64, 1), started: time.Now()}
	go func() {
		busy := make([]float64, runtime.NumCPU())
		last := map[string]int64{}
		read := func(account bool) {
			tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			for _, t := range tasks {
				b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
				if err != nil {
					continue
				}
				st := string(b)
				f := strings.Fields(st[strings.LastIndexByte(st, ')')+2:])
				if len(f) < 37 {
					continue
				}
				ut, _ := strconv.ParseInt(f[11], 10, 64)
				stm, _ := strconv.ParseInt(f[12], 10, 64)
				cpu, _ := strconv.Atoi(f[36])
				ticks := ut + stm
				if account && cpu < len(busy) {
					busy[cpu] += float64(ticks - last[t.Name()])
				}
				last[t.Name()] = ticks
			}
		}
		read(false)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				read(true)
				wall := time.Since(s.started).Seconds()
				for i := range busy {
					busy[i] = busy[i] / 100 / wall // USER_HZ ticks to seconds, over the wall time
				}
				s.result <- busy
				return
			case <-tick.C:
				read(true)
			}
		}
	}()
	return s
}

func (s *coreSampler) stop() []float64 {
	close(s.done)
	return <-s.result
}
