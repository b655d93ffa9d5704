package app

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"braid/internal/config/mptconf"
)

const importMPTDoc = `Usage: braid tunnel import-mpt --interface conf/interface.conf [--out FILE] CONNECTION.conf...

Converts the configuration of MPT (the MPT-GRE reference daemon) into the [tunnel] section of a
braid site file in mode "mpt", which interoperates with MPT peers: the TUN device of [tun_0] in
interface.conf, one uplink per local end of the paths (interface_name, private_ipaddr,
local_port) and, for each connection file (conf/connections/<name>.conf, or ipv4.conf), a peer
with its paths, routes ([net_N] dst_addr and ip_remote), reordering and keepalive settings.

The command ports (cmdport_local, remote_cmd_port) are carried over with auth_type and, for
auth_type 2, auth_key: braid speaks MPT's path-status exchange on the command port, so a path
that failed comes back on both sides. The site file then holds a secret, and --out writes it
readable by its owner only.

What braid cannot carry over is printed as "file:line: warning: ..." on standard error and
marked WARNING in the output: public_ipaddr and gw_ipaddr (braid binds private_ipaddr and
installs no routes), accept_remote, permission, saved states and weight_in. auth_type covers
the command port only: mode "mpt" carries data unauthenticated and unencrypted, like MPT, so
use mode "braid" with 'braid keygen' keys where both ends run braid.

The site file goes to standard output, or to --out FILE, which must not exist yet. Check it on
the site's machine with 'braid tunnel check'.

Example:
  cd /etc/mpt
  braid tunnel import-mpt --interface conf/interface.conf --out /etc/braid/site.toml conf/connections/*.conf
  braid tunnel check --config /etc/braid/site.toml
`

// tunnelImportMPT is 'braid tunnel import-mpt'.
func tunnelImportMPT(e env, args []string) int {
	const name = "braid tunnel import-mpt"
	flags := newFlags(e, name, importMPTDoc)
	ifcFile := flags.String("interface", "", "MPT's interface.conf `FILE` (required)")
	outFile := flags.String("out", "", "write the site file to `FILE`, which must not exist, instead of standard output")
	pos, rest, done, code := parseInterspersed(e, flags, args)
	if done {
		return code
	}
	conns := append(pos, rest...)
	if *ifcFile == "" || len(conns) == 0 {
		fmt.Fprintf(e.stderr, "%s: expected --interface FILE and at least one connection file (see '%s --help')\n", name, name)
		return exitUsage
	}
	if *outFile != "" {
		if _, err := os.Lstat(*outFile); err == nil {
			fmt.Fprintf(e.stderr, "%s: %s exists; not overwritten\n", name, *outFile)
			return exitError
		}
	}

	failed := false
	report := func(err error) {
		failed = true
		var joined interface{ Unwrap() []error }
		if errors.As(err, &joined) {
			for _, x := range joined.Unwrap() {
				fmt.Fprintf(e.stderr, "%v\n", x)
			}
			return
		}
		fmt.Fprintf(e.stderr, "%v\n", err)
	}
	read := func(file string) []byte {
		data, err := os.ReadFile(file)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			report(fmt.Errorf("%s: cannot read: %w", file, err))
			return nil
		}
		return data
	}
	var ifc *mptconf.Interface
	if data := read(*ifcFile); data != nil {
		var err error
		if ifc, err = mptconf.ParseInterface(*ifcFile, data); err != nil {
			report(err)
		}
	}
	var parsed []*mptconf.Connection
	for _, file := range conns {
		data := read(file)
		if data == nil {
			continue
		}
		c, err := mptconf.ParseConnection(file, data)
		if err != nil {
			report(err)
			continue
		}
		parsed = append(parsed, c)
	}
	if failed {
		return exitError
	}

	out, warnings, err := mptconf.ToSiteTOML(ifc, parsed)
	for _, w := range warnings {
		fmt.Fprintln(e.stderr, w)
	}
	if err != nil {
		report(err)
		return exitError
	}
	if *outFile == "" {
		if _, err := e.stdout.Write(out); err != nil {
			fmt.Fprintf(e.stderr, "%s: %v\n", name, err)
			return exitError
		}
		return exitOK
	}
	perm := os.FileMode(0o644)
	if bytes.Contains(out, []byte("\nauth_key = ")) {
		perm = 0o600 // a secret of MPT's control plane
	}
	f, err := os.OpenFile(*outFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\n", name, err)
		return exitError
	}
	_, err = f.Write(out)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(*outFile)
		fmt.Fprintf(e.stderr, "%s: %v\n", name, err)
		return exitError
	}
	fmt.Fprintf(e.stderr, "%s: wrote %s (%d peers, %d warnings); check it with 'braid tunnel check --config %s'\n", name, *outFile, len(parsed), len(warnings), *outFile)
	return exitOK
}
