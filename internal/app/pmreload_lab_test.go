package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"braid/internal/mptcp/pm"
)

// TestPMReload runs 'braid pm' (fullmesh) on two equal links and, while an MPTCP transfer
// over both runs, reloads a site file that makes the second uplink backup and lengthens
// join_timeout: the transfer's bytes arrive intact to the last, the manager destroys and
// re-creates no subflow, and the second uplink's subflow turns backup. A file with a mistake
// is then refused by 'braid pm reload' with its file:line (exit 1) and changes nothing;
// SIGHUP applies the next file.
func TestPMReload(t *testing.T) {
	l, _, self := mptcpLab(t)
	a, b := l.Host("a"), l.Host("b")
	dir := t.TempDir()
	control := filepath.Join(dir, "pm.sock")
	site := filepath.Join(dir, "site.toml")
	write := func(extra string) {
		var sb strings.Builder
		fmt.Fprintf(&sb, "[pm]\nmetrics = \"\"\ncontrol = %q\npoll = \"50ms\"\n%s", control, extra)
		for i, lk := range l.Links() {
			fmt.Fprintf(&sb, "[[pm.uplink]]\nname = \"up%d\"\ninterface = %q\naddress = %q\n", i, lk.Spec.A.Ifname, lk.Spec.A.Addrs[0].Addr())
		}
		if err := os.WriteFile(site, []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	lw := &lockedWriter{w: &strings.Builder{}}
	logged := func() string { lw.mu.Lock(); defer lw.mu.Unlock(); return lw.w.String() }
	defer func() {
		if strings.Contains(logged(), "DATA RACE") {
			t.Errorf("the daemon's log (built with -race) reports a data race:\n%s", logged())
		}
	}()
	daemon := exec.Command(self, "pm", "--config", site)
	daemon.Stderr = lw
	if err := a.Start(daemon); err != nil {
		t.Fatal(err)
	}
	status := func() pm.Status {
		t.Helper()
		raw, err := controlStatus(control)
		if err != nil {
			t.Fatalf("%v\n%s", err, logged())
		}
		var st struct{ PM pm.Status }
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatal(err)
		}
		return st.PM
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := controlStatus(control); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("braid pm did not start:\n%s", logged())
		}
	}

	// The transfer: n bytes, byte i of them byte(i), checked at b.
	const n = 32 << 20
	var ln net.Listener
	if err := b.NS.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(true)
		ln, err = lc.Listen(context.Background(), "tcp", "0.0.0.0:5002")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var received atomic.Int64
	result := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			result <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 64<<10)
		var off int64
		for off < n {
			k, err := c.Read(buf)
			for i := range k {
				if buf[i] != byte(off+int64(i)) {
					result <- fmt.Errorf("byte %d is %d, want %d", off+int64(i), buf[i], byte(off+int64(i)))
					return
				}
			}
			off += int64(k)
			received.Store(off)
			if err != nil {
				result <- fmt.Errorf("after %d bytes: %w", off, err)
				return
			}
		}
		result <- nil
	}()
	var c net.Conn
	if err := a.NS.Spawn(func() (err error) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("10.9.0.1:0"))}
		d.SetMultipathTCP(true)
		c, err = d.Dial("tcp", "10.9.0.2:5002")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sendErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for i := range buf {
			buf[i] = byte(i)
		}
		var sent int64
		for sent < n {
			k, err := c.Write(buf[:min(int64(len(buf)), n-sent)])
			sent += int64(k)
			if err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	// Both subflows up and data flowing, then the reload.
	upBoth := func(st pm.Status) bool {
		for _, cs := range st.Connections {
			up := 0
			for _, s := range cs.Subflows {
				if s.State == "up" {
					up++
				}
			}
			if up == 2 {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); !upBoth(status()) || received.Load() < 4<<20; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no connection with two subflows up: %+v\n%s", status(), logged())
		}
	}
	before := status().Counters
	at := received.Load()
	write("backup = [\"up1\"]\njoin_timeout = \"2s\"\n")
	code, out, errOut := run("pm", "reload", "--control", control)
	if code != exitOK || !strings.Contains(out, "uplink backup changed uplink=up1 backup=true") || !strings.Contains(out, "setting changed name=join_timeout from=1s to=2s") {
		t.Fatalf("braid pm reload: %d %q %q\n%s", code, out, errOut, logged())
	}
	if at >= n {
		t.Fatalf("the transfer was over before the reload")
	}
	if err := <-result; err != nil {
		t.Fatalf("the transfer across the reload (at byte %d): %v\n%s", at, err, logged())
	}
	if err := <-sendErr; err != nil {
		t.Fatalf("sending: %v", err)
	}
	t.Logf("%d MiB transfer intact across a reload at %.1f MiB", n>>20, float64(at)/(1<<20))
	after := status()
	if after.Counters.Creates != before.Creates || after.Counters.Destroys != before.Destroys {
		t.Errorf("subflows created/destroyed across the reload: before %+v, after %+v", before, after.Counters)
	}
	backup := false
	for _, cs := range after.Connections {
		for _, s := range cs.Subflows {
			if strings.HasPrefix(s.Local, "10.9.1.1") && s.Backup {
				backup = true
			}
		}
	}
	if !backup {
		t.Errorf("the subflow of up1 is not backup after the reload: %+v", after.Connections)
	}
	if !strings.Contains(logged(), `msg="reload: uplink backup changed" uplink=up1 backup=true`) {
		t.Errorf("the change is not logged:\n%s", logged())
	}

	// A file with a mistake, line 5.
	write("retry = \"soon\"\n")
	code, _, errOut = run("pm", "reload", "--control", control)
	if code != exitError || !strings.Contains(errOut, "site.toml:5:") || !strings.Contains(errOut, "nothing changed") {
		t.Errorf("broken file: %d %q", code, errOut)
	}
	if st := status(); !st.Uplinks[1].Backup {
		t.Errorf("a refused reload changed the uplinks: %+v", st.Uplinks)
	}
	// SIGHUP: up1 no longer backup.
	write("join_timeout = \"2s\"\n")
	daemon.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(3 * time.Second); !strings.Contains(logged(), `msg="reload: uplink backup changed" uplink=up1 backup=false`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not apply the file, or did not log it:\n%s", logged())
		}
	}
	if st := status(); st.Uplinks[1].Backup {
		t.Errorf("up1 still backup after SIGHUP: %+v", st.Uplinks)
	}
}
