// Package bgp announces a balancer instance's virtual addresses to its upstream routers over
// BGP, so that routers spread the VIPs' traffic over every instance by ECMP and stop sending
// to an instance that withdraws them (it drains or fails its own health check) or whose
// session goes down (it died).
//
// The BGP implementation is GoBGP's (github.com/osrg/gobgp), run as a library: it speaks the
// protocol (sessions, timers, UPDATE encoding); this package only says what to announce.
// The speaker never listens: it connects to its neighbours, and takes no routes from them.
package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/server"
	"google.golang.org/protobuf/types/known/anypb"
)

// Neighbor is one BGP peer: an upstream router.
type Neighbor struct {
	Address netip.Addr
	AS      uint32
	Port    uint16 // 0: 179
}

// Config is what the speaker announces, and to whom.
type Config struct {
	LocalAS   uint32
	RouterID  netip.Addr // an IPv4 address
	Neighbors []Neighbor
	Announce  []netip.Prefix // the VIPs' prefixes (a /32 or /128 each)
	NextHop   netip.Addr     // next hop of IPv4 prefixes
	NextHop6  netip.Addr     // next hop of IPv6 prefixes
	HoldTime  time.Duration  // 0: 9 s; keepalives every third of it
	Logger    *slog.Logger
}

// PeerStatus is one neighbour's session as the speaker sees it.
type PeerStatus struct {
	Address string `json:"address"`
	AS      uint32 `json:"as"`
	State   string `json:"state"` // idle, connect, active, opensent, openconfirm, established
}

// Status is the speaker's state for status pages.
type Status struct {
	Announced bool         `json:"announced"` // the prefixes are announced (else withdrawn)
	Prefixes  []string     `json:"prefixes"`
	Peers     []PeerStatus `json:"peers"`
}

// Speaker is a running BGP speaker.
type Speaker struct {
	cfg Config
	s   *server.BgpServer
	log *slog.Logger

	mu        sync.Mutex
	announced bool
	uuids     [][]byte // of the announced paths
	stopped   bool
}

// Start starts the speaker and its sessions; nothing is announced until Announce(true).
func Start(ctx context.Context, cfg Config) (*Speaker, error) {
	if cfg.LocalAS == 0 || !cfg.RouterID.Is4() || len(cfg.Neighbors) == 0 {
		return nil, errors.New("bgp: local AS, an IPv4 router id and a neighbour are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hold := cfg.HoldTime
	if hold <= 0 {
		hold = 9 * time.Second
	}
	s := server.NewBgpServer(server.LoggerOption(&logAdapter{log: log.With("bgp", "gobgp")}))
	go s.Serve()
	sp := &Speaker{cfg: cfg, s: s, log: log}
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: cfg.LocalAS, RouterId: cfg.RouterID.String(), ListenPort: -1}}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("bgp: start: %w", err)
	}
	// Sessions going up and down are the operator's business: logged at info.
	err := s.WatchEvent(context.Background(), &api.WatchEventRequest{Peer: &api.WatchEventRequest_Peer{}}, func(r *api.WatchEventResponse) {
		if p := r.GetPeer(); p != nil && p.GetType() == api.WatchEventResponse_PeerEvent_STATE {
			log.Info("bgp: session", "neighbor", p.GetPeer().GetConf().GetNeighborAddress(),
				"state", sessionState(p.GetPeer().GetState().GetSessionState()))
		}
	})
	if err != nil {
		sp.Stop()
		return nil, fmt.Errorf("bgp: watch: %w", err)
	}
	for _, n := range cfg.Neighbors {
		port := uint32(n.Port)
		if port == 0 {
			port = 179
		}
		var families []*api.AfiSafi
		for _, f := range sp.families() {
			families = append(families, &api.AfiSafi{Config: &api.AfiSafiConfig{Family: f, Enabled: true}})
		}
		secs := uint64(hold / time.Second)
		p := &api.Peer{
			Conf:      &api.PeerConf{NeighborAddress: n.Address.String(), PeerAsn: n.AS},
			Transport: &api.Transport{RemotePort: port},
			// Reconnect fast: an upstream router that restarts should have the VIP back in a second.
			Timers:   &api.Timers{Config: &api.TimersConfig{ConnectRetry: 1, HoldTime: secs, KeepaliveInterval: max(secs/3, 1), IdleHoldTimeAfterReset: 1}},
			AfiSafis: families,
		}
		if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: p}); err != nil {
			sp.Stop()
			return nil, fmt.Errorf("bgp: neighbour %s: %w", n.Address, err)
		}
	}
	return sp, nil
}

func (sp *Speaker) families() []*api.Family {
	var v4, v6 bool
	for _, p := range sp.cfg.Announce {
		v4 = v4 || p.Addr().Is4()
		v6 = v6 || p.Addr().Is6()
	}
	var out []*api.Family
	if v4 || !v6 {
		out = append(out, &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST})
	}
	if v6 {
		out = append(out, &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST})
	}
	return out
}

