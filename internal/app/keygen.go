package app

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"braid/internal/tunnel/session"
)

func init() {
	commands["keygen"] = command{summary: "make a tunnel key pair (peers are identified by their public keys)", run: runKeygen}
}

const keygenDoc = `Usage: braid keygen [--out FILE]
       braid keygen --public < FILE

Makes a new random X25519 private key for a braid tunnel endpoint and prints it in base64, or
writes it to FILE (created with mode 0600, never overwritten). With --public, reads a private key
on standard input and prints its public key: give that to the peers, which list it in their
site file. braid has no default key: every endpoint needs its own.

Example:
  braid keygen --out /etc/braid/site-a.key
  braid keygen --public < /etc/braid/site-a.key
`

func runKeygen(e env, args []string) int {
	fs := newFlags(e, "braid keygen", keygenDoc)
	out := fs.String("out", "", "write the private key to `FILE` (mode 0600) instead of standard output")
	public := fs.Bool("public", false, "read a private key on standard input and print its public key")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(e.stderr, "braid keygen: takes no arguments (see 'braid keygen --help')")
		return exitUsage
	}
	if *public {
		line, err := bufio.NewReader(e.stdin).ReadString('\n')
		if err != nil && line == "" {
			fmt.Fprintln(e.stderr, "braid keygen --public: no private key on standard input")
			return exitError
		}
		k, err := session.ParsePrivateKey(strings.TrimSpace(line))
		if err != nil {
			fmt.Fprintf(e.stderr, "braid keygen --public: %v\n", err)
			return exitError
		}
		fmt.Fprintln(e.stdout, k.Public())
		return exitOK
	}
	k, err := session.GenerateKey()
	if err != nil {
		fmt.Fprintf(e.stderr, "braid keygen: %v\n", err)
		return exitError
	}
	if *out == "" {
		fmt.Fprintln(e.stdout, k)
		return exitOK
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		fmt.Fprintf(e.stderr, "braid keygen: %v\n", err)
		return exitError
	}
	_, err = fmt.Fprintln(f, k)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "braid keygen: %v\n", err)
		return exitError
	}
	fmt.Fprintf(e.stdout, "private key written to %s; public key %s\n", *out, k.Public())
	return exitOK
}
