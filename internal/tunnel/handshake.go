package tunnel

import (
	"bytes"
	"time"

	"braid/internal/tunnel/session"
)

// initCopyWindow is how long after an initiation was accepted a copy of it may still arrive
// over another path: the initiator sends each initiation on every path at once, so the copies
// are apart by the paths' difference in delay.
const initCopyWindow = 2 * time.Second

// initCopies recognises the copies of the last initiation a peer's responder accepted. The
// initiator sends every initiation on each of its paths (so that one working path is enough
// for a handshake); the responder answers the first copy and must not take the others, which
// carry the same timestamp, for replays. A copy is expected at most once per path and within
// initCopyWindow; anything else that repeats an old initiation is a replay.
type initCopies struct {
	msg  [session.MaxInitLen]byte
	n    int
	at   int64
	seen [4]uint64 // paths (ids 0..253) that delivered it
	set  bool
}

// record remembers msg, accepted at now from path id.
func (c *initCopies) record(msg []byte, now int64, id uint8) {
	c.n = copy(c.msg[:], msg)
	c.at, c.seen, c.set = now, [4]uint64{}, true
	c.mark(id)
}

// copyOf reports whether msg, which is not newer than the last initiation accepted, is a copy
// of that one arriving on a path that has not delivered it yet, within initCopyWindow; it
// marks the path as having delivered it.
func (c *initCopies) copyOf(msg []byte, now int64, id uint8) bool {
	if !c.set || time.Duration(now-c.at) > initCopyWindow || !bytes.Equal(msg, c.msg[:c.n]) {
		return false
	}
	if c.seen[id/64]&(1<<(id%64)) != 0 {
		return false
	}
	c.mark(id)
	return true
}

func (c *initCopies) mark(id uint8) { c.seen[id/64] |= 1 << (id % 64) }

// cipherName is what the status and the log say of a session's protection: its AEAD, or, with
// encryption off, that data travels in clear under the AEAD's tag only.
func (t *Tunnel) cipherName(s *session.Session) string {
	if t.o.Cleartext {
		return "none (authenticated only, " + s.Cipher.String() + " tag)"
	}
	return s.Cipher.String()
}