// path builds the BGP path that announces p.
func (sp *Speaker) path(p netip.Prefix) (*api.Path, error) {
	nlri, err := anypb.New(&api.IPAddressPrefix{Prefix: p.Addr().String(), PrefixLen: uint32(p.Bits())})
	if err != nil {
		return nil, err
	}
	origin, err := anypb.New(&api.OriginAttribute{Origin: 0}) // IGP
	if err != nil {
		return nil, err
	}
	if p.Addr().Is4() {
		nh, err := anypb.New(&api.NextHopAttribute{NextHop: sp.cfg.NextHop.String()})
		if err != nil {
			return nil, err
		}
		return &api.Path{Family: &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}, Nlri: nlri, Pattrs: []*anypb.Any{origin, nh}}, nil
	}
	fam := &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
	mp, err := anypb.New(&api.MpReachNLRIAttribute{Family: fam, NextHops: []string{sp.cfg.NextHop6.String()}, Nlris: []*anypb.Any{nlri}})
	if err != nil {
		return nil, err
	}
	return &api.Path{Family: fam, Nlri: nlri, Pattrs: []*anypb.Any{origin, mp}}, nil
}

// Announce announces the prefixes (on) or withdraws them (off); a repeated call does nothing.
// The UPDATE is queued to every established session when it returns.
func (sp *Speaker) Announce(ctx context.Context, on bool) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.stopped || on == sp.announced {
		return nil
	}
	if on {
		for _, p := range sp.cfg.Announce {
			path, err := sp.path(p)
			if err != nil {
				return err
			}
			r, err := sp.s.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path})
			if err != nil {
				return fmt.Errorf("bgp: announce %s: %w", p, err)
			}
			sp.uuids = append(sp.uuids, r.Uuid)
		}
		sp.announced = true
		sp.log.Info("bgp: announced", "prefixes", sp.cfg.Announce)
		return nil
	}
	var errs []error
	for _, id := range sp.uuids {
		if err := sp.s.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Uuid: id}); err != nil {
			errs = append(errs, err)
		}
	}
	sp.uuids = nil
	sp.announced = false
	sp.log.Info("bgp: withdrawn", "prefixes", sp.cfg.Announce)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bgp: withdraw: %w", err)
	}
	return nil
}

// Status returns whether the prefixes are announced and each session's state.
func (sp *Speaker) Status(ctx context.Context) Status {
	sp.mu.Lock()
	st := Status{Announced: sp.announced}
	stopped := sp.stopped
	sp.mu.Unlock()
	for _, p := range sp.cfg.Announce {
		st.Prefixes = append(st.Prefixes, p.String())
	}
	if stopped {
		return st
	}
	sp.s.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		ps := PeerStatus{Address: p.GetConf().GetNeighborAddress(), AS: p.GetConf().GetPeerAsn(), State: "idle"}
		if s := p.GetState(); s != nil {
			ps.State = sessionState(s.GetSessionState())
		}
		st.Peers = append(st.Peers, ps)
	})
	return st
}

// Established returns how many sessions are established.
func (sp *Speaker) Established(ctx context.Context) int {
	n := 0
	for _, p := range sp.Status(ctx).Peers {
		if p.State == "established" {
			n++
		}
	}
	return n
}

func sessionState(s api.PeerState_SessionState) string {
	switch s {
	case api.PeerState_CONNECT:
		return "connect"
	case api.PeerState_ACTIVE:
		return "active"
	case api.PeerState_OPENSENT:
		return "opensent"
	case api.PeerState_OPENCONFIRM:
		return "openconfirm"
	case api.PeerState_ESTABLISHED:
		return "established"
	}
	return "idle"
}

// Stop closes every session (a NOTIFICATION Cease to each neighbour, which drops the routes
// learned from it) and stops the speaker.
func (sp *Speaker) Stop() {
	sp.mu.Lock()
	if sp.stopped {
		sp.mu.Unlock()
		return
	}
	sp.stopped = true
	sp.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sp.s.StopBgp(ctx, &api.StopBgpRequest{})
	sp.s.Stop()
}

// logAdapter passes GoBGP's messages to slog: errors and warnings as they are, the rest at
// debug level (GoBGP is chatty at info).
type logAdapter struct {
	log *slog.Logger
}

func attrs(fields gobgplog.Fields) []any {
	out := make([]any, 0, 2*len(fields))
	for k, v := range fields {
		out = append(out, k, v)
	}
	return out
}

func (a *logAdapter) Panic(msg string, f gobgplog.Fields) { a.log.Error(msg, attrs(f)...) }
func (a *logAdapter) Fatal(msg string, f gobgplog.Fields) { a.log.Error(msg, attrs(f)...) }
func (a *logAdapter) Error(msg string, f gobgplog.Fields) { a.log.Error(msg, attrs(f)...) }
func (a *logAdapter) Warn(msg string, f gobgplog.Fields)  { a.log.Warn(msg, attrs(f)...) }
func (a *logAdapter) Info(msg string, f gobgplog.Fields)  { a.log.Debug(msg, attrs(f)...) }
func (a *logAdapter) Debug(msg string, f gobgplog.Fields) { a.log.Debug(msg, attrs(f)...) }
func (a *logAdapter) SetLevel(gobgplog.LogLevel)          {}
func (a *logAdapter) GetLevel() gobgplog.LogLevel         { return gobgplog.InfoLevel }
