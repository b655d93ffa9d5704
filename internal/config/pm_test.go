package config

import (
	"strings"
	"testing"
	"time"
)

func TestLoadPM(t *testing.T) {
	doc := `
[pm]
policy = "fullmesh"
metrics = "127.0.0.1:9999"
poll = "50ms"
join_timeout = "2s"
port_base = 40000
port_span = 100
backup = ["lte"]

[[pm.uplink]]
name = "fibre"
interface = "wan0"
address = "192.0.2.1"

[[pm.uplink]]
name = "lte"
interface = "wwan0"
address = "203.0.113.10"
`
	pm, err := LoadPM("site.toml", []byte(doc), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	if pm.Policy != "fullmesh" || pm.Metrics != "127.0.0.1:9999" || pm.Poll != 50*time.Millisecond || pm.JoinTimeout != 2*time.Second ||
		pm.DeadAfter != time.Second || pm.PortBase != 40000 || pm.PortSpan != 100 {
		t.Errorf("pm %+v", pm)
	}
	if len(pm.Uplinks) != 2 || pm.Uplinks[0].Backup || !pm.Uplinks[1].Backup || pm.Uplinks[1].Address.String() != "203.0.113.10" {
		t.Errorf("uplinks %+v", pm.Uplinks)
	}
}

// Without [[pm.uplink]] the tunnel's uplinks serve; without [pm] the defaults.
func TestLoadPMTunnelUplinks(t *testing.T) {
	pm, err := LoadPM("site.toml", []byte(minimal), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	if len(pm.Uplinks) == 0 || pm.Policy != "fullmesh" {
		t.Errorf("pm %+v", pm)
	}
}

func TestLoadPMErrors(t *testing.T) {
	doc := `[pm]
policy = "roundrobin"
backup = ["nope"]
port_base = 65000
port_span = 1000

[[pm.uplink]]
name = "a"
interface = "missing0"
address = "10.0.0.300"
`
	_, err := LoadPM("site.toml", []byte(doc), newEnv())
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		`site.toml:2: pm: policy "roundrobin": known policies are amptcp, fullmesh`,
		`site.toml:3: pm: backup "nope": no uplink has this name`,
		`site.toml:5: pm: port_base 65000 + port_span 1000`,
		`site.toml:9: uplink a: interface "missing0" does not exist`,
		`site.toml:10: uplink a: address "10.0.0.300"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := LoadPM("site.toml", []byte("[pm]\npolcy = 1\n"), newEnv()); err == nil || !strings.Contains(err.Error(), `unknown key "pm.polcy"`) {
		t.Errorf("misspelt key: %v", err)
	}
	if _, err := LoadPM("site.toml", []byte("[pm]\n"), newEnv()); err == nil || !strings.Contains(err.Error(), "no uplinks") {
		t.Errorf("no uplinks: %v", err)
	}
}

func TestLoadPMAMPTCP(t *testing.T) {
	doc := `[pm]
policy = "amptcp"
routing = "bound"
resolvers = ["10.0.9.1", "[fd00:9::1]:4343"]
lookup_timeout = "500ms"
mapping_max_age = "5s"
eid_prefixes = ["192.168.2.7/24"]
min_bytes = 1048576
subflows = 3

[[pm.uplink]]
name = "lan"
interface = "wan0"
address = "192.168.1.1"
`
	pm, err := LoadPM("site.toml", []byte(doc), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	a := pm.AMPTCP
	if pm.Policy != "amptcp" || a.Routing != "bound" || len(a.Resolvers) != 2 || a.Resolvers[0].String() != "10.0.9.1:4342" ||
		a.Resolvers[1].String() != "[fd00:9::1]:4343" || a.LookupTimeout != 500*time.Millisecond || a.MaxAge != 5*time.Second ||
		len(a.EIDPrefixes) != 1 || a.EIDPrefixes[0].String() != "192.168.2.0/24" || a.MinBytes != 1<<20 || a.Subflows != 3 || a.LookupRetries != 2 {
		t.Errorf("amptcp %+v", a)
	}
	bad := `[pm]
policy = "amptcp"
routing = "ecmp"
eid_prefixes = ["nope"]
subflows = 12

[[pm.uplink]]
name = "lan"
interface = "wan0"
address = "192.168.1.1"
`
	_, err = LoadPM("site.toml", []byte(bad), newEnv())
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{`site.toml:2: pm: policy amptcp needs resolvers`, `site.toml:3: pm: routing "ecmp"`,
		`site.toml:4: pm: eid_prefixes[0] "nope" is not a prefix`, `site.toml:5: pm: subflows 12 outside 0..9`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// The rbpm policy ships the timers its figures were measured with (docs/scheduling.md): a
// 50 ms poll and 5 s dead_after and join_timeout, whether it is named in the file or on the
// command line; timers set in the file stay as set.
func TestPMRBPMDefaults(t *testing.T) {
	const ups = "\n[[pm.uplink]]\nname = \"fibre\"\ninterface = \"wan0\"\naddress = \"192.0.2.1\"\n"
	want := func(name string, pm *PM, poll, join, dead time.Duration) {
		t.Helper()
		if pm.Poll != poll || pm.JoinTimeout != join || pm.DeadAfter != dead {
			t.Errorf("%s: poll %v, join_timeout %v, dead_after %v; want %v, %v, %v", name, pm.Poll, pm.JoinTimeout, pm.DeadAfter, poll, join, dead)
		}
	}
	if d := PMPolicyDefaults("rbpm"); d.Poll != 50*time.Millisecond || d.JoinTimeout != 5*time.Second || d.DeadAfter != 5*time.Second {
		t.Errorf("PMPolicyDefaults(rbpm): poll %v, join_timeout %v, dead_after %v", d.Poll, d.JoinTimeout, d.DeadAfter)
	}
	pm, err := LoadPM("site.toml", []byte("[pm]\npolicy = \"rbpm\"\n"+ups), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	want("policy rbpm in the file", pm, 50*time.Millisecond, 5*time.Second, 5*time.Second)

	pm, err = LoadPM("site.toml", []byte("[pm]\n"+ups), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	want("fullmesh", pm, 100*time.Millisecond, time.Second, time.Second)
	pm.UsePolicy("rbpm")
	want("--policy rbpm", pm, 50*time.Millisecond, 5*time.Second, 5*time.Second)

	pm, err = LoadPM("site.toml", []byte("[pm]\npoll = \"200ms\"\ndead_after = \"3s\"\n"+ups), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	pm.UsePolicy("rbpm")
	want("--policy rbpm with poll and dead_after in the file", pm, 200*time.Millisecond, 5*time.Second, 3*time.Second)
	pm.UsePolicy("fullmesh")
	want("--policy fullmesh with poll and dead_after in the file", pm, 200*time.Millisecond, time.Second, 3*time.Second)
}

// join_backoff_max: 30 s unless set, 0 turns the backoff off, and a wait shorter than one join
// timeout, a negative one or one that is no duration is refused with its line.
func TestLoadPMJoinBackoff(t *testing.T) {
	const ups = "\n[[pm.uplink]]\nname = \"a\"\ninterface = \"wan0\"\naddress = \"192.0.2.1\"\n"
	for _, c := range []struct {
		set  string
		want time.Duration
		err  string
	}{
		{"", 30 * time.Second, ""},
		{`join_backoff_max = "2m"`, 2 * time.Minute, ""},
		{`join_backoff_max = "0s"`, 0, ""},
		{`join_backoff_max = "500ms"`, 0, `site.toml:2: pm: join_backoff_max 500ms is shorter than join_timeout 1s`},
		{`join_backoff_max = "-1s"`, 0, `site.toml:2: pm: negative join_backoff_max "-1s"`},
		{`join_backoff_max = "soon"`, 0, `site.toml:2: pm:`},
	} {
		pm, err := LoadPM("site.toml", []byte("[pm]\n"+c.set+"\n"+ups), newEnv())
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want %q", c.set, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.set, err)
			continue
		}
		if pm.JoinBackoffMax != c.want {
			t.Errorf("%q: join_backoff_max %v, want %v", c.set, pm.JoinBackoffMax, c.want)
		}
	}
}
