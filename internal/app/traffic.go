package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"time"

	"braid/internal/traffic"
	"braid/internal/units"
)

func init() {
	commands["traffic"] = command{summary: "measure goodput, UDP loss and jitter, latency and integrity (iperf3-like)", run: runTraffic}
}

// trafficPort is the default port of 'braid traffic serve', for TCP and UDP alike.
const trafficPort = "5201"

const trafficDoc = `Usage: braid traffic <command> [arguments]

braid traffic measures a network path between a server and a client, both braid: TCP goodput,
UDP loss, reordering and jitter at a fixed rate, request/response latency, and whether a
transfer arrives intact. It is the lab's replacement for iperf3; the lab's Go tests use the same
code (package braid/internal/traffic).

Commands:
  serve [--listen ADDR] [--udp ADDR]
                 answer every test below until Ctrl-C
  bulk ADDR      TCP goodput, measured at the receiver, with per-interval samples
  udp ADDR       paced UDP datagrams: loss, duplicates, reordering, jitter
  rr ADDR        request/response latency: min, median, p90, p99, max
  file ADDR      transfer N pseudo-random bytes and compare SHA-256 sums

ADDR is host:port of a 'braid traffic serve'; without a port, ` + trafficPort + ` is used.

Example:
  braid traffic serve &
  braid traffic bulk 127.0.0.1 --duration 5s
  braid traffic udp [::1]:5201 --rate 50mbit

Run 'braid traffic <command> --help' for the manual of each command.
`

func runTraffic(e env, args []string) int {
	return dispatch(e, "traffic", trafficDoc, map[string]func(env, []string) int{
		"serve": trafficServe, "bulk": trafficBulk, "udp": trafficUDP, "rr": trafficRR, "file": trafficFile,
	}, args)
}

// trafficFail prints one line and returns the exit code for a run-time failure.
func trafficFail(e env, cmd string, err error) int {
	msg := strings.TrimPrefix(strings.ReplaceAll(err.Error(), "\n", "; "), "traffic: ")
	fmt.Fprintf(e.stderr, "braid traffic %s: %s\n", cmd, msg)
	return exitError
}

func trafficUsage(e env, cmd, format string, a ...any) int {
	fmt.Fprintf(e.stderr, "braid traffic %s: %s (see 'braid traffic %s --help')\n", cmd, fmt.Sprintf(format, a...), cmd)
	return exitUsage
}

// trafficArgs parses flags anywhere among the arguments and returns the one server address,
// with the default port added when it has none.
func trafficArgs(e env, fs *flag.FlagSet, cmd string, args []string) (addr string, done bool, code int) {
	pos, rest, done, code := parseInterspersed(e, fs, args)
	if done {
		return "", true, code
	}
	pos = append(pos, rest...)
	if len(pos) != 1 {
		return "", true, trafficUsage(e, cmd, "expected one server ADDR, got %d arguments", len(pos))
	}
	return withDefaultPort(pos[0], trafficPort), false, 0
}

// withDefaultPort returns host:port for addr, adding port when addr is a bare host or IP
// ("10.0.0.1", "::1", "[::1]", "server").
func withDefaultPort(addr, port string) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	return net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]"), port)
}

func printJSON(e env, cmd string, v any) int {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return trafficFail(e, cmd, err)
	}
	fmt.Fprintf(e.stdout, "%s\n", b)
	return exitOK
}

const trafficServeDoc = `Usage: braid traffic serve [--listen ADDR] [--udp ADDR] [--cc NAME]

Runs the server of every braid traffic test: one TCP listener serves bulk, rr and file tests and
the control connections of UDP tests; one UDP socket receives the datagrams of UDP tests (the
server tells each UDP client its port). It runs until Ctrl-C (SIGINT) or SIGTERM, then closes
every connection, which ends the tests that are running, and prints its counters.

--cc sets the congestion control of the connections the server accepts (TCP_CONGESTION on the
listener, which they inherit: cubic, bbr, reno, whatever net.ipv4.tcp_available_congestion_control
lists); it governs what the server sends, as in 'braid traffic bulk --reverse'. Without it the
host's default applies. A name the kernel does not offer is an error at start.

A connection that does not begin with a valid braid traffic header is counted as rejected and
closed; the server keeps serving.

Example:
  braid traffic serve
  braid traffic serve --listen 10.1.0.10:6000 --udp off
  braid traffic serve --cc cubic
  braid lab exec h2 -- braid traffic serve --listen [::]:5201
`

