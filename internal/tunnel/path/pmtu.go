package path

import (
	"errors"
	"fmt"
	"time"
)

// ErrPMTUConfig is returned by PMTUConfig.Validate.
var ErrPMTUConfig = errors.New("path: invalid path MTU config")

// PMTUConfig sets the path MTU search of one path. Sizes are IP packet sizes on the path
// (outer IP and UDP headers included). Zero fields take the values of WithDefaults.
type PMTUConfig struct {
	// Max is the largest size worth trying: the uplink's interface MTU. Required.
	Max int
	// Min is the size assumed to work on any path (RFC 8899's BASE_PLPMTU is 1200; IPv6
	// guarantees 1280). The search never goes below it.
	Min int
	// Tries is how many probes of one size must go unanswered before the size is taken as
	// too big (RFC 8899's MAX_PROBES).
	Tries int
	// Raise is how long a path that settled below Max waits before it tries Max again
	// (RFC 8899's PMTU_RAISE_TIMER, 600 s).
	Raise time.Duration
	// Step ends the search: once the sizes known to pass and to fail are closer than Step,
	// the largest that passed is the path MTU.
	Step int
}

// WithDefaults returns c with zero fields set: Min 1280 (or Max if smaller), 3 tries, raise
// after 10 minutes, step 8 bytes.
func (c PMTUConfig) WithDefaults() PMTUConfig {
	if c.Min == 0 {
		c.Min = min(1280, c.Max)
	}
	if c.Tries == 0 {
		c.Tries = 3
	}
	if c.Raise == 0 {
		c.Raise = 10 * time.Minute
	}
	if c.Step == 0 {
		c.Step = 8
	}
	return c
}

// Validate reports whether c (after WithDefaults) is usable.
func (c PMTUConfig) Validate() error {
	switch {
	case c.Max < 68 || c.Max > 65535:
		return fmt.Errorf("%w: Max %d (68 to 65535)", ErrPMTUConfig, c.Max)
	case c.Min < 68 || c.Min > c.Max:
		return fmt.Errorf("%w: Min %d (68 to Max %d)", ErrPMTUConfig, c.Min, c.Max)
	case c.Tries < 1 || c.Tries > 10:
		return fmt.Errorf("%w: Tries %d (1 to 10)", ErrPMTUConfig, c.Tries)
	case c.Raise < time.Second:
		return fmt.Errorf("%w: Raise %v (at least 1 s)", ErrPMTUConfig, c.Raise)
	case c.Step < 1:
		return fmt.Errorf("%w: Step %d", ErrPMTUConfig, c.Step)
	}
	return nil
}

// PMTU finds one path's MTU by probing (packetization-layer PMTU discovery, RFC 8899): the
// tunnel sends padded probes of chosen sizes and the peer acknowledges those that arrive; ICMP
// is not needed, so paths that filter it (black holes) are measured too.
//
// The search is optimistic: the path starts at Max (the uplink's MTU, right on most paths) and
// probes it at once. If Max goes unanswered Tries times, the path falls back to Min and a
// binary search between Min and Max follows, one probe in flight at a time; each size that
// is answered raises the lower bound, each that fails Tries times lowers the upper one. The
// result is used only when the search ends, so the tunnel MTU changes once. A path that
// settled below Max tries Max again every Raise (routes change), and Reset starts over (a path
// that comes back up may have come back on another route).
type PMTU struct {
	cfg PMTUConfig

	value     int  // the path MTU in use
	searching bool // a search is under way
	lo, hi    int  // sizes known to pass, and the largest not known to fail
	size      int  // the size being probed (0: none)
	tries     int  // probes of size sent
	seq       uint32
	inFlight  bool
	sentAt    int64
	raiseAt   int64
	probes    uint64
	lost      uint64
}

// NewPMTU returns the search state of a new path at now. It panics if c.WithDefaults() does
// not Validate; configuration is checked where it is loaded.
func NewPMTU(c PMTUConfig, now int64) *PMTU {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		panic(err)
	}
	m := &PMTU{cfg: c}
	m.Reset(now)
	return m
}

// Reset starts a new search at now, assuming Max meanwhile.
func (m *PMTU) Reset(now int64) {
	m.value, m.searching = m.cfg.Max, true
	m.lo, m.hi = m.cfg.Min, m.cfg.Max
	m.size, m.tries, m.inFlight = m.cfg.Max, 0, false
	m.raiseAt = 0
}

// Value is the path MTU to use now.
func (m *PMTU) Value() int { return m.value }

// Searching reports whether a search is under way.
func (m *PMTU) Searching() bool { return m.searching }

// Counts returns how many probes were sent and how many went unanswered.
func (m *PMTU) Counts() (probes, lost uint64) { return m.probes, m.lost }

// Next says whether a probe is due at now, with its sequence number and size. timeout is how
// long a probe waits for its ack before it counts as lost (a few round trips). The caller
// sends the probe when due is true.
func (m *PMTU) Next(now, timeout int64) (seq uint32, size int, due bool) {
	if m.inFlight {
		if now-m.sentAt < timeout {
			return 0, 0, false
		}
		m.inFlight = false
		m.lost++
		if m.tries >= m.cfg.Tries {
			m.failed(now)
		}
	}
	if !m.searching {
		if m.value >= m.cfg.Max || now < m.raiseAt {
			return 0, 0, false
		}
		// Time to see whether Max works again: one more search from what works now.
		m.searching, m.lo, m.hi, m.size, m.tries = true, m.value, m.cfg.Max, m.cfg.Max, 0
	}
	m.seq++
	m.tries++
	m.probes++
	m.inFlight, m.sentAt = true, now
	return m.seq, m.size, true
}

// OnAck takes the ack of probe seq, which arrived as size bytes (on the path, outer headers
// included). Acks of older probes still count: the size they carried passed.
func (m *PMTU) OnAck(now int64, seq uint32, size int) {
	if !m.searching || size <= m.lo {
		return
	}
	m.lo = min(size, m.hi)
	if m.inFlight && seq == m.seq {
		m.inFlight = false
	}
	if m.lo >= m.size {
		m.next(now)
	}
}

// failed: the size being probed went unanswered Tries times.
func (m *PMTU) failed(now int64) {
	if m.size == m.cfg.Max && m.value == m.cfg.Max {
		m.value = m.lo // Max does not pass: be safe while searching
	}
	m.hi = m.size - 1
	m.next(now)
}

// next chooses the next size to probe, or ends the search.
func (m *PMTU) next(now int64) {
	if m.hi-m.lo < m.cfg.Step || m.lo >= m.hi {
		m.value, m.searching, m.size, m.inFlight = m.lo, false, 0, false
		m.raiseAt = now + int64(m.cfg.Raise)
		return
	}
	m.size, m.tries, m.inFlight = (m.lo+m.hi+1)/2, 0, false
}
