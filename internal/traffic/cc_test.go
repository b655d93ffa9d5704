package traffic

import (
	"context"
	"net"
	"os"
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
	want := notDefaultCC(t)
	c, err := CCDial(NetDial, want)(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := ccOf(c); err != nil || got != want {
		t.Errorf("congestion control %q, %v; want %s", got, err, want)
	}
	if _, err := CCDial(NetDial, "no-such-cc")(context.Background(), "tcp", ln.Addr().String()); err == nil || !strings.Contains(err.Error(), "no-such-cc") {
		t.Errorf("unknown congestion control: %v, want an error naming it", err)
	}
}

// ListenCC sets the congestion control on the listener, the connections it accepts have it
// (the sender of a download is the server's side), and a name the kernel does not offer fails
// the listen, naming it.
func TestListenCC(t *testing.T) {
	want := notDefaultCC(t)
	ln, err := ListenCC(context.Background(), "127.0.0.1:0", want)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer s.Close()
	if got, err := ccOf(s); err != nil || got != want {
		t.Errorf("accepted connection's congestion control %q, %v; want %s", got, err, want)
	}
	if ln2, err := ListenCC(context.Background(), "127.0.0.1:0", "no-such-cc"); err == nil || !strings.Contains(err.Error(), "no-such-cc") {
		if ln2 != nil {
			ln2.Close()
		}
		t.Errorf("unknown congestion control: %v, want an error naming it", err)
	}
}

// ccOf is the congestion control of a TCP connection (TCP_CONGESTION).
func ccOf(c net.Conn) (string, error) {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return "", err
	}
	var got string
	if cerr := raw.Control(func(fd uintptr) { got, err = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION) }); cerr != nil {
		return "", cerr
	}
	return strings.TrimRight(got, "\x00"), err
}

// notDefaultCC is a congestion control the kernel offers other than the host's default, so that
// a connection that has it got it from the code under test.
func notDefaultCC(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) == "reno" {
		return "cubic"
	}
	return "reno"
}
