package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"braid/internal/config"
	"braid/internal/mptcp/info"
	"braid/internal/mptcp/pmnl"
	"braid/internal/units"
)

func init() {
	commands["mptcp"] = command{summary: "the kernel's MPTCP: endpoints, limits, connections with subflows, events", run: runMPTCP}
}

const mptcpDoc = `Usage: braid mptcp endpoints [list] [--json]
       braid mptcp endpoints add ADDRESS [--id N] [--dev IF] [--port P] [--flags F,...]
       braid mptcp endpoints add --config FILE [--flags F,...]
       braid mptcp endpoints del ID|ADDRESS
       braid mptcp endpoints change ID backup|nobackup
       braid mptcp endpoints flush
       braid mptcp limits [--subflows N] [--add-addr-accepted N]
       braid mptcp show [--watch INTERVAL] [--json]
       braid mptcp monitor [--json]

braid mptcp talks to the kernel's MPTCP in the network namespace it runs in, through the
mptcp_pm generic-netlink family and sock_diag.

  endpoints  the in-kernel path manager's endpoints, as 'ip mptcp endpoint'. With --config, one
             endpoint per uplink of the site file ([[pm.uplink]], else [[tunnel.uplink]]), each
             bound to its interface, flags "subflow" unless --flags says otherwise (uplinks
             listed in [pm] backup get "backup" too). Flags: signal, subflow, backup, fullmesh,
             laminar.
  limits     show the in-kernel PM's limits, or set them (at most 8 each).
  show       every MPTCP connection with its subflows: addresses, ports, backup flag (local
             "b", peer "B"), RTT, congestion window, bytes sent and acked, delivery rate.
             --watch refreshes every INTERVAL until interrupted.
  monitor    the path-manager events, one per line (or one JSON object per line), until
             interrupted.

Changing endpoints and limits needs CAP_NET_ADMIN, and so does monitor (the kernel sends the
events only to privileged listeners); show needs it for the subflows' details.

Example:
  braid mptcp endpoints add --config /etc/braid/site.toml
  braid mptcp endpoints add 192.0.2.1 --dev wan0 --flags subflow,backup
  braid mptcp limits --subflows 4 --add-addr-accepted 4
  braid mptcp show --watch 1s
  braid mptcp monitor --json
`

func runMPTCP(e env, args []string) int {
	return dispatch(e, "mptcp", mptcpDoc, map[string]func(env, []string) int{
		"endpoints": mptcpEndpoints,
		"endpoint":  mptcpEndpoints,
		"limits":    mptcpLimits,
		"show":      mptcpShow,
		"monitor":   mptcpMonitor,
	}, args)
}

// mptcpFail prints err with a hint when MPTCP is absent or disabled, and returns exitError.
func mptcpFail(e env, what string, err error) int {
	fmt.Fprintf(e.stderr, "braid mptcp %s: %v\n", what, err)
	if b, rerr := os.ReadFile("/proc/sys/net/mptcp/enabled"); rerr == nil && strings.TrimSpace(string(b)) == "0" {
		fmt.Fprintln(e.stderr, "braid mptcp: note: MPTCP is disabled in this network namespace (sysctl net.mptcp.enabled = 0)")
	}
	return exitError
}

