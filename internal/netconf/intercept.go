// Package netconf changes a machine's network configuration for braid's roles and undoes it:
// the federation proxy's interception (nftables rules) and the policy routing that delivers
// intercepted and transparent traffic to local sockets.
//
// Every change is made so that it can be found again without state: one nftables table of a
// fixed name, policy rules and routes identified by their mark and table. Remove undoes a
// configuration; Cleanup removes whatever a killed process left behind.
package netconf

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Table is the nftables table (family inet) of the proxy's rules.
const Table = "braid_proxy"

// Mode is how connections are intercepted.
type Mode string

const (
	ModeTProxy   Mode = "tproxy"   // TPROXY to a transparent listener: no NAT
	ModeRedirect Mode = "redirect" // REDIRECT (destination NAT) to a listener
	ModeNone     Mode = "none"     // no interception; only the transparent-socket rule
)

// Intercept is the interception of a proxy: per tenant, TCP from its sources to its
// destinations goes to its port.
type Intercept struct {
	Mode       Mode
	FwMark     uint32 // marks packets for the local socket: TPROXYed and transparent replies
	RouteTable int    // table of the 'local' routes that deliver marked packets
	Tenants    []InterceptTenant
}

// InterceptTenant is one tenant's rule.
type InterceptTenant struct {
	Name         string
	Sources      []netip.Prefix
	Destinations []netip.Prefix
	Port         uint16
}

// ErrNoNft is returned when the nft program is missing.
var ErrNoNft = errors.New("netconf: the nft program is missing (install nftables; scripts/deps.sh does)")

// Script returns the nft script that installs the interception (it first deletes a table of
// the same name, so that installing twice leaves one copy).
func (ic Intercept) Script() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\ntable inet %s {\n", Table, Table, Table)
	b.WriteString("\tchain prerouting {\n\t\ttype filter hook prerouting priority mangle; policy accept;\n")
	// Packets of connections that already have a transparent socket here (intercepted ones,
	// and the far side's connections from a client's address): deliver them to it.
	fmt.Fprintf(&b, "\t\tmeta l4proto tcp socket transparent 1 meta mark set 0x%x accept\n", ic.FwMark)
	if ic.Mode == ModeTProxy {
		for _, t := range ic.Tenants {
			for _, fam := range []string{"ip", "ip6"} {
				src, dst := set(t.Sources, fam == "ip"), set(t.Destinations, fam == "ip")
				if src == "" || dst == "" {
					continue
				}
				fmt.Fprintf(&b, "\t\tmeta l4proto tcp %s saddr %s %s daddr %s tproxy %s to :%d meta mark set 0x%x accept comment \"tenant %s\"\n",
					fam, src, fam, dst, fam, t.Port, ic.FwMark, t.Name)
			}
		}
	}
	b.WriteString("\t}\n")
	if ic.Mode == ModeTProxy {
		// Fail closed: tenant traffic that found no proxy socket (the proxy is draining or
		// gone) is refused with a reset instead of leaving the site unproxied.
		b.WriteString("\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n")
		for _, t := range ic.Tenants {
			for _, fam := range []string{"ip", "ip6"} {
				src, dst := set(t.Sources, fam == "ip"), set(t.Destinations, fam == "ip")
				if src == "" || dst == "" {
					continue
				}
				fmt.Fprintf(&b, "\t\tmeta l4proto tcp %s saddr %s %s daddr %s reject with tcp reset comment \"tenant %s\"\n", fam, src, fam, dst, t.Name)
			}
		}
		b.WriteString("\t}\n")
	}
	if ic.Mode == ModeRedirect {
		b.WriteString("\tchain nat_prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n")
		for _, t := range ic.Tenants {
			for _, fam := range []string{"ip", "ip6"} {
				src, dst := set(t.Sources, fam == "ip"), set(t.Destinations, fam == "ip")
				if src == "" || dst == "" {
					continue
				}
				fmt.Fprintf(&b, "\t\tmeta l4proto tcp %s saddr %s %s daddr %s redirect to :%d comment \"tenant %s\"\n", fam, src, fam, dst, t.Port, t.Name)
			}
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// set returns the prefixes of one family as an nft anonymous set, or "".
func set(ps []netip.Prefix, v4 bool) string {
	var out []string
	for _, p := range ps {
		if p.Addr().Is4() == v4 {
			out = append(out, p.Masked().String())
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "{ " + strings.Join(out, ", ") + " }"
}

func nft(script string) error {
	path, err := exec.LookPath("nft")
	if err != nil {
		return ErrNoNft
	}
	cmd := exec.Command(path, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("netconf: nft: %v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Install installs the rules and the policy routing (in the calling thread's namespace). On
// error nothing of it is left.
func Install(ic Intercept) (err error) {
	if ic.FwMark == 0 || ic.RouteTable == 0 {
		return errors.New("netconf: intercept needs a mark and a table")
	}
	defer func() {
		if err != nil {
			Remove(ic)
		}
	}()
	if err := nft(ic.Script()); err != nil {
		return err
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("netconf: loopback: %w", err)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		r := netlink.NewRule()
		r.Family, r.Mark, r.Table = fam, ic.FwMark, ic.RouteTable
		mask := uint32(0xFFFFFFFF)
		r.Mask = &mask
		if err := netlink.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("netconf: ip rule fwmark 0x%x lookup %d: %w", ic.FwMark, ic.RouteTable, err)
		}
		dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if fam == unix.AF_INET6 {
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		rt := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst, Table: ic.RouteTable, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST, Family: fam}
		if err := netlink.RouteReplace(rt); err != nil {
			return fmt.Errorf("netconf: local route in table %d: %w", ic.RouteTable, err)
		}
	}
	return nil
}

// Remove removes what Install installed; it tries everything and returns the first error.
func Remove(ic Intercept) error {
	return Cleanup(ic.FwMark, ic.RouteTable)
}

// Cleanup removes the proxy's table, the policy rules of mark and the routes of table, as a
// killed proxy leaves them. Nothing there is not an error.
func Cleanup(fwmark uint32, table int) error {
	var errs []error
	if err := nft(fmt.Sprintf("table inet %s\ndelete table inet %s\n", Table, Table)); err != nil {
		errs = append(errs, err)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := netlink.RuleList(fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("netconf: list rules: %w", err))
			continue
		}
		for _, r := range rules {
			if r.Mark == fwmark && r.Table == table {
				if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("netconf: delete rule: %w", err))
				}
			}
		}
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = append(errs, fmt.Errorf("netconf: list routes: %w", err))
			continue
		}
		for _, rt := range routes {
			if err := netlink.RouteDel(&rt); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("netconf: delete route: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// Leftovers describes what of the proxy's configuration is present: the table, rules and
// routes. Tests and `braid proxy --cleanup` use it to check.
func Leftovers(fwmark uint32, table int) ([]string, error) {
	var out []string
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, ErrNoNft
	}
	list, err := exec.Command(path, "list", "tables").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("netconf: nft list tables: %v: %s", err, list)
	}
	if strings.Contains(string(list), "table inet "+Table+"\n") || strings.HasSuffix(strings.TrimSpace(string(list)), "table inet "+Table) {
		out = append(out, "nftables table inet "+Table)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := netlink.RuleList(fam)
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			if r.Mark == fwmark && r.Table == table {
				out = append(out, fmt.Sprintf("rule fwmark 0x%x lookup %d (family %d)", fwmark, table, fam))
			}
		}
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, err
		}
		for _, rt := range routes {
			out = append(out, fmt.Sprintf("route %v table %d", rt.Dst, table))
		}
	}
	return out, nil
}