func trafficServe(e env, args []string) int {
	fs := newFlags(e, "braid traffic serve", trafficServeDoc)
	listen := fs.String("listen", "[::]:"+trafficPort, "TCP address to listen on")
	udpAddr := fs.String("udp", "", "UDP address to receive datagrams on; default the --listen address, \"off\" for none")
	cc := fs.String("cc", "", "congestion control of the accepted connections (the host's default if empty)")
	pos, rest, done, code := parseInterspersed(e, fs, args)
	if done {
		return code
	}
	if len(pos)+len(rest) != 0 {
		return trafficUsage(e, "serve", "unexpected argument %q", append(pos, rest...)[0])
	}
	if *udpAddr == "" {
		*udpAddr = *listen
	}
	ln, err := traffic.ListenCC(context.Background(), *listen, *cc)
	if err != nil {
		return trafficFail(e, "serve", err)
	}
	var pc net.PacketConn
	if *udpAddr != "off" {
		if pc, err = net.ListenPacket("udp", *udpAddr); err != nil {
			ln.Close()
			return trafficFail(e, "serve", err)
		}
	}
	srv := traffic.NewServer(ln, pc)
	ctx, cancel := signalContext()
	defer cancel()
	if pc != nil {
		fmt.Fprintf(e.stdout, "braid traffic: serving on tcp %s and udp %s\n", ln.Addr(), pc.LocalAddr())
	} else {
		fmt.Fprintf(e.stdout, "braid traffic: serving on tcp %s (no UDP)\n", ln.Addr())
	}
	err = srv.Serve(ctx)
	st := srv.Stats()
	fmt.Fprintf(e.stdout, "braid traffic: stopped: %d connections accepted, %d rejected, %d stray datagrams\n",
		st.Accepted, st.Rejected, st.Ignored)
	if err != nil && !errors.Is(err, context.Canceled) {
		return trafficFail(e, "serve", err)
	}
	return exitOK
}

const trafficBulkDoc = `Usage: braid traffic bulk ADDR [--duration 10s] [--interval 1s] [--reverse] [--streams N] [--cc NAME] [--json]

Measures TCP goodput to the server at ADDR: the client sends as fast as TCP allows for the
duration (with --reverse the server sends and the client receives). Goodput is payload received
by the receiving side within the measurement window, divided by the measured window, so
retransmissions and headers do not count. One line per interval is printed as it completes;
the summary gives the goodput over the whole run, the steady goodput (the median of the
intervals after the first, which excludes slow start) and the sender's TCP retransmissions
where the kernel reports them (Linux TCP_INFO).

--cc sets the congestion control of the client's connections (TCP_CONGESTION: cubic, bbr, reno,
whatever net.ipv4.tcp_available_congestion_control lists); without it the host's default
applies. It governs the sender only, so it cannot be combined with --reverse, where the server
sends: give the server --cc (braid traffic serve), or it sends with its host's default.

Flags may stand before or after ADDR.

Example:
  braid traffic bulk 10.2.0.10 --duration 5s
  braid traffic bulk 10.2.0.10 --cc cubic
  braid traffic bulk [fd00:2::10]:5201 --reverse --streams 4
  braid traffic bulk 127.0.0.1 --json > bulk.json
`

func trafficBulk(e env, args []string) int {
	fs := newFlags(e, "braid traffic bulk", trafficBulkDoc)
	duration := fs.Duration("duration", 10*time.Second, "length of the measurement window")
	interval := fs.Duration("interval", time.Second, "length of one sample interval")
	reverse := fs.Bool("reverse", false, "download: the server sends, the client receives")
	streams := fs.Int("streams", 1, fmt.Sprintf("parallel TCP connections (1 to %d)", traffic.MaxStreams))
	cc := fs.String("cc", "", "congestion control of the client's connections (the host's default if empty)")
	asJSON := fs.Bool("json", false, "print the result as JSON (durations in ns, rates in bit/s) instead of text")
	addr, done, code := trafficArgs(e, fs, "bulk", args)
	if done {
		return code
	}
	if *duration < traffic.MinDuration || *interval < traffic.MinInterval {
		return trafficUsage(e, "bulk", "--duration and --interval must be at least %v", traffic.MinDuration)
	}
	if *streams < 1 || *streams > traffic.MaxStreams {
		return trafficUsage(e, "bulk", "--streams must be between 1 and %d", traffic.MaxStreams)
	}
	if *cc != "" && *reverse {
		return trafficUsage(e, "bulk", "--cc sets the client's sender; with --reverse the server sends (braid traffic serve --cc)")
	}
	dial := traffic.NetDial
	if *cc != "" {
		dial = traffic.CCDial(traffic.NetDial, *cc)
	}
	ctx, cancel := signalContext()
	defer cancel()
	o := traffic.BulkOptions{Duration: *duration, Interval: *interval, Reverse: *reverse, Streams: *streams}
	if !*asJSON {
		dir := "to"
		if *reverse {
			dir = "from"
		}
		fmt.Fprintf(e.stdout, "bulk %s %s: %v, %d stream(s)\n", dir, addr, *duration, *streams)
		var prev time.Duration
		o.OnSample = func(s traffic.Sample) {
			fmt.Fprintf(e.stdout, "  %6.2f - %6.2f s  %14s\n", prev.Seconds(), s.At.Seconds(), units.FormatRate(uint64(s.BitsPerSecond)))
			prev = s.At
		}
	}
	res, err := traffic.Bulk(ctx, dial, addr, o)
	if err != nil {
		return trafficFail(e, "bulk", err)
	}
	if *asJSON {
		return printJSON(e, "bulk", res)
	}
	fmt.Fprintln(e.stdout, res)
	return exitOK
}

