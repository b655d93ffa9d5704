package topo

import (
	"errors"
	"math"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func route(dst, via, dev string, metric int) Route {
	r := Route{Dst: netip.MustParsePrefix(dst), Dev: dev, Metric: metric}
	if via != "" {
		r.Via = netip.MustParseAddr(via)
	}
	return r
}

func TestLoadExample(t *testing.T) {
	got, err := Load("testdata/two-sites.toml")
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	want := &Topology{
		Name: "two-sites",
		Hosts: []Host{
			{Name: "core", Forward: true, Routes: []Route{
				route("10.1.0.0/24", "10.0.11.1", "", 0),
				route("fd01::/64", "fd00:11::1", "", 0),
				route("10.2.0.0/24", "10.0.21.1", "", 0),
				route("fd02::/64", "fd00:21::1", "", 0),
			}},
			{Name: "r1", Forward: true, Routes: []Route{
				route("10.2.0.0/16", "10.0.11.2", "", 0),
				route("0.0.0.0/0", "10.0.12.2", "", 0),
				route("::/0", "fd00:11::2", "", 0),
				route("198.51.100.0/24", "", "wan1", 10),
			}},
			{Name: "r2", Forward: true, Routes: []Route{
				route("10.1.0.0/16", "10.0.21.2", "", 0),
				route("0.0.0.0/0", "10.0.22.2", "", 0),
				route("::/0", "fd00:21::2", "", 0),
			}},
			{Name: "h1", Routes: []Route{route("0.0.0.0/0", "10.1.0.1", "", 0), route("::/0", "fd01::1", "", 0)}},
			{Name: "h2", Routes: []Route{route("0.0.0.0/0", "10.2.0.1", "", 0), route("::/0", "fd02::1", "", 0)}},
		},
		Links: []Link{
			{
				Name: "r1-fibre",
				A:    Endpoint{"r1", "wan0", pfx("10.0.11.1/30", "fd00:11::1/64")},
				B:    Endpoint{"core", "r1-fibre", pfx("10.0.11.2/30", "fd00:11::2/64")},
				MTU:  1500,
				AB:   Shape{Rate: 100e6, Delay: 5 * ms, Jitter: ms / 2},
				BA:   Shape{Rate: 100e6, Delay: 5 * ms, Jitter: ms / 2},
			},
			{
				Name:    "r1-lte",
				A:       Endpoint{"r1", "wan1", pfx("10.0.12.1/30")},
				B:       Endpoint{"core", "r1-lte", pfx("10.0.12.2/30")},
				MTU:     1400,
				AB:      Shape{Rate: 10e6, Delay: 25 * ms, Jitter: 5 * ms, Loss: 0.5, QueuePackets: 100, QueueBytes: 150_000},
				BA:      Shape{Rate: 50e6, Delay: 25 * ms, Jitter: 5 * ms, Loss: 0.5, QueuePackets: 100, QueueBytes: 150_000},
				Offload: OffloadOff,
			},
			{
				Name: "r2-fibre",
				A:    Endpoint{"r2", "wan0", pfx("10.0.21.1/30", "fd00:21::1/64")},
				B:    Endpoint{"core", "r2-fibre", pfx("10.0.21.2/30", "fd00:21::2/64")},
				MTU:  1500,
				AB:   Shape{Rate: 1e9, Delay: 2 * ms},
				BA:   Shape{Rate: 1e9, Delay: 2 * ms},
			},
			{
				Name: "r2-dsl",
				A:    Endpoint{"r2", "wan1", pfx("10.0.22.1/30")},
				B:    Endpoint{"core", "r2-dsl", pfx("10.0.22.2/30")},
				MTU:  1492,
				AB:   Shape{Rate: 5e6, Delay: 15 * ms, Loss: 0.1},
				BA:   Shape{Rate: 25e6, Delay: 15 * ms, Loss: 0.1, QueueBytes: 64 << 10},
			},
			{
				Name: "h1-r1",
				A:    Endpoint{"h1", "eth0", pfx("10.1.0.2/24", "fd01::2/64")},
				B:    Endpoint{"r1", "eth0", pfx("10.1.0.1/24", "fd01::1/64")},
				MTU:  1500,
			},
			{
				Name:    "h2-r2",
				A:       Endpoint{"h2", "eth0", pfx("10.2.0.2/24", "fd02::2/64")},
				B:       Endpoint{"r2", "eth0", pfx("10.2.0.1/24", "fd02::1/64")},
				MTU:     1500,
				Offload: OffloadOn,
			},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load(two-sites.toml):\n got %+v\nwant %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("Validate of the loaded example: %v", err)
	}
}

func TestParseDefaults(t *testing.T) {
	const doc = `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
[[link]]
a = "a"
b = "b"
delay = 1.5
rate = 2000000
loss = 1
queue_bytes = 3000
[link.ba]
delay = "0"
`
	got, err := Parse("dir/My_Lab.v2.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "my-lab-v2" {
		t.Errorf("Name = %q, want %q", got.Name, "my-lab-v2")
	}
	l := got.Links[1]
	if l.Name != "a-b-2" || l.A.Ifname != "eth1" || l.B.Ifname != "eth1" || l.MTU != 1500 {
		t.Errorf("defaults of the second link: %+v", l)
	}
	wantAB := Shape{Rate: 2e6, Delay: 1500 * time.Microsecond, Loss: 1, QueueBytes: 3000}
	wantBA := wantAB
	wantBA.Delay = 0
	if l.AB != wantAB || l.BA != wantBA {
		t.Errorf("shapes from numbers: got %+v / %+v, want %+v / %+v", l.AB, l.BA, wantAB, wantBA)
	}
}

func TestDefaultName(t *testing.T) {
	for in, want := range map[string]string{
		"lab.toml":                       "lab",
		"/x/Two_Sites.toml":              "two-sites",
		"2-sites.toml":                   "sites",
		"a-very-long-topology-name.toml": "a-very-long-topo",
		"abcdefghijklmno-.toml":          "abcdefghijklmno",
		"123.toml":                       "lab",
		"":                               "lab",
		"über.toml":                      "ber",
		"noext":                          "noext",
	} {
		if got := defaultName(in); got != want {
			t.Errorf("defaultName(%q) = %q, want %q", in, got, want)
		}
	}
}

// badFiles are files that must be rejected, with the line and a part of the reason that the
// error must carry. Each is also a seed of FuzzParse.
var badFiles = []struct {
	name   string
	doc    string
	line   int
	reason string
}{
	{"unknown top-level key", `
name = "x"
colour = "blue"
`, 3, `unknown key "colour"`},
	{"unknown host key", `
[[host]]
name = "a"
[[host]]
name = "b"
fwd = true
`, 6, `unknown key "host[1].fwd"`},
	{"unknown route key", `
[[host]]
name = "a"
route = [ { dst = "default", via = "10.0.0.1" },
          { dst = "10.1.0.0/16", gateway = "10.0.0.1" } ]
`, 5, `unknown key "host[0].route[1].gateway"`},
	{"unknown link key", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
[[link]]
a = "a"
b = "b"
bandwidth = "10mbit"
`, 12, `unknown key "link[1].bandwidth"`},
	{"unknown key in link.ab", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
rate = "10mbit"
[link.ab]
rate = "5mbit"
latency = "5ms"
`, 12, `unknown key "link[0].ab.latency"`},
	{"negative delay", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
[[link]]
a = "a"
b = "b"
delay = "-5ms"
`, 12, `link a-b-2: negative delay "-5ms"`},
	{"negative delay number in link.ba", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
delay = 5
[link.ba]
delay = -5
`, 11, `link a-b: negative delay "-5"`},
	{"loss over 100 %", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
name = "lossy"
a = "a"
b = "b"
loss = "150%"
`, 10, `link lossy: loss over 100 % "150%"`},
	{"loss over 100 as a number in link.ab", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
[link.ab]
loss = 100.5
`, 10, `loss over 100 % "100.5"`},
	{"link to an unknown host", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
[[link]]
a = "a"
b = "c"
`, 11, `link a-c: unknown host "c"`},
	{"duplicate address", `
[[host]]
name = "a"
[[host]]
name = "b"
[[host]]
name = "c"
[[link]]
a = "a"
b = "b"
a_addr = ["10.0.0.1/24", "fd00::1/64"]
b_addr = ["10.0.0.2/24", "fd00::2/64"]
[[link]]
a = "a"
b = "c"
a_addr = "10.0.1.1/24"
b_addr = [
  "10.0.1.2/24",
  "fd00::2/64",
]
`, 19, `link a-c: address fd00::2 on c eth0 is also on b eth0`},
	{"syntax error", `
[[host]]
name = "a"
[[link]
a = "a"
`, 4, `expected ']]'`},
	{"syntax error: unterminated string", `
name = "x
`, 2, `lab.toml:2:`},
	{"type error", `
[[link]]
mtu = "jumbo"
`, 3, `link.mtu: want an integer, not a string`},
	{"bad address", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
a_addr = "10.0.0.1"
`, 9, `invalid address "10.0.0.1"`},
	{"bad rate", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
rate = "fast"
`, 9, `invalid rate "fast"`},
	{"route via not on a link", `
[[host]]
name = "a"
route = [ { dst = "default", via = "10.0.0.9" } ]
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
a_addr = "10.0.1.1/24"
b_addr = "10.0.1.2/24"
`, 4, `host a route 0.0.0.0/0: via 10.0.0.9 is not in a subnet`},
	{"route in an array of tables", `
[[host]]
name = "a"
[[host.route]]
dst = "10.0.0.0/8"
via = "10.0.1.2"
[[host]]
name = "b"
[[host.route]]
dst = "10.0.0.0/8"
via = "10.0.1.1"
[[host.route]]
dst = "10.9.0.0/16"
dev = "nope"
[[link]]
a = "a"
b = "b"
a_addr = "10.0.1.1/24"
b_addr = "10.0.1.2/24"
`, 14, `host b route 10.9.0.0/16: dev "nope" is not an interface of host b`},
	{"default route without via", `
[[host]]
name = "a"
route = [ { dst = "default", dev = "eth0" } ]
`, 4, `dst "default" needs via`},
	{"ipv6 on a small MTU", `
[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "b"
mtu = 1000
a_addr = "fd00::1/64"
`, 9, `MTU 1000 is below the IPv6 minimum`},
	{"duplicate host", `
[[host]]
name = "a"

[[host]]
name = "a"
`, 6, `host a: duplicate host`},
	{"bad topology name", `name = "Lab"`, 1, `topology Lab: name "Lab" must match`},
}

func TestParseErrors(t *testing.T) {
	for _, tt := range badFiles {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("lab.toml", []byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", got)
			}
			if got != nil {
				t.Errorf("Parse returned a topology with the error %v", err)
			}
			// The first error is the one the case is about, others may follow.
			first := strings.SplitN(err.Error(), "\n", 2)[0]
			wantPrefix := "lab.toml:" + strconv.Itoa(tt.line) + ":"
			if !strings.HasPrefix(first, wantPrefix) || !strings.Contains(first, tt.reason) {
				t.Errorf("error %q, want it to start with %q and contain %q", err, wantPrefix, tt.reason)
			}
			var te *Error
			if !errors.As(err, &te) || te.File != "lab.toml" || te.Line != tt.line {
				t.Errorf("error %#v, want a *Error at lab.toml line %d", te, tt.line)
			}
		})
	}
}

func TestParseReportsAllProblems(t *testing.T) {
	const doc = `[[host]]
name = "a"
[[host]]
name = "b"
[[link]]
a = "a"
b = "c"
[[link]]
a = "b"
b = "b"
mtu = 100
`
	_, err := Parse("lab.toml", []byte(doc))
	want := []string{
		`lab.toml:7: link a-c: unknown host "c"`,
		`lab.toml:10: link b-b: link from host b to itself`,
		`lab.toml:11: link b-b: MTU 100 outside 576..65535`,
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("got error\n%v\nwant\n%s", err, strings.Join(want, "\n"))
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := Load("testdata/does-not-exist.toml")
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	example, err := os.ReadFile("testdata/two-sites.toml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	for _, tt := range badFiles {
		f.Add([]byte(tt.doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const filename = "fuzz.toml"
		tp, err := Parse(filename, data)
		if err != nil {
			if tp != nil {
				t.Errorf("Parse returned both a topology and %v", err)
			}
			if !strings.HasPrefix(err.Error(), filename) {
				t.Errorf("error does not start with the file name: %q", err)
			}
			return
		}
		if err := tp.Validate(); err != nil {
			t.Errorf("Parse accepted a topology that Validate rejects: %v", err)
		}
		for _, l := range tp.Links {
			for _, s := range []Shape{l.AB, l.BA} {
				if !(s.Loss >= 0 && s.Loss <= 100) || math.IsNaN(s.Loss) || s.Delay < 0 || s.Jitter < 0 {
					t.Errorf("link %s: bad shape %+v", l.Name, s)
				}
			}
		}
	})
}
