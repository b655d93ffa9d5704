package config

import (
	"strings"
	"testing"
)

// The command port keys of mode mpt: loaded with MPT's meaning, refused when inconsistent, and
// refused in braid mode.
func TestLoadMPTCommandPort(t *testing.T) {
	peer := strings.Replace(minimalMPT, `remote_tunnel_ip = "10.255.0.2"`, `remote_tunnel_ip = "10.255.0.2"
cmd_port = 60456
remote_cmd_port = 60457
auth_type = 2
auth_key = "00ff"`, 1)
	tun, err := LoadTunnel("mpt.toml", []byte(peer), newEnv())
	if err != nil {
		t.Fatal(err)
	}
	if m := tun.Peers[0].MPT; m.CmdPort != 60456 || m.RemoteCmdPort != 60457 || m.AuthType != 2 || m.AuthKey != "\x00\xff" {
		t.Errorf("command port settings %+v", m)
	}
	for _, tt := range []struct{ from, to, want string }{
		{`auth_key = "00ff"`, ``, "needs auth_key"},
		{`auth_key = "00ff"`, `auth_key = "xyz"`, "not hex"},
		{`auth_type = 2`, `auth_type = 3`, "auth_type 3"},
		{`cmd_port = 60456`, `cmd_port = 0`, "cmd_port is 0"},
		{`remote_cmd_port = 60457`, `remote_cmd_port = 70000`, "remote_cmd_port 70000"},
	} {
		_, err := LoadTunnel("mpt.toml", []byte(strings.Replace(peer, tt.from, tt.to, 1)), newEnv())
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s -> %s: %v, want %q", tt.from, tt.to, err, tt.want)
		}
	}
	braid := strings.Replace(peer, `mode = "mpt"`, `mode = "braid"`, 1)
	if _, err := LoadTunnel("braid.toml", []byte(braid), newEnv()); err == nil || !strings.Contains(err.Error(), "cmd_port is an mpt-mode key") {
		t.Errorf("cmd_port in braid mode: %v", err)
	}
}