const trafficUDPDoc = `Usage: braid traffic udp ADDR --rate RATE [--size 1200] [--duration 10s] [--json]

Sends numbered, timestamped UDP datagrams to the server at ADDR at a steady rate for the
duration, then asks the server (over a TCP control connection to ADDR) what arrived. Reports
datagrams sent and received, loss (by sequence number, in datagrams and percent), duplicates,
reordering (datagrams that arrived after one with a higher sequence number), the RFC 3550
interarrival jitter, and the achieved send rate.

RATE counts whole IP packets: payload plus the 8-byte UDP header plus the IP header (20 bytes
for IPv4, 40 for IPv6). It is a number of bit/s with an optional unit: bit, kbit, mbit, gbit
(powers of 1000; kbps, mbps, gbps are synonyms that count bits too). The sender keeps to a
schedule: when it falls behind it catches up with a burst, but on average it never exceeds RATE.

The datagrams go to the host of ADDR at the UDP port the server announces.

Example:
  braid traffic udp 10.2.0.10 --rate 10mbit
  braid traffic udp [fd00:2::10]:5201 --rate 1gbit --size 1400 --duration 5s --json
`

func trafficUDP(e env, args []string) int {
	fs := newFlags(e, "braid traffic udp", trafficUDPDoc)
	rate := fs.String("rate", "", "send rate of IP packets, e.g. 10mbit (required)")
	size := fs.Int("size", 1200, fmt.Sprintf("UDP payload bytes per datagram (%d to %d)", traffic.MinUDPSize, traffic.MaxUDPSize))
	duration := fs.Duration("duration", 10*time.Second, "how long to send")
	asJSON := fs.Bool("json", false, "print the result as JSON (durations in ns, rates in bit/s) instead of text")
	addr, done, code := trafficArgs(e, fs, "udp", args)
	if done {
		return code
	}
	if *rate == "" {
		return trafficUsage(e, "udp", "--rate is required")
	}
	bps, err := units.ParseRate(*rate)
	if err != nil {
		return trafficUsage(e, "udp", "%v", err)
	}
	if bps < traffic.MinUDPRate || bps > traffic.MaxUDPRate {
		return trafficUsage(e, "udp", "--rate must be between 1kbit and 1000gbit")
	}
	if *size < traffic.MinUDPSize || *size > traffic.MaxUDPSize {
		return trafficUsage(e, "udp", "--size must be between %d and %d", traffic.MinUDPSize, traffic.MaxUDPSize)
	}
	if *duration < traffic.MinDuration {
		return trafficUsage(e, "udp", "--duration must be at least %v", traffic.MinDuration)
	}
	ctx, cancel := signalContext()
	defer cancel()
	res, err := traffic.UDP(ctx, traffic.NetDial, addr, traffic.UDPOptions{Rate: bps, Size: *size, Duration: *duration})
	if err != nil {
		return trafficFail(e, "udp", err)
	}
	if *asJSON {
		return printJSON(e, "udp", res)
	}
	fmt.Fprintln(e.stdout, res)
	return exitOK
}

