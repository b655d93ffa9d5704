package app

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"braid/internal/experiment"
	"braid/internal/experiment/kit"
	"braid/internal/lab"
	"braid/internal/lab/netns"
	"braid/internal/lab/topo"
	"braid/internal/units"
)

func init() {
	commands["lab"] = command{summary: "emulated multi-site networks on this machine (namespaces, WAN links)", run: runLab}
}

const labDoc = `Usage: braid lab <command> [arguments]

braid lab builds emulated networks on one machine. Every host is a network namespace; every
link is a pair of TUN interfaces joined by braid's user-space link emulator, which gives each
direction a rate, a one-way delay, jitter, random loss and a drop-tail queue (this kernel has
no netem). braid's roles and any other program run inside the hosts for real.

Commands:
  up FILE        build the topology in FILE and keep it until Ctrl-C (or --detach)
  down           remove what killed runs left behind and your last 'lab up' lab (--all: every lab)
  status         list the running labs and the state of their links
  exec HOST -- CMD [ARG...]
                 run a command inside a host of the running lab
  link HOST1 HOST2 [--rate R] [--delay D] [--jitter J] [--loss L] [--down|--up]
                 change a link of the running lab while traffic flows
  iface HOST IFNAME [--down|--up] [--del ADDR] [--add ADDR]
                 take an interface down or up, change its address
  nat [HOST] [--flush]
                 list the mappings of the lab's NATs, or flush them
  run SCENARIO   run a built-in experiment and print its table
  repro PAPER    reproduce a paper's experiment (mptgre, amptcp, federation, mplb, rbpm): its
                 figures beside braid's, its claims checked (exit 3 when one fails)
  demo           the main demonstration: two sites, two uplinks each, each path measured

Names: namespaces are called braid-<id>-<host>, where <id> is a random run ID.

Example:
  braid lab up examples/two-sites.toml --detach
  braid lab exec h1 -- ping -c 3 10.2.0.10
  braid lab link r1 r2 --delay 40ms --loss 1%
  braid lab down

Run 'braid lab <command> --help' for the manual of each command.
`

func runLab(e env, args []string) int {
	return dispatch(e, "lab", labDoc, map[string]func(env, []string) int{
		"up": labUp, "down": labDown, "status": labStatus, "exec": labExec,
		"link": labLink, "iface": labIface, "nat": labNAT, "run": labRun, "repro": labRun, "demo": labDemo,
	}, args)
}

func labLogger(e env, verbose bool) *slog.Logger {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	log, err := newLoggerLevel(e.stderr, e.defaultLogFormat(), level)
	if err != nil { // not reached: parseGlobal accepts known formats only
		log, _ = newLoggerLevel(e.stderr, "text", level)
	}
	return log
}

// labFail prints one line and returns the exit code for a lab error; missing privilege is
// said plainly.
func labFail(e env, cmd string, err error) int {
	if errors.Is(err, netns.ErrPrivilege) {
		fmt.Fprintf(e.stderr, "braid lab %s: %v\n", cmd, err)
		return exitError
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") { // several problems, e.g. from a topology file
		fmt.Fprintf(e.stderr, "braid lab %s:\n  %s\n", cmd, strings.ReplaceAll(msg, "\n", "\n  "))
		return exitError
	}
	fmt.Fprintf(e.stderr, "braid lab %s: %s\n", cmd, msg)
	return exitError
}

