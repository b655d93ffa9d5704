package packaging

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// This machine has no systemd running, so a test cannot 'systemctl start' a unit. unitExec does,
// for the keys braid's units use, what systemd does between fork and exec of a service's
// ExecStart, and then executes it: the process the test watches is the daemon as its unit would
// run it. It is the test binary re-executed (unitExecEnv set) inside a lab host, started with a
// mount namespace of its own so that nothing it mounts is seen outside.
//
// Emulated: the installed tree as the root directory (the package's paths, /usr/bin/braid and
// /etc/braid/SITE.toml, as they are written in the unit), ProtectSystem=strict (that root
// read-only), RuntimeDirectory (a fresh writable /run with the directory in it, and
// RUNTIME_DIRECTORY set), ConfigurationDirectory (CONFIGURATION_DIRECTORY), PrivateTmp,
// DevicePolicy=closed with DeviceAllow (a /dev holding the pseudo-devices closed allows and the
// devices listed), PrivateDevices (the same without any listed), ProtectKernelTunables (/proc/sys
// and /sys read-only), UMask, NoNewPrivileges and CapabilityBoundingSet (the bounding set, with
// no inheritable or ambient capability: root then runs with exactly the set). Not emulated: the
// seccomp filters (RestrictAddressFamilies, SystemCallArchitectures, MemoryDenyWriteExecute,
// LockPersonality, RestrictNamespaces, RestrictRealtime, RestrictSUIDSGID), the cgroup and
// kernel-module protections; the test checks RestrictAddressFamilies from outside instead (the
// families of the daemon's sockets).

// unitExecEnv carries a unitExecSpec, as JSON, to the re-executed test binary.
const unitExecEnv = "BRAID_TEST_UNIT_EXEC"

type unitExecSpec struct {
	Root     string // the tree a package was installed into (dpkg --root)
	Unit     string // the unit file, as a path inside Root
	Instance string // the instance name, %i
}

// unitService is what a unit's [Service] section says, with %i replaced.
type unitService struct {
	ExecStart, ExecReload []string
	Caps                  []string // CapabilityBoundingSet
	Families              []string // RestrictAddressFamilies
	NoNewPrivileges       bool
	UMask                 uint32
	RuntimeDirectory      []string
	ConfigDirectory       []string
	ProtectSystem         string
	PrivateTmp            bool
	PrivateDevices        bool
	DevicePolicy          string
	DeviceAllow           []string // device paths
	ProtectKernelTunables bool
}

// parseUnit reads a unit file's [Service] section. Keys it does not know are ignored (they are
// the ones unitExec does not emulate, or not the service's).
func parseUnit(b []byte, instance string) (*unitService, error) {
	u := &unitService{UMask: 0o022}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
			continue
		case line[0] == '[':
			section = line
			continue
		case section != "[Service]":
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: not key=value: %q", n, line)
		}
		v = strings.ReplaceAll(v, "%i", instance)
		yes := v == "yes" || v == "true" || v == "1"
		switch k {
		case "ExecStart":
			u.ExecStart = strings.Fields(v)
		case "ExecReload":
			u.ExecReload = strings.Fields(v)
		case "CapabilityBoundingSet":
			u.Caps = append(u.Caps, strings.Fields(v)...)
		case "RestrictAddressFamilies":
			u.Families = append(u.Families, strings.Fields(v)...)
		case "NoNewPrivileges":
			u.NoNewPrivileges = yes
		case "UMask":
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil {
				return nil, fmt.Errorf("line %d: UMask=%s: %v", n, v, err)
			}
			u.UMask = uint32(m)
		case "RuntimeDirectory":
			u.RuntimeDirectory = append(u.RuntimeDirectory, strings.Fields(v)...)
		case "ConfigurationDirectory":
			u.ConfigDirectory = append(u.ConfigDirectory, strings.Fields(v)...)
		case "ProtectSystem":
			u.ProtectSystem = v
		case "PrivateTmp":
			u.PrivateTmp = yes
		case "PrivateDevices":
			u.PrivateDevices = yes
		case "DevicePolicy":
			u.DevicePolicy = v
		case "DeviceAllow":
			if f := strings.Fields(v); len(f) > 0 {
				u.DeviceAllow = append(u.DeviceAllow, f[0])
			}
		case "ProtectKernelTunables":
			u.ProtectKernelTunables = yes
		}
	}
	if len(u.ExecStart) == 0 {
		return nil, fmt.Errorf("no ExecStart in [Service]")
	}
	return u, sc.Err()
}

