package lab

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"braid/internal/lab/topo"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NATTable is the nftables table (family inet) that holds a NAT host's rules.
const NATTable = "braid-nat"

// natRuleset returns the nftables ruleset of a NAT: masquerade on the way out of every outside
// interface (IPv4 only unless n.IPv6), and on the way in only what belongs to a mapping.
func natRuleset(n *topo.NAT) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", NATTable)
	b.WriteString("  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n")
	masq := "masquerade"
	if n.RandomPorts {
		masq += " fully-random"
	}
	family := "meta nfproto ipv4 "
	if n.IPv6 {
		family = ""
	}
	for _, o := range n.Outside {
		if strings.ContainsAny(o, "\"\\") {
			return "", fmt.Errorf("outside interface %q: nft cannot quote it", o)
		}
		fmt.Fprintf(&b, "    oifname %q %s%s\n", o, family, masq)
	}
	b.WriteString("  }\n  chain forward {\n    type filter hook forward priority filter; policy accept;\n")
	for _, o := range n.Outside {
		fmt.Fprintf(&b, "    iifname %q ct state != { established, related } drop\n", o)
	}
	b.WriteString("  }\n}\n")
	return b.String(), nil
}

// setupNAT installs the NAT of host h: its nftables rules, then (conntrack now exists in the
// namespace) its UDP timeouts.
func (h *Host) setupNAT(n *topo.NAT) error {
	rules, err := natRuleset(n)
	if err != nil {
		return err
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		return fmt.Errorf("NAT needs nft (Debian package nftables; scripts/deps.sh installs it): %w", err)
	}
	if out, err := h.runHere(nft, []byte(rules), "-f", "-"); err != nil {
		return fmt.Errorf("nft: %w: %s", err, bytes.TrimSpace(out))
	}
	unreplied, stream := n.UDPTimeouts()
	for _, t := range []struct {
		key string
		d   time.Duration
	}{{"netfilter/nf_conntrack_udp_timeout", unreplied}, {"netfilter/nf_conntrack_udp_timeout_stream", stream}} {
		if t.d == 0 {
			continue
		}
		if err := h.NS.Sysctl(t.key, strconv.Itoa(int(t.d/time.Second))); err != nil {
			return err
		}
	}
	return nil
}

// runHere runs a short command inside the host (on its namespace thread) and returns its output.
func (h *Host) runHere(path string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.Command(path, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := h.NS.Do(cmd.Run)
	return out.Bytes(), err
}

// NAT returns the host's NAT as the topology declares it, or nil when the host is no NAT.
func (h *Host) NAT() *topo.NAT { return h.nat }

// ErrNoNAT reports a NAT request to a host that is no NAT.
var ErrNoNAT = errors.New("lab: not a NAT host")

// Mapping is one NAT mapping: a connection-tracking entry of a NAT host whose source was
// translated.
type Mapping struct {
	Proto   string         // "udp", "tcp", "icmp", "icmpv6" or the protocol number
	Inside  netip.AddrPort // the source as the host behind the NAT sent it
	Outside netip.AddrPort // the source after translation, as the remote end sees it
	Remote  netip.AddrPort // the destination
	// Expires is how long the mapping lives on without traffic, as the kernel reported it
	// (whole seconds).
	Expires time.Duration
}

func (m Mapping) String() string {
	return fmt.Sprintf("%s %s -> %s => %s (expires in %v)", m.Proto, m.Inside, m.Remote, m.Outside, m.Expires)
}

var families = []netlink.InetFamily{unix.AF_INET, unix.AF_INET6}

// NATMappings lists the host's current NAT mappings, IPv4 first.
func (h *Host) NATMappings() ([]Mapping, error) {
	if h.nat == nil {
		return nil, fmt.Errorf("%w: host %s", ErrNoNAT, h.Name)
	}
	var out []Mapping
	for _, fam := range families {
		flows, err := h.NS.Netlink().ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return nil, fmt.Errorf("lab: host %s: conntrack: %w", h.Name, err)
		}
		for _, f := range flows {
			if m, ok := mappingOf(f); ok {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

func mappingOf(f *netlink.ConntrackFlow) (Mapping, bool) {
	ap := func(ip []byte, port uint16) netip.AddrPort {
		a, _ := netip.AddrFromSlice(ip)
		return netip.AddrPortFrom(a.Unmap(), port)
	}
	// The reply tuple is the remote end's view: from Remote to the translated source.
	inside, remote := ap(f.Forward.SrcIP, f.Forward.SrcPort), ap(f.Forward.DstIP, f.Forward.DstPort)
	outside := ap(f.Reverse.DstIP, f.Reverse.DstPort)
	if outside == inside {
		return Mapping{}, false
	}
	return Mapping{
		Proto: protoName(f.Forward.Protocol), Inside: inside, Outside: outside, Remote: remote,
		Expires: time.Duration(f.TimeOut) * time.Second,
	}, true
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}

type matchAll struct{}

func (matchAll) MatchConntrackFlow(*netlink.ConntrackFlow) bool { return true }

// FlushNAT removes every mapping of the NAT host (every connection-tracking entry of its
// namespace), as a NAT that reboots or runs out of table space does: the next packet of each
// flow gets a new mapping (with RandomPorts, a new source port), and packets from outside to an
// old mapping are dropped until then. It returns how many entries it removed.
func (h *Host) FlushNAT() (int, error) {
	if h.nat == nil {
		return 0, fmt.Errorf("%w: host %s", ErrNoNAT, h.Name)
	}
	n := 0
	for _, fam := range families {
		c, err := h.NS.Netlink().ConntrackDeleteFilters(netlink.ConntrackTable, fam, matchAll{})
		n += int(c)
		if err != nil {
			return n, fmt.Errorf("lab: host %s: conntrack flush: %w", h.Name, err)
		}
	}
	return n, nil
}

// mappingsTo matches the connection-tracking entries whose replies go to an address: the
// mappings made with that address as the translated source.
type mappingsTo netip.Addr

func (a mappingsTo) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	ip, ok := netip.AddrFromSlice(f.Reverse.DstIP)
	return ok && ip.Unmap() == netip.Addr(a)
}

// forgetMappings removes the mappings made with the outside address a, at once.
func (h *Host) forgetMappings(a netip.Addr) {
	fam := netlink.InetFamily(unix.AF_INET)
	if a.Is6() {
		fam = unix.AF_INET6
	}
	if _, err := h.NS.Netlink().ConntrackDeleteFilters(netlink.ConntrackTable, fam, mappingsTo(a)); err != nil {
		h.lab.log.Warn("NAT mappings of a removed address", "host", h.Name, "addr", a, "err", err)
	}
}