func withClient(e env, what string, fn func(ctx context.Context, c *pmnl.Client) error) int {
	c, err := pmnl.Dial(pmnl.Options{})
	if err != nil {
		return mptcpFail(e, what, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fn(ctx, c); err != nil {
		return mptcpFail(e, what, err)
	}
	return exitOK
}

func mptcpEndpoints(e env, args []string) int {
	verb := "list"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		verb, args = args[0], args[1:]
	}
	fs := newFlags(e, "braid mptcp endpoints", mptcpDoc)
	asJSON := fs.Bool("json", false, "print JSON (list)")
	id := fs.Uint("id", 0, "endpoint `ID` (add)")
	dev := fs.String("dev", "", "bind the endpoint to interface `IF` (add)")
	port := fs.Uint("port", 0, "`PORT` (add; with signal, the kernel listens on it)")
	flagList := fs.String("flags", "", "comma-separated `FLAGS` (add): signal, subflow, backup, fullmesh, laminar")
	file := fs.String("config", "", "add one endpoint per uplink of the site `FILE`")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	usage := func(msg string) int {
		fmt.Fprintf(e.stderr, "braid mptcp endpoints: %s (see 'braid mptcp --help')\n", msg)
		return exitUsage
	}
	flags, err := pmnl.ParseFlags(*flagList)
	if err != nil {
		return usage(err.Error())
	}
	switch verb {
	case "list", "show":
		if len(pos) > 0 {
			return usage("list takes no arguments")
		}
		return withClient(e, "endpoints", func(ctx context.Context, c *pmnl.Client) error {
			eps, err := c.Endpoints(ctx)
			if err != nil {
				return err
			}
			if *asJSON {
				return writeJSON(e.stdout, endpointsJSON(eps))
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tADDRESS\tPORT\tFLAGS\tDEV")
			for _, a := range eps {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", a.ID, a.Addr, portText(a.Port), a.Flags, ifName(a.IfIndex))
			}
			return tw.Flush()
		})
	case "add":
		var eps []pmnl.Addr
		if *file != "" {
			if len(pos) > 0 {
				return usage("give either --config or an address")
			}
			data, err := os.ReadFile(*file)
			if err != nil {
				return mptcpFail(e, "endpoints add", err)
			}
			cfg, err := config.LoadPM(*file, data, systemEnv{})
			if err != nil {
				return configFail(e, "mptcp endpoints", err)
			}
			for _, u := range cfg.Uplinks {
				ifi, err := net.InterfaceByName(u.Interface)
				if err != nil {
					return mptcpFail(e, "endpoints add", fmt.Errorf("uplink %s: interface %s: %w", u.Name, u.Interface, err))
				}
				f := flags
				if f == 0 {
					f = pmnl.FlagSubflow
				}
				if u.Backup {
					f |= pmnl.FlagBackup
				}
				eps = append(eps, pmnl.Addr{Addr: u.Address, Flags: f, IfIndex: int32(ifi.Index)})
			}
		} else {
			if len(pos) != 1 {
				return usage("add takes one address, or --config FILE")
			}
			a, err := netip.ParseAddr(pos[0])
			if err != nil {
				return usage(fmt.Sprintf("address %q: %v", pos[0], err))
			}
			if *id > 255 || *port > 65535 {
				return usage("id is at most 255 and port at most 65535")
			}
			ep := pmnl.Addr{ID: uint8(*id), Addr: a, Port: uint16(*port), Flags: flags}
			if *dev != "" {
				ifi, err := net.InterfaceByName(*dev)
				if err != nil {
					return usage(fmt.Sprintf("interface %s: %v", *dev, err))
				}
				ep.IfIndex = int32(ifi.Index)
			}
			eps = append(eps, ep)
		}
		return withClient(e, "endpoints add", func(ctx context.Context, c *pmnl.Client) error {
			for _, ep := range eps {
				if err := c.AddEndpoint(ctx, ep); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "added %s\n", ep)
			}
			return nil
		})
	case "del", "delete":
		if len(pos) != 1 {
			return usage("del takes one ID or address")
		}
		var id uint64
		var a netip.Addr
		if n, err := strconv.ParseUint(pos[0], 10, 8); err == nil && n > 0 {
			id = n
		} else if a, err = netip.ParseAddr(pos[0]); err != nil {
			return usage(fmt.Sprintf("%q is neither an endpoint ID nor an address", pos[0]))
		}
		return withClient(e, "endpoints del", func(ctx context.Context, c *pmnl.Client) error {
			if id == 0 {
				// The kernel deletes by ID only: find the endpoint with the address.
				eps, err := c.Endpoints(ctx)
				if err != nil {
					return err
				}
				for _, ep := range eps {
					if ep.Addr == a {
						id = uint64(ep.ID)
					}
				}
				if id == 0 {
					return fmt.Errorf("no endpoint has the address %s", a)
				}
			}
			return c.DelEndpoint(ctx, uint8(id), netip.Addr{})
		})
	case "change":
		if len(pos) != 2 || (pos[1] != "backup" && pos[1] != "nobackup") {
			return usage("change takes an ID and backup or nobackup")
		}
		n, err := strconv.ParseUint(pos[0], 10, 8)
		if err != nil || n == 0 {
			return usage(fmt.Sprintf("endpoint ID %q: want 1..255", pos[0]))
		}
		var f pmnl.Flags
		if pos[1] == "backup" {
			f = pmnl.FlagBackup
		}
		return withClient(e, "endpoints change", func(ctx context.Context, c *pmnl.Client) error {
			return c.SetEndpointFlags(ctx, pmnl.Addr{ID: uint8(n), Flags: f})
		})
	case "flush":
		if len(pos) > 0 {
			return usage("flush takes no arguments")
		}
		return withClient(e, "endpoints flush", func(ctx context.Context, c *pmnl.Client) error { return c.FlushEndpoints(ctx) })
	}
	return usage(fmt.Sprintf("unknown endpoints command %q", verb))
}

type endpointJSON struct {
	ID      uint8    `json:"id"`
	Address string   `json:"address"`
	Port    uint16   `json:"port,omitempty"`
	Flags   []string `json:"flags"`
	Dev     string   `json:"dev,omitempty"`
}

func endpointsJSON(eps []pmnl.Addr) []endpointJSON {
	out := make([]endpointJSON, 0, len(eps))
	for _, a := range eps {
		flags := []string{}
		if a.Flags != 0 {
			flags = strings.Split(a.Flags.String(), ",")
		}
		out = append(out, endpointJSON{ID: a.ID, Address: a.Addr.String(), Port: a.Port, Flags: flags, Dev: ifName(a.IfIndex)})
	}
	return out
}

func portText(p uint16) string {
	if p == 0 {
		return "-"
	}
	return strconv.Itoa(int(p))
}

func ifName(idx int32) string {
	if idx == 0 {
		return "-"
	}
	if ifi, err := net.InterfaceByIndex(int(idx)); err == nil {
		return ifi.Name
	}
	return strconv.Itoa(int(idx))
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func mptcpLimits(e env, args []string) int {
	fs := newFlags(e, "braid mptcp limits", mptcpDoc)
	subflows := fs.Int("subflows", -1, "set the additional subflows per connection to `N`")
	accepted := fs.Int("add-addr-accepted", -1, "set the ADD_ADDRs accepted per connection to `N`")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "braid mptcp limits: unexpected arguments (see 'braid mptcp --help')")
		return exitUsage
	}
	return withClient(e, "limits", func(ctx context.Context, c *pmnl.Client) error {
		if *subflows >= 0 || *accepted >= 0 {
			l, err := c.Limits(ctx)
			if err != nil {
				return err
			}
			if *subflows >= 0 {
				l.Subflows = uint32(*subflows)
			}
			if *accepted >= 0 {
				l.AddAddrAccepted = uint32(*accepted)
			}
			if err := c.SetLimits(ctx, l); err != nil {
				return err
			}
		}
		l, err := c.Limits(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "subflows %d add_addr_accepted %d\n", l.Subflows, l.AddAddrAccepted)
		return nil
	})
}

