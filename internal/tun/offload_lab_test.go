package tun

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"braid/internal/lab/netns"
)

// TestReadBatchIdle: with nothing to read, ReadBatchIdle calls idle before it waits, and what
// arrives while idle runs wakes it (idle here sends the packet it then reads); closing the
// device ends a waiting read with os.ErrClosed.
func TestReadBatchIdle(t *testing.T) {
	if os.Geteuid() != 0 && os.Getenv("BRAID_LAB_REQUIRED") != "1" {
		t.Skip("needs root (network namespaces)")
	}
	ns, err := netns.Create(fmt.Sprintf("braid-tunidle-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close(); netns.Delete(ns.Name) })
	var dev *Device
	if err := ns.Do(func() (err error) { dev, err = OpenOffload("idle0"); return err }); err != nil {
		t.Fatal(err)
	}
	if err := Configure(ns.Netlink(), "idle0", 1400, []netip.Prefix{netip.MustParsePrefix("10.77.0.1/24")}); err != nil {
		t.Fatal(err)
	}
	var c *net.UDPConn
	if err := ns.Do(func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 77, 0, 1)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const off = 8
	bufs, sizes := [][]byte{make([]byte, 2048), make([]byte, 2048)}, make([]int, 2)
	idles := 0
	idle := func() {
		if idles++; idles == 1 {
			c.WriteToUDP([]byte("ping"), &net.UDPAddr{IP: net.IPv4(10, 77, 0, 2), Port: 9})
		}
	}
	dev.SetReadDeadline(time.Now().Add(5 * time.Second))
	for found := false; !found; {
		k, err := dev.ReadBatchIdle(bufs, off, sizes, idle)
		if err != nil {
			t.Fatalf("after %d idle calls: %v", idles, err)
		}
		// The kernel may send other packets (IPv6 router solicitations) first.
		for i := range k {
			p := bufs[i][off : off+sizes[i]]
			found = found || len(p) == 32 && p[0]>>4 == 4 && p[9] == 17 && string(p[28:]) == "ping"
		}
	}
	if idles == 0 {
		t.Fatal("idle was not called before the read waited")
	}
	errc := make(chan error, 1)
	go func() {
		dev.SetReadDeadline(time.Time{})
		for {
			if _, err := dev.ReadBatchIdle(bufs, off, sizes, func() {}); err != nil {
				errc <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	dev.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("read after Close: %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting read did not end when the device closed")
	}
}
