package pm

import (
	"fmt"

	"braid/internal/mptcp/pm/core"
)

// Reconfigure applies a reload to the running daemon: the policy (with its settings), the
// timers and ports, and the uplinks' backup flags. The connections it manages and their
// subflows stay; the next poll applies the new settings to them. The uplinks themselves, the
// poll period and the map-resolvers are fixed at start (core.ErrUplinks for the uplinks).
func (d *Daemon) Reconfigure(uplinks []core.Uplink, p core.Policy, c core.Config) error {
	if p == nil {
		return fmt.Errorf("pm: no policy")
	}
	if a, ok := p.(*core.AMPTCP); ok {
		if d.o.Resolver == nil {
			return fmt.Errorf("pm: the amptcp policy needs the map-resolver client, which only a start with it opens")
		}
		d.prepareAMPTCP(a)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c.Uplinks = uplinks
	if err := d.mgr.Reconfigure(c, p); err != nil {
		return err
	}
	d.o.Uplinks, d.o.Policy, d.o.Core = uplinks, p, c
	return nil
}

// Policy returns the policy in effect.
func (d *Daemon) Policy() core.Policy {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.o.Policy
}
