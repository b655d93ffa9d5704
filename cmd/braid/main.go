// Command braid bonds several network paths into connections that are faster than any one path
// and survive the loss of any one. One binary, one subcommand per role; see `braid help`.
package main

import (
	"os"

	"braid/internal/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
