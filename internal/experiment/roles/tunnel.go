package roles

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"braid/internal/lab"
	"braid/internal/sock"
	"braid/internal/tun"
	"braid/internal/tunnel"
)

// TunnelPort is the UDP port of the tunnels the scenarios start.
const TunnelPort = 4754

// StartTunnel runs a braid tunnel inside host h: a TUN device "braid0" with address inner, one
// uplink socket per local address (named by the address; a group of o.Shards sockets), and the given options (peers,
// scheduler...). adjust, if given, sees the options last, with the device and sockets in place
// (tests wrap a socket there). stop ends the tunnel, waits for it and returns what Run returned.
func StartTunnel(ctx context.Context, h *lab.Host, inner []netip.Prefix, locals []netip.Addr, o tunnel.Options, adjust ...func(*tunnel.Options)) (t *tunnel.Tunnel, stop func() error, err error) {
	if o.MTU == 0 {
		o.MTU = 1400
	}
	closeAll := func() {
		for _, u := range o.Uplinks {
			u.Conn.Close()
		}
		if o.Device != nil {
			o.Device.Close()
		}
	}
	for _, a := range locals {
		var c tunnel.Conn
		if err := h.NS.Do(func() (err error) {
			// A group of o.Shards sockets, each read on its own (tunnel.Options.Shards).
			g, err := sock.ListenGroup(netip.AddrPortFrom(a, TunnelPort), "", max(o.Shards, 1))
			if err == nil {
				g.EnableGRO()
				c = g
			}
			return err
		}); err != nil {
			closeAll()
			return nil, nil, err
		}
		o.Uplinks = append(o.Uplinks, tunnel.Uplink{Name: a.String(), Conn: c})
	}
	var dev *tun.Device
	if err := h.NS.Do(func() (err error) { dev, err = tun.OpenOffload("braid0"); return err }); err != nil {
		closeAll()
		return nil, nil, err
	}
	o.Device = dev
	if err := tun.Configure(h.NS.Netlink(), "braid0", o.MTU, inner); err != nil {
		closeAll()
		return nil, nil, err
	}
	for _, fn := range adjust {
		fn(&o)
	}
	t, err = tunnel.New(o)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- t.Run(ctx) }()
	return t, func() error { cancel(); return <-done }, nil
}

// WaitTunnel waits until every path of every peer of t is up.
func WaitTunnel(ctx context.Context, t *tunnel.Tunnel, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		ok := true
		for _, p := range t.Status().Peers {
			ok = ok && p.Session
			for _, pa := range p.Paths {
				ok = ok && pa.State == "up"
			}
		}
		if ok {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("scenario: tunnel not up within %v", within)
}
