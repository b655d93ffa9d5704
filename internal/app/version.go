package app

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"braid/internal/tunnel/session"
)

// Commit is the commit the binary was built from, set at build time with
// -ldflags "-X braid/internal/app.Commit=..." (the Makefile does); without it, the revision the
// go command stamped into the build information is used, when there is one.
var Commit = ""

// buildInfo is what 'braid version' prints: the version (git describe), the commit and the Go
// toolchain that built the binary.
type buildInfo struct {
	Version, Commit, Go, Platform string
}

func currentBuild() buildInfo {
	b := buildInfo{Version: Version, Commit: Commit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if b.Commit == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			var rev, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if rev != "" && modified == "true" {
				rev += "-dirty"
			}
			b.Commit = rev
		}
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

// printVersion writes 'braid version': the version, then the commit and the Go version.
func printVersion(w io.Writer) {
	b := currentBuild()
	fmt.Fprintf(w, "braid %s\ncommit %s\nbuilt with %s %s\n", b.Version, b.Commit, b.Go, b.Platform)
	// What a rolling upgrade needs to know: two tunnels talk when they share a version
	// (docs/tunnel-wire.md, "Protocol versions").
	fmt.Fprintf(w, "tunnel protocol versions %s\n", session.Supported)
}