const labUpDoc = `Usage: braid lab up FILE [--detach] [--verbose]

Builds the topology described in the TOML file FILE: one network namespace per host, one
emulated link per [[link]], the addresses and the routes. The file is checked completely before
anything is created; a mistake is reported with the file, the line and the reason.

Without --detach the lab lives until Ctrl-C (SIGINT) or SIGTERM, then everything is removed.
With --detach braid starts the lab in the background, prints its ID and returns; remove it with
'braid lab down'. While the lab runs, 'braid lab exec' runs commands in its hosts and
'braid lab link' changes its links.

File format (every key is optional unless marked):

  name = "two-sites"
  [[host]]
  name = "r1"                                   # required; [a-z][a-z0-9-]*, at most 12 chars
  forward = true                                # route between interfaces
  route = [ { dst = "10.2.0.0/16", via = "10.0.12.2" }, { dst = "default", via = "fd00:12::2" } ]
  [[link]]
  a = "r1"                                      # required
  b = "core"                                    # required
  a_addr = ["10.0.12.1/30", "fd00:12::1/64"]
  b_addr = ["10.0.12.2/30", "fd00:12::2/64"]
  rate = "50mbit"                               # both directions; [link.ab] / [link.ba] override
  # trace = "lte.up"                            # instead of rate: replay recorded capacity
  # trace_offset = "30s"                        #   from 30 s in (docs/lab.md, lab/traces)
  delay = "10ms"                                # one way
  jitter = "1ms"                                # order is kept
  loss = "0.5%"
  queue_packets = 100                           # drop-tail bound; default one BDP of the RTT
  queue_bytes = "150KB"
  offload = "auto"                              # auto | on | off: TSO super-packets through
  kernel = false                                # a veth pair instead of an emulated link

A host becomes a NAT router (nftables masquerade; forwarding on) with a nat table:

  [[host]]
  name = "cpe"
  nat = { outside = "wan" }                     # required: the interface(s) on the public side
  # random_ports = true                         # random source ports (default: kept if free)
  # udp_timeout = "30s"                         # a UDP mapping's idle lifetime, whole seconds
  # udp_stream_timeout = "120s"                 #   of a flow with replies, if not udp_timeout
  # ipv6 = true                                 # masquerade IPv6 too (default: routed as is)

Example:
  braid lab up lab.toml --detach
  braid lab exec h1 -- ip route
  braid lab down
`

func labUp(e env, args []string) int {
	fs := newFlags(e, "braid lab up", labUpDoc)
	detach := fs.Bool("detach", false, "start the lab in the background, print its ID and return")
	verbose := fs.Bool("verbose", false, "log what is created and removed")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(e.stderr, "braid lab up: expected one topology FILE (see 'braid lab up --help')")
		return exitUsage
	}
	t, err := topo.Load(pos[0])
	if err != nil {
		return labFail(e, "up", err)
	}
	if err := netns.CheckPrivilege(); err != nil {
		return labFail(e, "up", err)
	}
	if *detach {
		return labUpDetached(e, pos[0], *verbose)
	}
	ctx, cancel := signalContext()
	defer cancel()
	l, err := lab.Up(ctx, t, lab.Options{Logger: labLogger(e, *verbose), OwnSignals: true})
	if err != nil {
		return labFail(e, "up", err)
	}
	defer l.Close()
	stop, err := l.ServeControl(ctx, lab.ControlPath(l.ID))
	if err == nil {
		err = l.SetControl(lab.ControlPath(l.ID))
	}
	if err != nil {
		return labFail(e, "up", err)
	}
	defer stop()
	printLab(e.stdout, l)
	if fd := os.Getenv("BRAID_LAB_READY_FD"); fd != "" {
		if n, err := strconv.Atoi(fd); err == nil {
			f := os.NewFile(uintptr(n), "ready")
			fmt.Fprintln(f, l.ID)
			f.Close()
		}
	} else {
		fmt.Fprintf(e.stdout, "\nlab %s is up; Ctrl-C removes it.\n", l.ID)
	}
	<-ctx.Done()
	return exitOK
}

// labUpDetached starts `braid lab up FILE` as a background process and waits until its lab is up.
func labUpDetached(e env, file string, verbose bool) int {
	self, err := os.Executable()
	if err != nil {
		return labFail(e, "up", err)
	}
	abs, _ := filepath.Abs(file)
	r, w, err := os.Pipe()
	if err != nil {
		return labFail(e, "up", err)
	}
	if err := os.MkdirAll(lab.StateDir, 0o755); err != nil {
		return labFail(e, "up", err)
	}
	logPath := filepath.Join(lab.StateDir, fmt.Sprintf("up-%d.log", os.Getpid()))
	logf, err := os.Create(logPath)
	if err != nil {
		return labFail(e, "up", err)
	}
	args := []string{"lab", "up", abs}
	if verbose {
		args = append(args, "--verbose")
	}
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{w}
	cmd.Env = append(os.Environ(), "BRAID_LAB_READY_FD=3")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return labFail(e, "up", err)
	}
	w.Close()
	logf.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	id := strings.TrimSpace(line)
	if id == "" {
		cmd.Wait()
		out, _ := os.ReadFile(logPath)
		os.Remove(logPath)
		fmt.Fprint(e.stderr, string(out))
		return exitError
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	out, _ := os.ReadFile(logPath)
	e.stdout.Write(out)
	fmt.Fprintf(e.stdout, "\nlab %s is up in the background (pid %d, log %s); 'braid lab down' (your last lab) or\n'braid lab down --lab %s' removes it.\n", id, pid, logPath, id)
	return exitOK
}