// capNumbers are the capabilities a braid unit may name.
var capNumbers = map[string]int{
	"CAP_NET_ADMIN": unix.CAP_NET_ADMIN, "CAP_NET_RAW": unix.CAP_NET_RAW,
	"CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "CAP_BPF": unix.CAP_BPF,
	"CAP_PERFMON": unix.CAP_PERFMON, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN,
	"CAP_SYS_RESOURCE": unix.CAP_SYS_RESOURCE,
}

// capMask is the capability set caps as the bit mask /proc/PID/status shows.
func capMask(caps []string) (uint64, error) {
	var m uint64
	for _, c := range caps {
		n, ok := capNumbers[c]
		if !ok {
			return 0, fmt.Errorf("capability %s is not in the test's table", c)
		}
		m |= 1 << n
	}
	return m, nil
}

// unitExecMain runs in the re-executed test binary: it never returns.
func unitExecMain(spec string) {
	err := unitExec(spec)
	fmt.Fprintf(os.Stderr, "unit exec: %v\n", err)
	os.Exit(127)
}

func unitExec(spec string) error {
	// Capabilities and no_new_privs belong to the thread; the exec below must come from the
	// thread that set them.
	runtime.LockOSThread()
	var s unitExecSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(s.Root, s.Unit))
	if err != nil {
		return err
	}
	u, err := parseUnit(b, s.Instance)
	if err != nil {
		return fmt.Errorf("%s: %v", s.Unit, err)
	}
	keep, err := capMask(u.Caps)
	if err != nil {
		return err
	}
	last, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return err
	}
	lastCap, err := strconv.Atoi(strings.TrimSpace(string(last)))
	if err != nil {
		return err
	}
	root := s.Root
	at := func(p string) string { return filepath.Join(root, p) }
	// Mount points, made in the tree before it turns read-only.
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "var/tmp"} {
		if err := os.MkdirAll(at(d), 0o755); err != nil {
			return err
		}
	}
	mount := func(src, dst, fstype string, flags uintptr, data string) error {
		if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", src, dst, err)
		}
		return nil
	}
	readOnly := func(p string) error {
		if err := mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		return mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
	}
	if err := mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if u.ProtectSystem == "strict" {
		if err := mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return err
		}
	}
	if err := mount("proc", at("proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := mount("sysfs", at("sys"), "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if u.ProtectKernelTunables {
		for _, p := range []string{at("proc/sys"), at("sys")} {
			if err := readOnly(p); err != nil {
				return err
			}
		}
	}
	// /dev: the pseudo-devices DevicePolicy=closed and PrivateDevices allow, and DeviceAllow's.
	if err := mount("tmpfs", at("dev"), "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return err
	}
	devs := []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}
	if !u.PrivateDevices {
		devs = append(devs, u.DeviceAllow...)
	}
	for _, d := range devs {
		if err := os.MkdirAll(filepath.Dir(at(d)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(at(d), nil, 0o600); err != nil {
			return err
		}
		if err := mount(d, at(d), "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "LANG=C.UTF-8"}
	if err := mount("tmpfs", at("run"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return err
	}
	var runtimeDirs []string
	for _, d := range u.RuntimeDirectory {
		if err := os.MkdirAll(at("run/"+d), 0o755); err != nil {
			return err
		}
		runtimeDirs = append(runtimeDirs, "/run/"+d)
	}
	if len(runtimeDirs) > 0 {
		env = append(env, "RUNTIME_DIRECTORY="+strings.Join(runtimeDirs, ":"))
	}
	var configDirs []string
	for _, d := range u.ConfigDirectory {
		configDirs = append(configDirs, "/etc/"+d)
	}
	if len(configDirs) > 0 {
		env = append(env, "CONFIGURATION_DIRECTORY="+strings.Join(configDirs, ":"))
	}
	if u.PrivateTmp {
		for _, d := range []string{"tmp", "var/tmp"} {
			if err := mount("tmpfs", at(d), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
				return err
			}
		}
	}
	if err := unix.Chroot(root); err != nil {
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	unix.Umask(int(u.UMask))
	if u.NoNewPrivileges {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
	}
	for c := 0; c <= lastCap; c++ {
		if keep&(1<<c) == 0 {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	return unix.Exec(u.ExecStart[0], u.ExecStart, env)
}
