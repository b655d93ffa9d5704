package config

import (
	"strings"
	"testing"
	"time"
)

func TestLoadLB(t *testing.T) {
	doc := `
[lb]
interface = "wan0"
mode = "ipip"
encap_source4 = "192.0.2.1"
collision = "drop"
token_idle = "5m"
learn_rate = 10

[[lb.service]]
vip = "203.0.113.80:443"

[[lb.backend]]
name = "web1"
mac = "02:00:00:00:00:01"
address = "10.50.0.1"
health = "10.50.0.1:443"

[[lb.backend]]
name = "web2"
mac = "02:00:00:00:00:02"
address = "10.50.0.2"
weight = 0
stateless_port = 5002
`
	lb, err := LoadLB("site.toml", []byte(doc), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	if lb.Interface != "wan0" || lb.Mode != "ipip" || lb.Collision != "drop" || lb.TokenIdle != 5*time.Minute ||
		lb.LearnRate != 10 || lb.LearnBurst != 200 || !lb.Aware || len(lb.Services) != 1 || lb.Services[0].Port() != 443 {
		t.Errorf("lb %+v", lb)
	}
	if len(lb.Backends) != 2 || lb.Backends[0].Weight != 1 || lb.Backends[1].Weight != 0 || lb.Backends[1].StatelessPort != 5002 ||
		lb.Backends[0].MAC.String() != "02:00:00:00:00:01" {
		t.Errorf("backends %+v", lb.Backends)
	}
}

func TestLoadLBErrors(t *testing.T) {
	doc := `[lb]
interface = "wan0"
mode = "tunnel"
metrics = "nowhere"

[[lb.service]]
vip = "203.0.113.80"

[[lb.backend]]
name = "web1"
mac = "not-a-mac"
weight = 5000

[[lb.backend]]
name = "web1"
mac = "02:00:00:00:00:02"
health = "x"
bogus = 1
`
	_, err := LoadLB("site.toml", []byte(doc), newEnv())
	if err == nil {
		t.Fatal("no error")
	}
	// The strict decoder reports the unknown key first; without it, every other problem.
	if !strings.Contains(err.Error(), "site.toml:18") || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown key not reported with its line: %v", err)
	}
	doc = strings.Replace(doc, "bogus = 1\n", "", 1)
	_, err = LoadLB("site.toml", []byte(doc), newEnv())
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`site.toml:3: lb: mode "tunnel"`,
		`site.toml:4: lb: metrics "nowhere"`,
		`site.toml:7: service 1: vip "203.0.113.80": want address:port`,
		`site.toml:11: backend web1: mac "not-a-mac"`,
		`site.toml:12: backend web1: weight 5000 outside 0..1000`,
		`site.toml:15: backend web1: name "web1": another backend has this name`,
		`site.toml:17: backend web1: health "x"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	if _, err := LoadLB("site.toml", []byte("[tunnel]\n"), nil); err == nil || !strings.Contains(err.Error(), "no [lb] section") {
		t.Errorf("no section: %v", err)
	}
	_, err = LoadLB("site.toml", []byte("[lb]\ninterface = \"nosuch0\"\n[[lb.service]]\nvip = \"10.0.0.1:80\"\n[[lb.backend]]\nname = \"a\"\nmac = \"02:00:00:00:00:01\"\n"), newEnv())
	if err == nil || !strings.Contains(err.Error(), `site.toml:2: lb: interface "nosuch0" does not exist`) {
		t.Errorf("missing interface: %v", err)
	}
}

// TestLBTokenSizes: the token tables follow the rates unless set, and tables too small for
// the rates are refused with the size they need.
func TestLBTokenSizes(t *testing.T) {
	const head = "[lb]\ninterface = \"wan0\"\n"
	const tail = "\n[[lb.service]]\nvip = \"203.0.113.80:443\"\n[[lb.backend]]\nname = \"web1\"\nmac = \"02:00:00:00:00:01\"\n"
	lb, err := LoadLB("site.toml", []byte(head+tail), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	d := LBDefaults()
	if lb.PendingTable != 1<<19 || lb.TokenTable != 1<<18 || d.PendingTable != lb.PendingTable || d.TokenTable != lb.TokenTable ||
		lb.TokenUnjoined != 10*time.Second || lb.EmbryonicTable != 1<<18 {
		t.Fatalf("defaults: pending %d, joined %d, embryonic %d, unjoined %s", lb.PendingTable, lb.TokenTable, lb.EmbryonicTable, lb.TokenUnjoined)
	}
	// Twice the flood rate: twice the pending table; a higher promotion rate: a larger joined table.
	lb, err = LoadLB("site.toml", []byte(head+"flood_rate = 40000\nglobal_rate = 10000\ntoken_unjoined = \"10s\"\n"+tail), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	if lb.PendingTable != 1<<20 || lb.TokenTable != 1<<20 {
		t.Fatalf("from the rates: pending %d, joined %d", lb.PendingTable, lb.TokenTable)
	}
	// Explicit sizes win, unless too small.
	lb, err = LoadLB("site.toml", []byte(head+"pending_table = 300000\ntoken_table = 150000\nembryonic_table = 4096\n"+tail), newEnv())
	if err != nil || lb.PendingTable != 300000 || lb.TokenTable != 150000 || lb.EmbryonicTable != 4096 {
		t.Fatalf("explicit sizes: %v %+v", err, lb)
	}
	_, err = LoadLB("site.toml", []byte(head+"pending_table = 100000\ntoken_table = 50000\n"+tail), newEnv())
	if err == nil || !strings.Contains(err.Error(), "pending_table 100000") || !strings.Contains(err.Error(), "want at least 262144") ||
		!strings.Contains(err.Error(), "token_table 50000") {
		t.Fatalf("too small tables: %v", err)
	}
}