func printLab(w io.Writer, l *lab.Lab) {
	fmt.Fprintf(w, "lab %s (topology %s), links emulated by %s\n\n", l.ID, l.Topo.Name, lab.EmulatorName)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tNAMESPACE\tINTERFACES")
	for _, h := range l.Hosts() {
		var ifs []string
		for _, lk := range l.Links() {
			for _, ep := range []topo.Endpoint{lk.Spec.A, lk.Spec.B} {
				if ep.Host == h.Name {
					var addrs []string
					for _, a := range ep.Addrs {
						addrs = append(addrs, a.String())
					}
					ifs = append(ifs, ep.Ifname+" "+strings.Join(addrs, ","))
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", h.Name, h.NS.Name, strings.Join(ifs, "; "))
	}
	tw.Flush()
	for _, h := range l.Hosts() {
		if n := h.NAT(); n != nil {
			fmt.Fprintf(w, "host %s is a NAT: %s\n", h.Name, natString(*n))
		}
	}
	fmt.Fprintln(w)
	printLinks(w, statuses(l))
}

// natString describes a NAT's configuration in one line.
func natString(n topo.NAT) string {
	s := "outside " + strings.Join(n.Outside, ",")
	if n.RandomPorts {
		s += ", random ports"
	} else {
		s += ", ports kept"
	}
	if n.IPv6 {
		s += ", IPv6 too"
	}
	switch u, st := n.UDPTimeouts(); {
	case u == 0 && st == 0:
		s += ", kernel's UDP timeouts"
	case u == st:
		s += fmt.Sprintf(", UDP mappings expire after %v idle", u)
	default:
		s += fmt.Sprintf(", UDP mappings expire after %v idle (%v with replies)", orDefault(u, "30s"), orDefault(st, "120s"))
	}
	return s
}

func orDefault(d time.Duration, def string) string {
	if d == 0 {
		return def
	}
	return d.String()
}

func statuses(l *lab.Lab) []lab.LinkStatus {
	var out []lab.LinkStatus
	for _, lk := range l.Links() {
		out = append(out, lk.Status()...)
	}
	return out
}

func printLinks(w io.Writer, links []lab.LinkStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LINK\tDIRECTION\tRATE\tDELAY\tJITTER\tLOSS\tQUEUE\tSTATE\tDELIVERED\tDROPPED (loss/queue/cut)")
	for _, s := range links {
		state := "up"
		switch {
		case s.Cut && s.IfDown:
			state = "CUT,DOWN"
		case s.Cut:
			state = "CUT"
		case s.IfDown:
			state = "DOWN"
		}
		fmt.Fprintf(tw, "%s\t%s -> %s\t%s\t%v\t%v\t%g %%\t%s\t%s\t%d pkts\t%d/%d/%d\n", s.Link, s.From, s.To,
			s.Shape.RateText(), s.Shape.Delay, s.Shape.Jitter, s.Shape.Loss, queueString(s.Shape), state,
			s.Stats.Packets, s.Stats.DropLoss, s.Stats.DropQueue, s.Stats.DropDown)
	}
	tw.Flush()
}

func queueString(s topo.Shape) string {
	switch {
	case s.QueuePackets > 0 && s.QueueBytes > 0:
		return fmt.Sprintf("%d pkts/%d B", s.QueuePackets, s.QueueBytes)
	case s.QueuePackets > 0:
		return fmt.Sprintf("%d pkts", s.QueuePackets)
	case s.QueueBytes > 0:
		return fmt.Sprintf("%d B", s.QueueBytes)
	}
	return "1 BDP"
}

const labDownDoc = `Usage: braid lab down [--lab ID | --all] [--wait 5s]

Removes labs, and says what it removed and what it left:

  braid lab down            what killed or crashed runs left behind (labs whose process is
                            gone: their namespaces, the processes inside, state files), and
                            the lab you started last with 'braid lab up', if it still runs.
                            Labs of other running processes (tests, demos, other users' labs)
                            are left alone and listed.
  braid lab down --lab ID   only the lab ID, running or not.
  braid lab down --all      every lab on this machine, also those of running processes.

A running lab is asked to stop (SIGTERM; SIGKILL after --wait). Safe to run at any time.

Example:
  braid lab down
  braid lab down --lab 3fa9c1
`

func labDown(e env, args []string) int {
	fs := newFlags(e, "braid lab down", labDownDoc)
	wait := fs.Duration("wait", 5*time.Second, "how long a running lab may take to stop before it is killed")
	id := fs.String("lab", "", "remove only the lab with this `ID`")
	all := fs.Bool("all", false, "remove every lab, also those of running processes")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "braid lab down: takes no arguments")
		return exitUsage
	}
	if *all && *id != "" {
		fmt.Fprintln(e.stderr, "braid lab down: --lab and --all exclude each other")
		return exitUsage
	}
	if err := netns.CheckPrivilege(); err != nil {
		return labFail(e, "down", err)
	}
	rep, err := lab.Down(lab.DownOptions{ID: *id, All: *all, Wait: *wait, UID: os.Getuid()})
	printDown(e.stdout, rep, *id)
	if err != nil {
		return labFail(e, "down", err)
	}
	return exitOK
}

// printDown says what lab down removed and what it left.
func printDown(w io.Writer, rep lab.DownReport, id string) {
	for _, st := range rep.Stopped {
		fmt.Fprintf(w, "stopped lab %s (%s, pid %d)\n", st.ID, st.Topology, st.PID)
	}
	for _, st := range rep.Reaped {
		fmt.Fprintf(w, "removed lab %s (%s) left by dead pid %d\n", st.ID, st.Topology, st.PID)
	}
	for _, n := range rep.Namespaces {
		fmt.Fprintf(w, "removed namespace %s\n", n)
	}
	for _, st := range rep.Left {
		what := "a process's own lab"
		if st.Control != "" {
			what = "started by 'braid lab up'"
		}
		fmt.Fprintf(w, "left lab %s (%s, pid %d running, %s, since %s): 'braid lab down --lab %s' or --all removes it\n",
			st.ID, st.Topology, st.PID, what, st.Started.Format(time.RFC3339), st.ID)
	}
	if len(rep.Stopped)+len(rep.Reaped)+len(rep.Namespaces) == 0 {
		if id != "" {
			fmt.Fprintf(w, "no lab %s to remove\n", id)
		} else {
			fmt.Fprintln(w, "no lab to remove")
		}
	}
}

// pickLab returns the running lab named by id, or the only running lab.
func pickLab(id string) (lab.State, error) {
	if id != "" {
		st, err := lab.ReadState(id)
		if err == nil && !st.Alive() {
			err = fmt.Errorf("lab %s is not running (its pid %d is gone); run 'braid lab down'", id, st.PID)
		}
		return st, err
	}
	all, err := lab.Running()
	if err != nil {
		return lab.State{}, err
	}
	switch len(all) {
	case 0:
		return lab.State{}, errors.New("no lab is running; start one with 'braid lab up FILE --detach'")
	case 1:
		return all[0], nil
	}
	var ids []string
	for _, st := range all {
		ids = append(ids, st.ID+" ("+st.Topology+")")
	}
	return lab.State{}, fmt.Errorf("%d labs are running (%s): choose one with --lab ID", len(all), strings.Join(ids, ", "))
}

const labStatusDoc = `Usage: braid lab status [--lab ID]

Lists the running labs, their hosts and namespaces, and for labs started by 'braid lab up' the
current shape, state and counters of every link direction.

Example:
  braid lab status
`

func labStatus(e env, args []string) int {
	fs := newFlags(e, "braid lab status", labStatusDoc)
	id := fs.String("lab", "", "only this lab `ID`")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	all, err := lab.Running()
	if err != nil {
		return labFail(e, "status", err)
	}
	if len(all) == 0 {
		fmt.Fprintln(e.stdout, "no lab is running")
		return exitOK
	}
	for _, st := range all {
		if *id != "" && st.ID != *id {
			continue
		}
		fmt.Fprintf(e.stdout, "lab %s (topology %s), pid %d, up since %s\n", st.ID, st.Topology, st.PID, st.Started.Format(time.RFC3339))
		for i, h := range st.Hosts {
			fmt.Fprintf(e.stdout, "  host %-12s namespace %s\n", h, st.Namespaces[i])
		}
		if st.Control != "" {
			links, err := lab.RequestLinks(st, lab.LinkRequest{Name: "*"})
			if err == nil {
				fmt.Fprintln(e.stdout)
				printLinks(e.stdout, links)
			}
		}
		fmt.Fprintln(e.stdout)
	}
	return exitOK
}

const labExecDoc = `Usage: braid lab exec [--lab ID] HOST -- CMD [ARG...]

Runs CMD inside HOST's network namespace of the running lab, with this terminal's input and
output, and exits with CMD's exit status. Only the network namespace changes: files, users and
processes are the machine's.

Example:
  braid lab exec h1 -- ip -br addr
  braid lab exec h1 -- braid traffic bulk 10.2.0.10:5201 --duration 5s
`

func labExec(e env, args []string) int {
	fs := newFlags(e, "braid lab exec", labExecDoc)
	id := fs.String("lab", "", "the running lab's `ID` (needed when several run)")
	pos, rest, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	if len(pos) != 1 || len(rest) == 0 {
		fmt.Fprintln(e.stderr, "braid lab exec: expected HOST -- CMD [ARG...] (see 'braid lab exec --help')")
		return exitUsage
	}
	st, err := pickLab(*id)
	if err != nil {
		return labFail(e, "exec", err)
	}
	i := indexOf(st.Hosts, pos[0])
	if i < 0 {
		return labFail(e, "exec", fmt.Errorf("lab %s has no host %q (hosts: %s)", st.ID, pos[0], strings.Join(st.Hosts, ", ")))
	}
	ns, err := netns.Open(st.Namespaces[i])
	if err != nil {
		return labFail(e, "exec", err)
	}
	defer ns.Close()
	cmd := exec.Command(rest[0], rest[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = e.stdin, e.stdout, e.stderr
	if err := ns.Do(cmd.Start); err != nil {
		return labFail(e, "exec", err)
	}
	// The child gets our terminal's signals itself; we only wait for it.
	signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
	defer signal.Reset(syscall.SIGINT, syscall.SIGQUIT)
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ee.ExitCode() >= 0 {
			return ee.ExitCode()
		}
		return 128 + int(ee.Sys().(syscall.WaitStatus).Signal())
	}
	if err != nil {
		return labFail(e, "exec", err)
	}
	return exitOK
}

const labLinkDoc = `Usage: braid lab link HOST1 HOST2 [--lab ID] [--name LINK] [--dir both|ab|ba]
                      [--rate R] [--delay D] [--jitter J] [--loss L]
                      [--queue-packets N] [--queue-bytes B] [--down | --up]
                      [--if-down | --if-up]

Changes the links between HOST1 and HOST2 of the running lab while traffic flows, and prints
their state. Without a change it only prints the state. --dir ab changes only the direction
HOST1 -> HOST2, --dir ba only HOST2 -> HOST1. --down cuts the link (packets in flight are lost
too) without the hosts noticing: their interfaces stay up, as when a fault is beyond the
modem; --up restores it. --if-down takes the interfaces at both ends down, as a cable pulled
out: the hosts see the link go down and lose the routes through it; --if-up brings them up
with their addresses and routes (one end alone: 'braid lab iface'). Values use the topology
file's units: rates like 50mbit or 1gbit, delays like 10ms, loss like 1%, sizes like 64KB.

Example:
  braid lab link r1 r2 --rate 20mbit --delay 40ms
  braid lab link r1 r2 --down
  braid lab link r1 r2 --up
  braid lab link r1 r2 --if-down
`

func labLink(e env, args []string) int {
	fs := newFlags(e, "braid lab link", labLinkDoc)
	id := fs.String("lab", "", "the running lab's `ID` (needed when several run)")
	name := fs.String("name", "", "change only the link with this `NAME` (for parallel links)")
	dir := fs.String("dir", "both", "which direction to change: both, ab (HOST1 to HOST2) or ba")
	rate := fs.String("rate", "", "new `RATE`, e.g. 50mbit; 0 for unlimited")
	delay := fs.String("delay", "", "new one-way `DELAY`, e.g. 10ms")
	jitter := fs.String("jitter", "", "new `JITTER`, e.g. 2ms")
	loss := fs.String("loss", "", "new random `LOSS`, e.g. 1%")
	qp := fs.Int("queue-packets", -1, "new queue bound in `PACKETS`; 0 for the default")
	qb := fs.String("queue-bytes", "", "new queue bound in `BYTES`, e.g. 150KB; 0 for the default")
	down := fs.Bool("down", false, "cut the link")
	up := fs.Bool("up", false, "restore a cut link")
	ifDown := fs.Bool("if-down", false, "take the interfaces at both ends down")
	ifUp := fs.Bool("if-up", false, "bring the interfaces at both ends up, with their addresses and routes")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	if len(pos) != 2 && !(len(pos) == 0 && *name != "") {
		fmt.Fprintln(e.stderr, "braid lab link: expected HOST1 HOST2 (or --name LINK); see 'braid lab link --help'")
		return exitUsage
	}
	req := lab.LinkRequest{Name: *name, Dir: *dir, Down: *down, Up: *up, IfDown: *ifDown, IfUp: *ifUp}
	if len(pos) == 2 {
		req.A, req.B = pos[0], pos[1]
	}
	var err error
	if *rate != "" {
		v, e2 := units.ParseRate(*rate)
		req.Set.Rate, err = &v, e2
	}
	if err == nil && *delay != "" {
		v, e2 := units.ParseDelay(*delay)
		req.Set.Delay, err = &v, e2
	}
	if err == nil && *jitter != "" {
		v, e2 := units.ParseDelay(*jitter)
		req.Set.Jitter, err = &v, e2
	}
	if err == nil && *loss != "" {
		v, e2 := units.ParseLoss(*loss)
		req.Set.Loss, err = &v, e2
	}
	if err == nil && *qp >= 0 {
		req.Set.QueuePackets = qp
	}
	if err == nil && *qb != "" {
		v, e2 := units.ParseSize(*qb)
		req.Set.QueueBytes, err = &v, e2
	}
	if err == nil {
		err = req.Set.Validate()
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "braid lab link: %v\n", err)
		return exitUsage
	}
	st, err := pickLab(*id)
	if err != nil {
		return labFail(e, "link", err)
	}
	links, err := lab.RequestLinks(st, req)
	if err != nil {
		return labFail(e, "link", err)
	}
	printLinks(e.stdout, links)
	return exitOK
}

const labIfaceDoc = `Usage: braid lab iface HOST IFNAME [--lab ID] [--down | --up] [--del ADDR] [--add ADDR]

Changes an interface of a host of the running lab while traffic flows, and prints its state
(without a change, only prints it). In this order: --down takes it down, as 'ip link set down'
(the host sees the link go down and the kernel removes the routes through it); --del removes an
address and --add adds one (address/length), as a DHCP renumbering does; --up brings the
interface up again with its addresses and the host's routes through it. A NAT whose outside
address changes forgets the mappings made with the old one.

Example:
  braid lab iface cpe1 wan --del 198.51.100.2/24 --add 198.51.100.3/24
  braid lab iface site up1 --down
  braid lab iface site up1 --up
`

func labIface(e env, args []string) int {
	fs := newFlags(e, "braid lab iface", labIfaceDoc)
	id := fs.String("lab", "", "the running lab's `ID` (needed when several run)")
	down := fs.Bool("down", false, "take the interface down")
	up := fs.Bool("up", false, "bring the interface up, with its addresses and routes")
	del := fs.String("del", "", "remove this `ADDR`ess (address/length)")
	add := fs.String("add", "", "add this `ADDR`ess (address/length)")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	if len(pos) != 2 {
		fmt.Fprintln(e.stderr, "braid lab iface: expected HOST IFNAME (see 'braid lab iface --help')")
		return exitUsage
	}
	req := lab.IfaceRequest{Host: pos[0], Ifname: pos[1], Down: *down, Up: *up}
	for _, a := range []struct {
		flag, v string
		p       *netip.Prefix
	}{{"--del", *del, &req.Del}, {"--add", *add, &req.Add}} {
		if a.v == "" {
			continue
		}
		p, err := netip.ParsePrefix(a.v)
		if err != nil {
			fmt.Fprintf(e.stderr, "braid lab iface: %s %q: want address/length such as 10.0.0.1/24\n", a.flag, a.v)
			return exitUsage
		}
		*a.p = p
	}
	if *down && *up {
		fmt.Fprintln(e.stderr, "braid lab iface: --down and --up exclude each other")
		return exitUsage
	}
	st, err := pickLab(*id)
	if err != nil {
		return labFail(e, "iface", err)
	}
	is, err := lab.RequestIface(st, req)
	if err != nil {
		return labFail(e, "iface", err)
	}
	state := "up"
	if !is.Up {
		state = "DOWN"
	}
	var addrs []string
	for _, a := range is.Addrs {
		addrs = append(addrs, a.String())
	}
	fmt.Fprintf(e.stdout, "%s %s: %s, addresses %s\n", is.Host, is.Ifname, state, strings.Join(addrs, " "))
	return exitOK
}

const labNATDoc = `Usage: braid lab nat [HOST] [--lab ID] [--flush]

Lists the NATs of the running lab (hosts with a nat table in the topology; HOST: only that
one) with their mappings: protocol, the inside source, the remote end, the source after
translation and the time left before the mapping expires without traffic. --flush first
removes every mapping (the NAT host's connection-tracking table), as a NAT that reboots does:
the next packet of each flow gets a new mapping, with random_ports a new port.

Example:
  braid lab nat
  braid lab nat cpe1 --flush
`

func labNAT(e env, args []string) int {
	fs := newFlags(e, "braid lab nat", labNATDoc)
	id := fs.String("lab", "", "the running lab's `ID` (needed when several run)")
	flush := fs.Bool("flush", false, "remove every mapping first")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	if len(pos) > 1 {
		fmt.Fprintln(e.stderr, "braid lab nat: expected at most one HOST (see 'braid lab nat --help')")
		return exitUsage
	}
	req := lab.NATRequest{Flush: *flush}
	if len(pos) == 1 {
		req.Host = pos[0]
	}
	st, err := pickLab(*id)
	if err != nil {
		return labFail(e, "nat", err)
	}
	nats, err := lab.RequestNAT(st, req)
	if err != nil {
		return labFail(e, "nat", err)
	}
	for _, n := range nats {
		fmt.Fprintf(e.stdout, "NAT %s: %s\n", n.Host, natString(n.NAT))
		if *flush {
			fmt.Fprintf(e.stdout, "  flushed %d entries\n", n.Flushed)
		}
		if len(n.Mappings) == 0 {
			fmt.Fprintln(e.stdout, "  no mappings")
			continue
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  PROTO\tINSIDE\tREMOTE\tOUTSIDE\tEXPIRES")
		for _, m := range n.Mappings {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%v\n", m.Proto, m.Inside, m.Remote, m.Outside, m.Expires)
		}
		tw.Flush()
	}
	return exitOK
}

const labRunDoc = `Usage: braid lab run SCENARIO [--quick] [--out DIR] [--reps N]
       braid lab repro SCENARIO [--quick] [--out DIR] [--reps N]

Runs a built-in experiment on a lab it builds for itself, prints its table and removes the lab.
'repro' is the same command, named for the experiments that reproduce a paper (mptgre): they
print the paper's figures beside braid's. --quick shortens every measurement (a smoke run).
Scenarios that draw figures (amptcp, mplb, rbpm) write them as PNG files into --out.
Each demo and repro ends with its checks (the paper's claims, bytes intact, rates within what
the links allow), one PASS or FAIL line each, and exits with status 3 when one fails (1 when
the run could not complete); --quick runs the same checks.

Scenarios:
%s
Example:
  braid lab run accuracy --quick
  braid lab repro mptgre
  braid lab repro amptcp --out bench/amptcp
`

func labRun(e env, args []string) int {
	var list strings.Builder
	for _, s := range experiment.All() {
		fmt.Fprintf(&list, "  %-12s %s\n", s.Name, s.Summary)
	}
	fs := newFlags(e, "braid lab run", fmt.Sprintf(labRunDoc, list.String()))
	quick := fs.Bool("quick", false, "short measurements (a smoke run, less precise)")
	verbose := fs.Bool("verbose", false, "log what is created and removed")
	out := fs.String("out", "", "`DIR` for the figures (PNG) a scenario writes, made if missing (default: the current directory)")
	reps := fs.Int("reps", 0, "repetitions of each measurement, where a scenario repeats them (default: its own)")
	pos, _, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintf(e.stderr, "braid lab run: expected one SCENARIO, one of:\n%s", list.String())
		return exitUsage
	}
	s, ok := experiment.Lookup(pos[0])
	if !ok {
		fmt.Fprintf(e.stderr, "braid lab run: unknown scenario %q; the scenarios are:\n%s", pos[0], list.String())
		return exitUsage
	}
	if *reps < 0 {
		fmt.Fprintln(e.stderr, "braid lab run: --reps must not be negative")
		return exitUsage
	}
	// The figures are written at the end of a run that can take half an hour: the directory
	// is made (or found unusable) now.
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			fmt.Fprintf(e.stderr, "braid lab run: --out: %v\n", err)
			return exitError
		}
	}
	return runScenario(e, "run "+s.Name, s, kit.Options{Quick: *quick, Logger: labLogger(e, *verbose), Out: *out, Reps: *reps})
}