func mptcpShow(e env, args []string) int {
	fs := newFlags(e, "braid mptcp show", mptcpDoc)
	watch := fs.Duration("watch", 0, "refresh every `INTERVAL` until interrupted")
	asJSON := fs.Bool("json", false, "print JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 || *watch < 0 {
		fmt.Fprintln(e.stderr, "braid mptcp show: unexpected arguments (see 'braid mptcp --help')")
		return exitUsage
	}
	d, err := info.OpenDiag(info.Options{})
	if err != nil {
		return mptcpFail(e, "show", err)
	}
	defer d.Close()
	ctx, cancel := signalContext()
	defer cancel()
	for {
		conns, err := d.Dump()
		if err != nil && !errors.Is(err, os.ErrPermission) {
			return mptcpFail(e, "show", err)
		}
		if *asJSON {
			if conns == nil {
				conns = []info.Conn{}
			}
			if err := json.NewEncoder(e.stdout).Encode(conns); err != nil {
				return exitError
			}
		} else {
			if *watch > 0 {
				fmt.Fprintf(e.stdout, "%s\n", time.Now().Format(time.TimeOnly))
			}
			printConns(e.stdout, conns)
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "braid mptcp show: %v\n", err)
		}
		if *watch == 0 {
			return exitOK
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(*watch):
		}
	}
}

