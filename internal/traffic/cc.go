package traffic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// CCDial returns a DialFunc that dials with dial and sets congestion control cc (TCP_CONGESTION)
// on each TCP connection; a name the kernel does not offer fails the dial with the kernel's
// error.
func CCDial(dial DialFunc, cc string) DialFunc {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := dial(ctx, network, address)
		if err != nil {
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return c, nil
		}
		raw, err := tc.SyscallConn()
		if err == nil {
			err = setCC(raw, cc)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// ListenCC listens on the TCP address addr with congestion control cc set on the listening
// socket (TCP_CONGESTION), which every connection it accepts inherits: the kernel keeps a
// congestion control chosen on a listener for its children instead of the host's default. So
// a server whose side sends (a download) uses cc. A name the kernel does not offer fails with
// the kernel's error, naming it. An empty cc listens with the host's default.
func ListenCC(ctx context.Context, addr, cc string) (net.Listener, error) {
	var lc net.ListenConfig
	if cc != "" {
		lc.Control = func(_, _ string, raw syscall.RawConn) error { return setCC(raw, cc) }
	}
	return lc.Listen(ctx, "tcp", addr)
}

// setCC sets congestion control cc on the socket raw (TCP_CONGESTION); the error names cc.
func setCC(raw syscall.RawConn, cc string) error {
	var err error
	if cerr := raw.Control(func(fd uintptr) { err = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc) }); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("congestion control %q: %w", cc, err)
	}
	return nil
}
