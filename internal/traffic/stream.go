package traffic

import (
	"encoding/binary"
	"math/rand/v2"
)

// newStream returns the deterministic pseudo-random byte stream of seed: ChaCha8 keyed with the
// seed, so it never repeats within any practical length and generates several GB/s.
func newStream(seed uint64) *rand.ChaCha8 {
	var key [32]byte
	copy(key[:], "braid/traffic stream key")
	binary.BigEndian.PutUint64(key[24:], seed)
	return rand.NewChaCha8(key)
}
