package config

import (
	"strings"
	"testing"
)

// TestRoleControlSockets: mapserver, xtr and pm take a control socket (default an abstract
// one per role), and a name that is neither absolute nor @NAME is reported with its line.
func TestRoleControlSockets(t *testing.T) {
	if MapserverDefaults().Control != "@braid/mapserver" || XTRDefaults().Control != "@braid/xtr" || PMDefaults().Control != "@braid/pm" {
		t.Fatalf("defaults %q %q %q", MapserverDefaults().Control, XTRDefaults().Control, PMDefaults().Control)
	}
	ms, err := LoadMapserver("ms.toml", []byte("[mapserver]\ncontrol = \"/run/braid/ms.sock\"\n[[mapserver.site]]\nname = \"s1\"\nkey = \"k-0123456789abcdef\"\neid_prefixes = [\"192.168.1.0/24\"]\n"))
	if err != nil || ms.Control != "/run/braid/ms.sock" {
		t.Fatalf("mapserver control: %+v %v", ms, err)
	}
	_, err = LoadMapserver("ms.toml", []byte("[mapserver]\ncontrol = \"ms.sock\"\n[[mapserver.site]]\nname = \"s1\"\nkey = \"k-0123456789abcdef\"\neid_prefixes = [\"192.168.1.0/24\"]\n"))
	if err == nil || !strings.Contains(err.Error(), "ms.toml:2:") || !strings.Contains(err.Error(), "want an absolute path") {
		t.Errorf("mapserver relative control: %v", err)
	}
	x := "[xtr]\neid_prefixes = [\"192.168.1.0/24\"]\nmap_resolvers = [\"10.0.9.1:4342\"]\ncontrol = \"@\"\n[[xtr.rloc]]\naddress = \"10.0.1.1\"\n"
	if _, err := LoadXTR("x.toml", []byte(x), newEnv()); err == nil || !strings.Contains(err.Error(), "x.toml:4:") || !strings.Contains(err.Error(), "needs a name after the @") {
		t.Errorf("xtr control @: %v", err)
	}
	p := "[pm]\ncontrol = \"pm.sock\"\n[[pm.uplink]]\nname = \"a\"\ninterface = \"eth0\"\naddress = \"127.0.0.1\"\n"
	if _, err := LoadPM("p.toml", []byte(p), newEnv()); err == nil || !strings.Contains(err.Error(), "p.toml:2:") {
		t.Errorf("pm relative control: %v", err)
	}
}