func printConns(w io.Writer, conns []info.Conn) {
	if len(conns) == 0 {
		fmt.Fprintln(w, "no MPTCP connections")
		return
	}
	sort.Slice(conns, func(i, j int) bool { return conns[i].Info.Token < conns[j].Info.Token })
	for _, c := range conns {
		sent, acked, _ := c.SubflowBytes()
		fmt.Fprintf(w, "token %08x  %v -> %v  subflows %d  sent %s  acked %s  received %s  (subflows: sent %s acked %s)\n",
			c.Info.Token, c.Local, c.Remote, len(c.Subflows), fmtBytes(int64(c.Info.BytesSent)), fmtBytes(int64(c.Info.BytesAcked)),
			fmtBytes(int64(c.Info.BytesReceived)), fmtBytes(int64(sent)), fmtBytes(int64(acked)))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  LOCAL\tREMOTE\tID\tBACKUP\tRTT\tCWND\tSENT\tACKED\tRATE")
		for _, s := range c.Subflows {
			bk := ""
			if s.Flags&info.SubflowBackupLocal != 0 {
				bk += "b"
			}
			if s.Flags&info.SubflowBackupRemote != 0 {
				bk += "B"
			}
			if bk == "" {
				bk = "-"
			}
			fmt.Fprintf(tw, "  %v\t%v\t%d/%d\t%s\t%.2fms\t%d\t%s\t%s\t%s\n", s.Local, s.Remote, s.LocID, s.RemID, bk,
				float64(s.TCP.RTT.Microseconds())/1000, s.TCP.SndCwnd, fmtBytes(int64(s.TCP.BytesSent)),
				fmtBytes(int64(s.TCP.BytesAcked)), units.FormatRate(s.TCP.DeliveryRate*8))
		}
		tw.Flush()
	}
}

func mptcpMonitor(e env, args []string) int {
	fs := newFlags(e, "braid mptcp monitor", mptcpDoc)
	asJSON := fs.Bool("json", false, "one JSON object per event")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "braid mptcp monitor: unexpected arguments (see 'braid mptcp --help')")
		return exitUsage
	}
	s, err := pmnl.Subscribe(pmnl.Options{})
	if err != nil {
		return mptcpFail(e, "monitor", err)
	}
	defer s.Close()
	ctx, cancel := signalContext()
	defer cancel()
	enc := json.NewEncoder(e.stdout)
	for {
		ev, err := s.Next(ctx)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return exitOK
		case errors.Is(err, pmnl.ErrOverrun), errors.Is(err, pmnl.ErrMalformed):
			fmt.Fprintf(e.stderr, "braid mptcp monitor: %v\n", err)
			continue
		default:
			return mptcpFail(e, "monitor", err)
		}
		if *asJSON {
			if err := enc.Encode(ev); err != nil {
				return exitError
			}
		} else if _, err := fmt.Fprintln(e.stdout, ev); err != nil {
			return exitError
		}
	}
}

// fmtBytes prints a byte count with a binary unit.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTP"[exp])
}
