package lab_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"braid/internal/lab"
	"braid/internal/lab/labtest"
	"braid/internal/lab/netns"
	"braid/internal/lab/topo"
	"braid/internal/traffic"
)

func rtt(t *testing.T, l *lab.Lab, from, addr string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rr, err := traffic.RR(ctx, l.Host(from).Dial, addr, traffic.RROptions{Count: 10})
	if err != nil {
		t.Fatalf("rr %s -> %s: %v", from, addr, err)
	}
	// The least round trip is the link's: a busy machine adds to the others, never takes from
	// them, since the emulator runs in user space.
	return rr.Min
}

// Link parameters change while a connection is open.
func TestChangeLinkWhileRunning(t *testing.T) {
	l := labtest.Up(t, labtest.Pair(topo.Shape{Delay: 5 * time.Millisecond}))
	stop, err := labtest.Serve(l.Host("b"), "10.99.0.2:5201")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if got := rtt(t, l, "a", "10.99.0.2:5201"); got > 12*time.Millisecond {
		t.Fatalf("RTT %v before the change, want 10 ms", got)
	}
	d := 40 * time.Millisecond
	st, err := l.ChangeLinks(lab.LinkRequest{A: "a", B: "b", Dir: "ab", Set: lab.ShapeChange{Delay: &d}})
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].Shape.Delay != d || st[1].Shape.Delay != 5*time.Millisecond {
		t.Fatalf("status after the change: %+v", st)
	}
	if got := rtt(t, l, "a", "10.99.0.2:5201"); got < 45*time.Millisecond || got > 55*time.Millisecond {
		t.Errorf("RTT %v after a->b delay 40 ms, want 45 ms", got)
	}
	bad := 120.0
	if _, err := l.ChangeLinks(lab.LinkRequest{A: "a", B: "b", Set: lab.ShapeChange{Loss: &bad}}); err == nil || !strings.Contains(err.Error(), "loss") {
		t.Errorf("loss 120 %%: got %v, want an error naming the loss", err)
	}
	if _, err := l.ChangeLinks(lab.LinkRequest{A: "a", B: "zz"}); err == nil || !strings.Contains(err.Error(), "zz") {
		t.Errorf("unknown host: got %v, want an error naming it", err)
	}
}

// A topology with a mistake fails before any namespace exists.
func TestInvalidTopologyCreatesNothing(t *testing.T) {
	labtest.Require(t)
	before, _ := netns.List(lab.NamePrefix)
	tp := labtest.Pair(topo.Shape{Delay: -time.Millisecond})
	tp.Links[0].B.Host = "nowhere"
	_, err := lab.Up(context.Background(), tp, lab.Options{})
	if err == nil {
		t.Fatal("an invalid topology was accepted")
	}
	for _, want := range []string{"nowhere", "negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	after, _ := netns.List(lab.NamePrefix)
	if len(after) != len(before) {
		t.Errorf("namespaces before %v, after %v", before, after)
	}
}

// A build that fails part way (here: its context ended) returns the error, not a crash, and
// leaves no namespace behind.
func TestFailedBuildReturnsErrorAndRemovesLab(t *testing.T) {
	labtest.Require(t)
	before, _ := netns.List(lab.NamePrefix)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l, err := lab.Up(ctx, labtest.Pair(topo.Shape{}), lab.Options{})
	if err == nil || l != nil {
		l.Close()
		t.Fatalf("Up with its context ended: lab %v, error %v; want no lab and an error", l, err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want the context's", err)
	}
	after, _ := netns.List(lab.NamePrefix)
	if len(after) != len(before) {
		t.Errorf("namespaces before %v, after %v", before, after)
	}
}

// The control socket of `braid lab up` changes links for another process.
func TestControlSocket(t *testing.T) {
	l := labtest.Up(t, labtest.Pair(topo.Shape{Rate: 10e6}))
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	stop, err := l.ServeControl(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	st := lab.State{ID: l.ID, Control: sock}
	links, err := lab.RequestLinks(st, lab.LinkRequest{A: "b", B: "a", Down: true})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Links()[0].IsCut() || len(links) != 2 || !links[0].Cut {
		t.Errorf("link not cut: %+v", links)
	}
	if _, err := lab.RequestLinks(st, lab.LinkRequest{A: "a", B: "b", Dir: "sideways"}); err == nil {
		t.Error("a bad direction was accepted")
	}
	if _, err := lab.RequestLinks(st, lab.LinkRequest{Name: "*", Up: true}); err != nil || l.Links()[0].IsCut() {
		t.Errorf("restore: %v, cut=%v", err, l.Links()[0].IsCut())
	}
	stop()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket left behind: %v", err)
	}
}
