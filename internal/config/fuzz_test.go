package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The loaders of every role's section take a site file an operator wrote, or a file anyone
// could hand them (issue 18 item 16). Whatever the bytes: no panic; either a configuration or
// an error, not both; every error is a *Error naming the file and saying why, with its line
// whenever the file has the section (an error about the section missing has none).
func fuzzLoader(f *testing.F, section string, load func(data []byte) (loaded bool, err error)) {
	f.Helper()
	files, _ := filepath.Glob("../../examples/*.toml")
	more, _ := filepath.Glob("testdata/*.toml")
	for _, p := range append(files, more...) {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("[" + section + "]\n"))
	f.Add([]byte("[" + section + "]\nmetrics = 1\nunknown_key = true\n"))
	f.Add([]byte("[" + section + "\n"))
	f.Add([]byte("[" + section + "]\n[[" + section + ".uplink]]\nname = \"a\"\naddress = \"not an address\"\n"))
	f.Add([]byte(proxyFuzzSeed))
	f.Fuzz(func(t *testing.T, data []byte) {
		loaded, err := load(data)
		if loaded == (err != nil) {
			t.Fatalf("a configuration %v and the error %v: want exactly one", loaded, err)
		}
		if err == nil {
			return
		}
		for _, e := range flatten(t, err) {
			if e.File != "fuzz.toml" || e.Reason == "" {
				t.Fatalf("error without its file or reason: %#v", e)
			}
			// A line, unless the error is about the section missing from the file altogether.
			if e.Line == 0 && !strings.HasPrefix(e.Reason, "no ["+section+"] section") && strings.Contains(string(data), "["+section) {
				t.Fatalf("error without a line: %v", e)
			}
		}
	})
}

const proxyFuzzSeed = `
[proxy]
mode = "redirect"
private_key_file = "proxy.key"
pool = 3
drain_timeout = "5s"
backup = ["lte"]

[[proxy.uplink]]
name = "fibre"
interface = "wan0"
address = "192.0.2.1"

[[proxy.tenant]]
name = "blue"
networks = ["10.1.0.0/24", "fd01::/64"]
port = 7001
peer_port = 7101
socks = "10.1.0.254:1080"
  [[proxy.tenant.peer]]
  name = "site-b"
  public_key = "AAAA"
  address = ["198.51.100.1:7101"]
  networks = "10.2.0.0/24"
`

func FuzzLoadPM(f *testing.F) {
	fuzzLoader(f, "pm", func(data []byte) (bool, error) {
		c, err := LoadPM("fuzz.toml", data, newEnv())
		return c != nil, err
	})
}

func FuzzLoadLB(f *testing.F) {
	fuzzLoader(f, "lb", func(data []byte) (bool, error) {
		c, err := LoadLB("fuzz.toml", data, newEnv())
		return c != nil, err
	})
}

func FuzzLoadProxy(f *testing.F) {
	fuzzLoader(f, "proxy", func(data []byte) (bool, error) {
		c, err := LoadProxy("fuzz.toml", data, newEnv())
		return c != nil, err
	})
}

func FuzzLoadMapserver(f *testing.F) {
	fuzzLoader(f, "mapserver", func(data []byte) (bool, error) {
		c, err := LoadMapserver("fuzz.toml", data)
		return c != nil, err
	})
}

func FuzzLoadXTR(f *testing.F) {
	fuzzLoader(f, "xtr", func(data []byte) (bool, error) {
		c, err := LoadXTR("fuzz.toml", data, newEnv())
		return c != nil, err
	})
}