// exitChecks is the exit status of a demo or repro that ran to the end but printed a failed
// check: distinct from exitError (it could not run), so that CI and scripts can tell them apart.
const exitChecks = 3

// runScenario runs s; cmd names the command line in messages ("run accuracy", "demo").
func runScenario(e env, cmd string, s kit.Scenario, o kit.Options) int {
	if err := netns.CheckPrivilege(); err != nil {
		return labFail(e, cmd, err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	return scenarioExit(e, cmd, ctx, s.Run(ctx, e.stdout, o))
}

// scenarioExit turns what a scenario's run returned into the command's exit status: 0 when it
// ran and every check it printed passed, exitChecks with a summary when a check failed.
func scenarioExit(e env, cmd string, ctx context.Context, err error) int {
	var failed *kit.ClaimsFailed
	switch {
	case err == nil:
		return exitOK
	case ctx.Err() != nil:
		fmt.Fprintf(e.stderr, "braid lab %s: interrupted; everything the lab created was removed\n", cmd)
		return exitInterrupted
	case errors.As(err, &failed):
		fmt.Fprintf(e.stderr, "braid lab %s: %d of %d checks FAILED:\n", cmd, len(failed.Failed), failed.Total)
		for _, c := range failed.Failed {
			fmt.Fprintf(e.stderr, "  %s: %s\n", c.Name, c.Detail)
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok { // e.g. a figure not written too
			for _, x := range j.Unwrap() {
				if x != nil && !errors.Is(x, kit.ErrClaims) {
					fmt.Fprintf(e.stderr, "braid lab %s: also: %v\n", cmd, x)
				}
			}
		}
		return exitChecks
	}
	return labFail(e, cmd, err)
}

const labDemoDoc = `Usage: braid lab demo [--quick] [--file FILE]

The main demonstration. Builds two sites, each with a host behind a router that has two
uplinks of different capacity and delay, measures each path alone (TCP goodput, round-trip
time, and a checksummed file transfer) and prints a table. Everything is removed at the end,
also on Ctrl-C. --file runs it on another topology with the same host names.

It ends with its checks, one PASS or FAIL line each: every file intact, each path between 0.6
and 1.0 of its bottleneck, round-trip times on the links' delays, the tunnel and the proxy
above the best single path and within their capacity, the tunnel's ping gap under 1 s when
path A is cut, the proxy on two subflows at least. A failed check makes it exit with status 3.

Example:
  braid lab demo
`

func labDemo(e env, args []string) int {
	fs := newFlags(e, "braid lab demo", labDemoDoc)
	quick := fs.Bool("quick", false, "short measurements (a smoke run, less precise)")
	file := fs.String("file", "", "use this topology `FILE` instead of the embedded one")
	verbose := fs.Bool("verbose", false, "log what is created and removed")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	s, _ := experiment.Lookup("demo")
	return runScenario(e, "demo", s, kit.Options{Quick: *quick, File: *file, Logger: labLogger(e, *verbose)})
}