const trafficRRDoc = `Usage: braid traffic rr ADDR [--count 100] [--new-conn] [--size 64] [--response-size N] [--json]

Measures request/response latency against the server at ADDR: sends --count requests of --size
bytes, one after the other, each answered by a response of --response-size bytes (default: the
same as --size), and reports the minimum, median, 90th and 99th percentile (nearest rank),
maximum and mean. By default all requests share one TCP connection; with --new-conn every
request opens its own connection, and its latency includes the TCP handshake.

Example:
  braid traffic rr 10.2.0.10
  braid traffic rr 10.2.0.10 --new-conn --count 20
  braid traffic rr [::1] --size 1 --response-size 100000 --json
`

func trafficRR(e env, args []string) int {
	fs := newFlags(e, "braid traffic rr", trafficRRDoc)
	count := fs.Int("count", 100, "number of requests")
	newConn := fs.Bool("new-conn", false, "open a new TCP connection for every request")
	size := fs.Int("size", 64, fmt.Sprintf("request bytes (1 to %d)", traffic.MaxRRSize))
	respSize := fs.Int("response-size", 0, "response bytes; default the same as --size")
	asJSON := fs.Bool("json", false, "print the result as JSON (durations in ns) instead of text")
	addr, done, code := trafficArgs(e, fs, "rr", args)
	if done {
		return code
	}
	if *respSize == 0 {
		*respSize = *size
	}
	if *count < 1 {
		return trafficUsage(e, "rr", "--count must be at least 1")
	}
	if *size < 1 || *size > traffic.MaxRRSize || *respSize < 1 || *respSize > traffic.MaxRRSize {
		return trafficUsage(e, "rr", "--size and --response-size must be between 1 and %d", traffic.MaxRRSize)
	}
	ctx, cancel := signalContext()
	defer cancel()
	res, err := traffic.RR(ctx, traffic.NetDial, addr, traffic.RROptions{Count: *count, NewConn: *newConn, RequestSize: *size, ResponseSize: *respSize})
	if err != nil {
		return trafficFail(e, "rr", err)
	}
	if *asJSON {
		return printJSON(e, "rr", res)
	}
	fmt.Fprintln(e.stdout, res)
	return exitOK
}

const trafficFileDoc = `Usage: braid traffic file ADDR --size SIZE [--reverse] [--seed N] [--json]

Transfers SIZE bytes to the server at ADDR (with --reverse, from it) and checks that they arrive
intact. The content is a pseudo-random stream determined by --seed (ChaCha8), so it does not
compress and never repeats; the sender and the receiver each hash what they sent and got with
SHA-256, and the transfer is intact when the sums match and every byte arrived. The completion
time runs from the first byte sent to the receiver's confirmation (for a download: from the
request to the last byte).

SIZE is a number of bytes with an optional unit: b, kb, mb, gb (powers of 1000) or KiB, MiB, GiB
(powers of 1024).

The exit status is 1 when the transfer is corrupted.

Example:
  braid traffic file 10.2.0.10 --size 100MB
  braid traffic file 10.2.0.10 --size 1GiB --reverse --json
`

func trafficFile(e env, args []string) int {
	fs := newFlags(e, "braid traffic file", trafficFileDoc)
	sizeText := fs.String("size", "", "bytes to transfer, e.g. 100MB (required)")
	reverse := fs.Bool("reverse", false, "download: the server sends, the client receives")
	seed := fs.Uint64("seed", 1, "selects the pseudo-random content")
	asJSON := fs.Bool("json", false, "print the result as JSON (durations in ns, sums in hex) instead of text")
	addr, done, code := trafficArgs(e, fs, "file", args)
	if done {
		return code
	}
	if *sizeText == "" {
		return trafficUsage(e, "file", "--size is required")
	}
	size, err := units.ParseSize(*sizeText)
	if err != nil {
		return trafficUsage(e, "file", "%v", err)
	}
	if size < 1 || int64(size) > traffic.MaxFileSize {
		return trafficUsage(e, "file", "--size must be between 1 byte and %d bytes", int64(traffic.MaxFileSize))
	}
	ctx, cancel := signalContext()
	defer cancel()
	res, err := traffic.File(ctx, traffic.NetDial, addr, traffic.FileOptions{Size: int64(size), Seed: *seed, Reverse: *reverse})
	if err != nil {
		return trafficFail(e, "file", err)
	}
	if *asJSON {
		printJSON(e, "file", res)
	} else {
		fmt.Fprintln(e.stdout, res)
	}
	if !res.Intact {
		fmt.Fprintf(e.stderr, "braid traffic file: the transfer arrived corrupted (%d of %d bytes, sums differ: %v)\n",
			res.Bytes, res.Size, res.SentSHA256 != res.ReceivedSHA256)
		return exitError
	}
	return exitOK
}
