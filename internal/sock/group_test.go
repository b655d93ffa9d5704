package sock

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
)

// A group of sockets hands each datagram to the socket its key (the word at SteerOffset)
// picks, modulo the group's size, whatever port it comes from; a datagram too short for a key
// goes to the first socket.
func TestListenGroupSteers(t *testing.T) {
	const n = 3
	g, err := ListenGroup(netip.MustParseAddrPort("127.0.0.1:0"), "", n)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Shards() != n {
		t.Fatalf("%d sockets, want %d", g.Shards(), n)
	}
	dst := g.LocalAddr().(*net.UDPAddr)
	type got struct {
		shard int
		key   uint32
		short bool
	}
	recv := make(chan got, 64)
	for i := range n {
		go func() {
			b, oob := make([]byte, 2048), make([]byte, 128)
			for {
				m, _, _, err := g.ReadShard(i, b, oob)
				if err != nil {
					return
				}
				if m < SteerOffset+4 {
					recv <- got{shard: i, short: true}
					continue
				}
				recv <- got{shard: i, key: binary.BigEndian.Uint32(b[SteerOffset:])}
			}
		}()
	}
	// Several senders (source ports), each with keys of every remainder.
	sent := 0
	for range 4 {
		c, err := net.DialUDP("udp4", nil, dst)
		if err != nil {
			t.Fatal(err)
		}
		for k := uint32(1000); k < 1012; k++ {
			var b [16]byte
			binary.BigEndian.PutUint32(b[SteerOffset:], k)
			c.Write(b[:])
			sent++
		}
		c.Write([]byte{1, 2})
		sent++
		c.Close()
	}
	seen := map[int]int{}
	for range sent {
		select {
		case r := <-recv:
			want := 0
			if !r.short {
				want = int(r.key % n)
			}
			if r.shard != want {
				t.Errorf("key %d (short %v) arrived on socket %d, want %d", r.key, r.short, r.shard, want)
			}
			seen[r.shard]++
		case <-time.After(5 * time.Second):
			t.Fatalf("only %v of %d datagrams arrived", seen, sent)
		}
	}
	if len(seen) != n {
		t.Errorf("datagrams arrived on %d sockets, want %d: %v", len(seen), n, seen)
	}
}
