package mpath

import "encoding/binary"

// Lengths of the plaintexts. A data packet and a probe are at least DataPrefixLen and
// ProbeMinLen long; a probe reply and a feedback message are exactly ProbeReplyLen and
// FeedbackLen long.
const (
	DataPrefixLen = 8
	ProbeMinLen   = 8
	ProbeReplyLen = 12 + FeedbackLen
	FeedbackLen   = 32
	MTUAckLen     = 8
	NackLen       = 7
	GapNackLen    = 12
)

// DataPrefix is the start of a data plaintext (type 1); the inner packet follows it.
type DataPrefix struct {
	Seq uint32 // data sequence number for reordering, per peer, over all paths
	// PathSeq numbers the data packets of one path (the sender's path in the header), one
	// after another: a gap in it at the receiver is a loss on that path, which the receiver
	// reports in a Nack.
	PathSeq uint32
}

// Decode overwrites d with the prefix of b and returns DataPrefixLen; the inner packet is
// b[DataPrefixLen:], possibly empty (InnerVersion rejects that). Error: ErrTruncated.
func (d *DataPrefix) Decode(b []byte) (n int, err error) {
	*d = DataPrefix{}
	if len(b) < DataPrefixLen {
		return 0, ErrTruncated
	}
	*d = DataPrefix{Seq: binary.BigEndian.Uint32(b), PathSeq: binary.BigEndian.Uint32(b[4:])}
	return DataPrefixLen, nil
}

// Encode writes d into b[:DataPrefixLen] and returns DataPrefixLen, or 0 if b is shorter.
func (d *DataPrefix) Encode(b []byte) int {
	if len(b) < DataPrefixLen {
		return 0
	}
	binary.BigEndian.PutUint32(b, d.Seq)
	binary.BigEndian.PutUint32(b[4:], d.PathSeq)
	return DataPrefixLen
}

// Probe is a probe plaintext (type 2). Padding makes it as large as the path MTU being probed.
type Probe struct {
	Seq       uint32
	Timestamp uint32 // sender clock, µs, echoed in the reply
	Padding   int    // bytes after Timestamp
}

// Decode overwrites p with the probe b and returns len(b): the whole of b is the probe, and
// p.Padding is what follows Timestamp, whatever its content. Error: ErrTruncated.
func (p *Probe) Decode(b []byte) (n int, err error) {
	*p = Probe{}
	if len(b) < ProbeMinLen {
		return 0, ErrTruncated
	}
	*p = Probe{Seq: binary.BigEndian.Uint32(b), Timestamp: binary.BigEndian.Uint32(b[4:]), Padding: len(b) - ProbeMinLen}
	return len(b), nil
}

// Len is the encoded length of p.
func (p *Probe) Len() int { return ProbeMinLen + p.Padding }

// Encode writes p and p.Padding zero bytes into b[:p.Len()] and returns p.Len(), or 0 if b is
// shorter or Padding is negative.
func (p *Probe) Encode(b []byte) int {
	n := p.Len()
	if p.Padding < 0 || len(b) < n {
		return 0
	}
	binary.BigEndian.PutUint32(b, p.Seq)
	binary.BigEndian.PutUint32(b[4:], p.Timestamp)
	clear(b[ProbeMinLen:n])
	return n
}

// Feedback is the path feedback (type 4, and the end of type 3): what the receiver of a path
// has seen on it.
type Feedback struct {
	Bytes          uint64 // bytes received on the path
	Packets        uint32 // packets received on the path
	Lost           uint32 // packets lost on the path, as seen by the receiver
	ReorderPackets uint32 // reorder buffer occupancy, packets
	ReorderKiB     uint32 // reorder buffer occupancy, KiB
	Time           uint32 // receiver's clock when it read the counters, µs (wraps)
	// ReorderFreeKiB is the free room of the reorder buffer, KiB: its bound in payload bytes
	// less its occupancy, the "available buffer" of buffer-aware schedulers. NoReorderBound
	// means the receiver holds no bounded buffer (reordering off).
	ReorderFreeKiB uint32
}

