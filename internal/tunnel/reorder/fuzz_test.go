package reorder

import (
	"encoding/binary"
	"testing"
	"time"
)

// FuzzReorderHostile pushes a hostile peer's sequence numbers (issue 18 item 16): the input
// is a list of 7-byte arrivals (a mode, a 32-bit value, a size) that wrap, jump by huge
// amounts, repeat, go backwards, and are spaced in time by the fuzzer, and what the paths
// claim is in flight (SetInFlight) is arbitrary. The buffer must not panic, must never hold
// more than MaxPackets packets or MaxBytes bytes, must hold nothing past its deadline after an
// Expire, must release every packet at most once, and, once flushed, must have released or
// counted as a duplicate every packet pushed. A mode with its top bit set places the number
// instead (Place: the caller delivered the packet): the buffer must never release a placed
// packet, and every placed number is counted as placed or as a duplicate. As time passes, the
// gaps Overdue names are held for a resend (Rescue) for an arbitrary while: Overdue must name
// only missing numbers, and a rescue must not keep a packet past its deadline either.
func FuzzReorderHostile(f *testing.F) {
	arrival := func(mode byte, v uint32, size uint16) []byte {
		b := []byte{mode, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], v)
		binary.BigEndian.PutUint16(b[5:], size)
		return b
	}
	cat := func(bs ...[]byte) (out []byte) {
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	f.Add(cat(arrival(0, 0xfffffffe, 100), arrival(1, 1, 100), arrival(1, 1, 100), arrival(1, 1, 100)))                      // wrap
	f.Add(cat(arrival(0, 5, 100), arrival(1, 1<<31, 100), arrival(1, 1<<30, 1500), arrival(0, 5, 100)))                      // huge jumps
	f.Add(cat(arrival(0, 10, 100), arrival(2, 0, 100), arrival(2, 0, 100), arrival(1, 3, 100), arrival(2, 0, 100)))          // duplicates
	f.Add(cat(arrival(0, 1000, 100), arrival(3, 900, 100), arrival(3, 5000, 100), arrival(4, 0, 65535)))                     // backwards, time
	f.Add(cat(arrival(0, 0, 60000), arrival(1, 2, 60000), arrival(1, 2, 60000), arrival(1, 2, 60000), arrival(1, 2, 1)))     // bytes bound
	f.Add(cat(arrival(0, 10, 100), arrival(0x81, 2, 100), arrival(0x82, 0, 100), arrival(0x83, 1, 100), arrival(1, 1, 100))) // placed
	f.Fuzz(func(t *testing.T, in []byte) {
		c := Config{MaxPackets: 16, MaxBytes: 64 << 10, MinHold: time.Millisecond, MaxHold: 20 * time.Millisecond, Hold: 5 * time.Millisecond}.Defaults()
		b, err := New[int](c)
		if err != nil {
			t.Fatal(err)
		}
		released := map[int]int{}
		var out []int
		now := int64(1)
		var seq uint32
		pushed, placed := 0, 0
		for i := 0; i+7 <= len(in) && i < 7*4096; i += 7 {
			mode, v, size := in[i], binary.BigEndian.Uint32(in[i+1:]), int(binary.BigEndian.Uint16(in[i+5:]))
			switch mode % 5 {
			case 0:
				seq = v // anywhere
			case 1:
				seq += v // forward, by any amount (wraps)
			case 2:
				// the same number again
			case 3:
				seq -= v % 4096 // backwards
			case 4:
				// Time passes; expired packets go, with whatever the paths claim is still
				// in flight (below, at or beyond the gap, or nothing).
				now += int64(v % uint32(time.Second))
				b.SetInFlight(seq-v%8, v&1 == 0)
				if v&2 != 0 {
					// The caller asks for the overdue gaps again and holds them for the
					// resends a while.
					for _, x := range b.Overdue(now, int64(v%uint32(20*time.Millisecond)), seq-v%64, 64, nil) {
						if b.Seen(x) {
							t.Fatalf("Overdue named %d, which is held", x)
						}
						b.Rescue(x, now+int64(v%uint32(50*time.Millisecond)))
					}
				}
				out = b.Expire(now, out[:0])
				for _, id := range out {
					released[id]++
				}
				if at, ok := b.NextDeadline(); ok && at <= now {
					t.Fatalf("after Expire at %d a packet is still due at %d", now, at)
				}
				continue
			}
			now += int64(v % 1000)
			if mode&0x80 != 0 {
				out, _ = b.Place(now, seq, out[:0])
				placed++
			} else {
				pushed++
				out = b.Push(now, seq, size, pushed, out[:0]) // ids from 1: 0 is a placed packet's
			}
			for _, id := range out {
				released[id]++
			}
			st := b.Stats()
			if st.Packets > c.MaxPackets || st.Bytes > c.MaxBytes || st.Packets < 0 || st.Bytes < 0 {
				t.Fatalf("holds %d packets, %d bytes: bounds %d, %d", st.Packets, st.Bytes, c.MaxPackets, c.MaxBytes)
			}
		}
		for _, id := range b.Flush(out[:0]) {
			released[id]++
		}
		for id, n := range released {
			if n != 1 || id < 1 || id > pushed {
				t.Fatalf("packet %d released %d times (%d pushed)", id, n, pushed)
			}
		}
		st := b.Stats()
		if st.Packets != 0 || st.Bytes != 0 {
			t.Fatalf("after Flush: %d packets, %d bytes held", st.Packets, st.Bytes)
		}
		if uint64(len(released))+st.Duplicates+st.Placed != uint64(pushed+placed) {
			t.Fatalf("%d pushed, %d placed; %d released, %d duplicates, %d counted as placed", pushed, placed, len(released), st.Duplicates, st.Placed)
		}
	})
}
