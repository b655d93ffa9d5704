package app

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"braid/internal/experiment/mplb"
	"braid/internal/lab/labtest"
	"braid/internal/lb"
)

// readPattern reads n bytes of an MPLB server's download (byte i of it is byte(i), offset
// counted from off) and reports the first byte that differs.
func readPattern(r io.Reader, off, n int64) error {
	buf := make([]byte, 64<<10)
	for n > 0 {
		k, err := r.Read(buf[:min(int64(len(buf)), n)])
		for i := range k {
			if buf[i] != byte(off+int64(i)) {
				return fmt.Errorf("byte %d is %d, want %d", off+int64(i), buf[i], byte(off+int64(i)))
			}
		}
		off += int64(k)
		n -= int64(k)
		if err != nil {
			return fmt.Errorf("at byte %d: %w", off, err)
		}
	}
	return nil
}

// TestLBReload runs 'braid lb' on the MPLB lab with backends b0 and b1 and, while an MPTCP
// download from one of them is half read, reloads a site file that adds b2 and changes the
// other's weight: the download goes on to its last byte intact, new connections reach b2, and
// each change is logged on its own line. A file with a mistake is then refused by 'braid lb
// reload' with its file:line (exit 1) and changes nothing; SIGHUP applies a drain.
func TestLBReload(t *testing.T) {
	labtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 3
	l := labtest.Up(t, mplb.MPLBTopology(n, 0))
	if err := mplb.MPLBPrepare(l, n); err != nil {
		t.Fatal(err)
	}
	srv, err := mplb.StartMPLBServers(l, n)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	backend := func(k int, weight int) string {
		s, err := mplb.MPLBBackendSpec(l, k, 1)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("[[lb.backend]]\nname = \"b%d\"\nmac = \"%s\"\ninterface = \"l%d\"\nweight = %d\n", k, s.Target.MAC, k, weight)
	}
	dir := t.TempDir()
	control := filepath.Join(dir, "lb.sock")
	site := filepath.Join(dir, "site.toml")
	head := fmt.Sprintf("[lb]\ninterface = \"lc0\"\ninterfaces = [\"lc1\"]\nattach = \"generic\"\nmetrics = \"\"\ncontrol = %q\n[[lb.service]]\nvip = \"%s:%d\"\n",
		control, mplb.MPLBVIP, mplb.MPLBPort)
	write := func(body string) {
		if err := os.WriteFile(site, []byte(head+body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(backend(0, 1) + backend(1, 1))

	t.Setenv("BRAID_TEST_MAIN", "1")
	self, _ := os.Executable()
	lw := &lockedWriter{w: &strings.Builder{}}
	logged := func() string { lw.mu.Lock(); defer lw.mu.Unlock(); return lw.w.String() }
	defer func() {
		if strings.Contains(logged(), "DATA RACE") {
			t.Errorf("the daemon's log (built with -race) reports a data race:\n%s", logged())
		}
	}()
	daemon := exec.Command(self, "lb", "--config", site)
	daemon.Stderr = lw
	if err := l.Host("lb").Start(daemon); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := controlStatus(control); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("braid lb did not start:\n%s", logged())
		}
	}
	status := func() lb.Status {
		t.Helper()
		raw, err := controlStatus(control)
		if err != nil {
			t.Fatal(err)
		}
		var st lb.Status
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if err := mplb.MPLBEndpoint(ctx, l); err != nil {
		t.Fatal(err)
	}

	// A download from one backend, read halfway before the reload and the rest after it.
	c, err := mplb.MPLBDial(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first, err := mplb.MPLBAsk(c)
	if err != nil {
		t.Fatal(err)
	}
	other := 1 - first
	const size = 32 << 20
	req := make([]byte, 9)
	req[0] = 'D'
	binary.BigEndian.PutUint64(req[1:], size)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	if err := readPattern(c, 0, size/2); err != nil {
		t.Fatalf("first half: %v", err)
	}
	// The reload: b2 added, the other backend's weight 1 -> 3.
	var body string
	if other == 0 {
		body = backend(0, 3) + backend(1, 1)
	} else {
		body = backend(0, 1) + backend(1, 3)
	}
	write(body + backend(2, 1))
	code, out, errOut := run("lb", "reload", "--control", control)
	if code != exitOK || !strings.Contains(out, "backend added b2 weight=1") || !strings.Contains(out, fmt.Sprintf("backend weight changed b%d from=1 to=3", other)) {
		t.Fatalf("braid lb reload: %d %q %q", code, out, errOut)
	}
	if err := readPattern(c, size/2, size/2); err != nil {
		t.Fatalf("the download from unchanged backend b%d across the reload: %v", first, err)
	}
	if k, err := readByte(c); err != nil || k != first {
		t.Fatalf("the download's last byte: backend %d (%v), want %d", k, err, first)
	}
	for _, want := range []string{`msg="reload: backend added" name=b2 weight=1`, fmt.Sprintf(`msg="reload: backend weight changed" name=b%d from=1 to=3`, other)} {
		if !strings.Contains(logged(), want) {
			t.Errorf("log lacks %q:\n%s", want, logged())
		}
	}
	// New connections reach the new backend.
	reached := map[int]int{}
	for range 40 {
		c, err := mplb.MPLBDial(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		k, err := mplb.MPLBAsk(c)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		reached[k]++
	}
	t.Logf("download of %d MiB from b%d intact across the reload; 40 new connections after it reached %v", size>>20, first, reached)
	if reached[2] == 0 {
		t.Fatalf("no new connection reached b2 after the reload: %v", reached)
	}

	// A file with a mistake: refused with its line, nothing changes.
	os.WriteFile(site, []byte(strings.Replace(head, "attach = \"generic\"\n", "attach = \"generic\"\nmode = \"nat\"\n", 1)+body), 0o644)
	code, _, errOut = run("lb", "reload", "--control", control)
	if code != exitError || !strings.Contains(errOut, "site.toml:5: lb: mode \"nat\"") || !strings.Contains(errOut, "nothing changed") {
		t.Fatalf("broken file: %d %q", code, errOut)
	}
	if st := status(); len(st.Backends) != 3 {
		t.Fatalf("after a refused reload: %+v", st.Backends)
	}
	// SIGHUP: b0 drained by the file.
	if other == 0 {
		write(backend(0, 0) + backend(1, 1) + backend(2, 1))
	} else {
		write(backend(0, 0) + backend(1, 3) + backend(2, 1))
	}
	daemon.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(5 * time.Second); status().Backends[0].State != "drained"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not drain b0: %+v\n%s", status().Backends, logged())
		}
	}
	if !strings.Contains(logged(), `msg="reload: backend drained" name=b0 from=`) {
		t.Errorf("drain not logged:\n%s", logged())
	}
}

func readByte(r io.Reader) (int, error) {
	var b [1]byte
	_, err := io.ReadFull(r, b[:])
	return int(b[0]), err
}
