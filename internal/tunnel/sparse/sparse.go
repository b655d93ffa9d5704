// Package sparse tells the packets of sparse flows: flows inside the tunnel that send little
// (pings, DNS, voice, keystrokes, TCP handshakes, the ACKs of a slow download). Their
// packets are what a user feels as latency, and cost almost nothing to send twice: the tunnel
// sends each on every Up path, and the receiver delivers the first copy at once instead of
// holding it behind other flows' gaps (docs/scheduling.md, "Sparse flows").
//
// A flow is its inner addresses, protocol and, for TCP and UDP, ports. Each flow has a token
// bucket of Rate bytes per second and Burst bytes; a packet is sparse when its flow's bucket
// still holds it. A flow that sends more goes into debt (down to -Burst) and stays dense until
// it has been quiet long enough to repay it.
package sparse

import (
	"encoding/binary"
	"math/rand/v2"
)

const (
	// Rate is what a sparse flow may send on average, in bytes per second: 96 kbit/s, above
	// a G.711 call's 87 kbit/s with its headers and a ping every 10 ms, below the ACKs of a
	// download of more than about 5 Mbit/s (an ACK of 52 bytes every two segments).
	Rate = 12000
	// Burst is what a sparse flow may send at once, in bytes: three full-size packets.
	Burst = 4500
	// Slots is the number of flows a Meter follows; flows that hash to the same slot share it
	// (see Sparse).
	Slots = 1024
	// quiet is how long a dense flow keeps its slot against another flow that hashes there.
	quiet = int64(1e9)
)

// Meter follows the flows of one direction of one peer. The zero value is ready; it is not
// safe for concurrent use.
type Meter struct {
	seed uint64 // the hash's, random; 0 until the first packet
	e    [Slots]entry
}

type entry struct {
	key    uint64
	at     int64 // ns: the flow's last packet
	credit int64 // bytes in the bucket; negative: debt
}

// Sparse reports whether pkt, an inner IPv4 or IPv6 packet seen at now (ns), belongs to a
// sparse flow, and counts it against its flow. A packet that is not IP, or too short to
// name its flow, is not sparse. When two flows share a slot, a dense flow heard within the
// last second keeps it and the other is counted as dense too: a collision may cost a sparse
// flow its treatment, never make a dense flow sparse.
func (m *Meter) Sparse(now int64, pkt []byte) bool {
	for m.seed == 0 {
		m.seed = rand.Uint64()
	}
	k, ok := m.key(pkt)
	if !ok {
		return false
	}
	e := &m.e[k%Slots]
	switch {
	case e.key == k && e.at != 0:
		if d := now - e.at; d >= 2*Burst*1e9/Rate {
			e.credit = Burst
		} else if d > 0 {
			e.credit = min(e.credit+d*Rate/1e9, Burst)
		}
	case e.at != 0 && e.credit < 0 && now-e.at < quiet:
		return false // a dense flow holds the slot
	default:
		e.key, e.credit = k, Burst
	}
	e.at = now
	e.credit = max(e.credit-int64(len(pkt)), -Burst)
	return e.credit >= 0
}

// key hashes the flow pkt belongs to; ok is false when pkt does not name one. The hash is a
// seeded multiply-xorshift over the header's words, a few ns: every packet pays it. A site's
// host that crafts flows to collide can only share slots between its own flows, which costs
// them the sparse treatment (Sparse).
func (m *Meter) key(pkt []byte) (uint64, bool) {
	h := m.seed
	var proto byte
	var l4 []byte
	switch {
	case len(pkt) >= 20 && pkt[0]>>4 == 4:
		ihl := int(pkt[0]&0x0f) * 4
		if ihl < 20 || len(pkt) < ihl {
			return 0, false
		}
		proto = pkt[9]
		h = mix(h, binary.LittleEndian.Uint64(pkt[12:20]))
		if binary.BigEndian.Uint16(pkt[6:])&0x1fff == 0 { // not a later fragment
			l4 = pkt[ihl:]
		}
	case len(pkt) >= 40 && pkt[0]>>4 == 6:
		proto = pkt[6]
		for i := 8; i < 40; i += 8 {
			h = mix(h, binary.LittleEndian.Uint64(pkt[i:]))
		}
		l4 = pkt[40:]
	default:
		return 0, false
	}
	v := uint64(pkt[0]>>4)<<40 | uint64(proto)<<32
	if (proto == 6 || proto == 17) && len(l4) >= 4 {
		v |= uint64(binary.LittleEndian.Uint32(l4))
	}
	return mix(h, v), true
}

func mix(h, v uint64) uint64 {
	h = (h ^ v) * 0x9e3779b97f4a7c15
	return h ^ h>>29
}
