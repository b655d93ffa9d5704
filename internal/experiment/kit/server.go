package kit

import (
	"context"

	"braid/internal/lab"
	"braid/internal/traffic"
)

// StartServer runs a traffic server inside host h on addr (TCP and UDP) until stop is called.
func StartServer(ctx context.Context, h *lab.Host, addr string) (stop func(), err error) {
	ln, err := h.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	pc, err := h.ListenPacket("udp", addr)
	if err != nil {
		ln.Close()
		return nil, err
	}
	srv := traffic.NewServer(ln, pc)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx) }()
	return func() { cancel(); srv.Close(); <-done }, nil
}