// NoReorderBound in Feedback.ReorderFreeKiB: the receiver's buffer is not bounded.
const NoReorderBound = 1<<32 - 1

// Decode overwrites f with the feedback b, exactly FeedbackLen bytes, and returns FeedbackLen.
// Errors: ErrTruncated, ErrTrailing.
func (f *Feedback) Decode(b []byte) (n int, err error) {
	*f = Feedback{}
	switch {
	case len(b) < FeedbackLen:
		return 0, ErrTruncated
	case len(b) > FeedbackLen:
		return 0, ErrTrailing
	}
	f.decode(b)
	return FeedbackLen, nil
}

// decode reads f from b[:FeedbackLen], which the caller has checked.
func (f *Feedback) decode(b []byte) {
	*f = Feedback{
		Bytes:          binary.BigEndian.Uint64(b),
		Packets:        binary.BigEndian.Uint32(b[8:]),
		Lost:           binary.BigEndian.Uint32(b[12:]),
		ReorderPackets: binary.BigEndian.Uint32(b[16:]),
		ReorderKiB:     binary.BigEndian.Uint32(b[20:]),
		Time:           binary.BigEndian.Uint32(b[24:]),
		ReorderFreeKiB: binary.BigEndian.Uint32(b[28:]),
	}
}

// Encode writes f into b[:FeedbackLen] and returns FeedbackLen, or 0 if b is shorter.
func (f *Feedback) Encode(b []byte) int {
	if len(b) < FeedbackLen {
		return 0
	}
	binary.BigEndian.PutUint64(b, f.Bytes)
	binary.BigEndian.PutUint32(b[8:], f.Packets)
	binary.BigEndian.PutUint32(b[12:], f.Lost)
	binary.BigEndian.PutUint32(b[16:], f.ReorderPackets)
	binary.BigEndian.PutUint32(b[20:], f.ReorderKiB)
	binary.BigEndian.PutUint32(b[24:], f.Time)
	binary.BigEndian.PutUint32(b[28:], f.ReorderFreeKiB)
	return FeedbackLen
}

// ProbeReply is a probe reply plaintext (type 3).
type ProbeReply struct {
	Seq       uint32 // the probe's
	Timestamp uint32 // the probe's, echoed
	Hold      uint32 // µs between receiving the probe and sending the reply
	Feedback  Feedback
}

// Decode overwrites r with the reply b, exactly ProbeReplyLen bytes, and returns ProbeReplyLen.
// Errors: ErrTruncated, ErrTrailing.
func (r *ProbeReply) Decode(b []byte) (n int, err error) {
	*r = ProbeReply{}
	switch {
	case len(b) < ProbeReplyLen:
		return 0, ErrTruncated
	case len(b) > ProbeReplyLen:
		return 0, ErrTrailing
	}
	r.Seq = binary.BigEndian.Uint32(b)
	r.Timestamp = binary.BigEndian.Uint32(b[4:])
	r.Hold = binary.BigEndian.Uint32(b[8:])
	r.Feedback.decode(b[12:])
	return ProbeReplyLen, nil
}

// Encode writes r into b[:ProbeReplyLen] and returns ProbeReplyLen, or 0 if b is shorter.
func (r *ProbeReply) Encode(b []byte) int {
	if len(b) < ProbeReplyLen {
		return 0
	}
	binary.BigEndian.PutUint32(b, r.Seq)
	binary.BigEndian.PutUint32(b[4:], r.Timestamp)
	binary.BigEndian.PutUint32(b[8:], r.Hold)
	r.Feedback.Encode(b[12:])
	return ProbeReplyLen
}

// MTUAck answers an MTU probe (type 6): the probe's Seq and the size of its UDP payload as it
// arrived.
type MTUAck struct {
	Seq  uint32
	Size uint32
}

