package traffic

import (
	"context"
	"net"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// CCDial sets the congestion control on the connection it dials, and a name the kernel does
// not offer fails the dial, naming it.
func TestCCDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	c, err := CCDial(NetDial, "reno")(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, _ := c.(*net.TCPConn).SyscallConn()
	var got string
	raw.Control(func(fd uintptr) { got, err = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION) })
	if err != nil || strings.TrimRight(got, "\x00") != "reno" {
		t.Errorf("congestion control %q, %v; want reno", got, err)
	}
	if _, err := CCDial(NetDial, "no-such-cc")(context.Background(), "tcp", ln.Addr().String()); err == nil || !strings.Contains(err.Error(), "no-such-cc") {
		t.Errorf("unknown congestion control: %v, want an error naming it", err)
	}
}
