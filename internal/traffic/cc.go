package traffic

import (
	"context"
	"errors"
	"fmt"
	"net"

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
			cerr := raw.Control(func(fd uintptr) { err = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc) })
			err = errors.Join(err, cerr)
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("congestion control %q: %w", cc, err)
		}
		return c, nil
	}
}