// Decode overwrites a with the ack b, exactly MTUAckLen bytes, and returns MTUAckLen. Errors:
// ErrTruncated, ErrTrailing.
func (a *MTUAck) Decode(b []byte) (n int, err error) {
	*a = MTUAck{}
	switch {
	case len(b) < MTUAckLen:
		return 0, ErrTruncated
	case len(b) > MTUAckLen:
		return 0, ErrTrailing
	}
	*a = MTUAck{Seq: binary.BigEndian.Uint32(b), Size: binary.BigEndian.Uint32(b[4:])}
	return MTUAckLen, nil
}

// Encode writes a into b[:MTUAckLen] and returns MTUAckLen, or 0 if b is shorter.
func (a *MTUAck) Encode(b []byte) int {
	if len(b) < MTUAckLen {
		return 0
	}
	binary.BigEndian.PutUint32(b, a.Seq)
	binary.BigEndian.PutUint32(b[4:], a.Size)
	return MTUAckLen
}

// Nack reports data packets lost on one of the sender's paths (type 7): Count packets of
// path Path, from PathSeq First on, did not arrive. The sender sends them again, each once, on
// its fastest path.
type Nack struct {
	First uint32 // the first PathSeq missing
	Count uint16 // how many, First included
	Path  uint8  // the path they were sent on: the Path of their data packets' header
}

// Decode overwrites k with the nack b, exactly NackLen bytes, and returns NackLen. Errors:
// ErrTruncated, ErrTrailing.
func (k *Nack) Decode(b []byte) (n int, err error) {
	*k = Nack{}
	switch {
	case len(b) < NackLen:
		return 0, ErrTruncated
	case len(b) > NackLen:
		return 0, ErrTrailing
	}
	*k = Nack{First: binary.BigEndian.Uint32(b), Count: binary.BigEndian.Uint16(b[4:]), Path: b[6]}
	return NackLen, nil
}

// Encode writes k into b[:NackLen] and returns NackLen, or 0 if b is shorter.
func (k *Nack) Encode(b []byte) int {
	if len(b) < NackLen {
		return 0
	}
	binary.BigEndian.PutUint32(b, k.First)
	binary.BigEndian.PutUint16(b[4:], k.Count)
	b[6] = k.Path
	return NackLen
}

// GapNack reports data sequence numbers that the receiver's reorder buffer has waited for
// longer than its gaps usually take to fill (type 8, sessions of protocol version 4): number
// First+i is missing when bit 63-i of Missing is set (the first number is the most significant
// bit). The sender sends those it still keeps again, each once, on its fastest path. Unlike a
// Nack it names no path: a path that stalls delivers nothing, so no gap in its own numbering
// shows, while the packets numbered after what it holds arrive on the others.
type GapNack struct {
	First   uint32 // the data sequence number of bit 63
	Missing uint64 // bit 63-i: number First+i is missing
}

// Decode overwrites k with the gap nack b, exactly GapNackLen bytes, and returns GapNackLen.
// Errors: ErrTruncated, ErrTrailing.
func (k *GapNack) Decode(b []byte) (n int, err error) {
	*k = GapNack{}
	switch {
	case len(b) < GapNackLen:
		return 0, ErrTruncated
	case len(b) > GapNackLen:
		return 0, ErrTrailing
	}
	*k = GapNack{First: binary.BigEndian.Uint32(b), Missing: binary.BigEndian.Uint64(b[4:])}
	return GapNackLen, nil
}

// Encode writes k into b[:GapNackLen] and returns GapNackLen, or 0 if b is shorter.
func (k *GapNack) Encode(b []byte) int {
	if len(b) < GapNackLen {
		return 0
	}
	binary.BigEndian.PutUint32(b, k.First)
	binary.BigEndian.PutUint64(b[4:], k.Missing)
	return GapNackLen
}
