package core

import (
	"strconv"
	"strings"
)

// parseAddr parses an IPv4 (dotted quad) or IPv6 address in text form into 16 bytes (IPv4 as
// IPv4-mapped), reporting whether it is IPv4 (or IPv4-mapped). The package keeps to text and
// to no network package (it is pure: archtest); this is the little of net/netip it needs.
func parseAddr(s string) (b [16]byte, v4 bool, ok bool) {
	if i := strings.IndexByte(s, '%'); i >= 0 {
		s = s[:i] // a zone names an interface, not an address
	}
	if !strings.Contains(s, ":") {
		q, ok := parseV4(s)
		b[10], b[11] = 0xff, 0xff
		copy(b[12:], q[:])
		return b, true, ok
	}
	head, tail, double := strings.Cut(s, "::")
	var words []uint16
	var tailWords []uint16
	parse := func(part string, out *[]uint16, last bool) bool {
		if part == "" {
			return true
		}
		fields := strings.Split(part, ":")
		for i, f := range fields {
			if last && i == len(fields)-1 && strings.Contains(f, ".") {
				q, ok := parseV4(f)
				if !ok {
					return false
				}
				*out = append(*out, uint16(q[0])<<8|uint16(q[1]), uint16(q[2])<<8|uint16(q[3]))
				continue
			}
			if len(f) == 0 || len(f) > 4 {
				return false
			}
			v, err := strconv.ParseUint(f, 16, 16)
			if err != nil {
				return false
			}
			*out = append(*out, uint16(v))
		}
		return true
	}
	if !double {
		if !parse(s, &words, true) || len(words) != 8 {
			return b, false, false
		}
	} else {
		if strings.Contains(tail, "::") || !parse(head, &words, false) || !parse(tail, &tailWords, true) || len(words)+len(tailWords) > 7 {
			return b, false, false
		}
		words = append(append(words, make([]uint16, 8-len(words)-len(tailWords))...), tailWords...)
	}
	for i, w := range words {
		b[2*i], b[2*i+1] = byte(w>>8), byte(w)
	}
	mapped := [12]byte{10: 0xff, 11: 0xff}
	return b, [12]byte(b[:12]) == mapped, true
}

func parseV4(s string) (q [4]byte, ok bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return q, false
	}
	for i, p := range parts {
		if len(p) == 0 || len(p) > 3 || (len(p) > 1 && p[0] == '0') {
			return q, false
		}
		v, err := strconv.ParseUint(p, 10, 8)
		if err != nil {
			return q, false
		}
		q[i] = byte(v)
	}
	return q, true
}

// announceable reports whether addr, announced by the peer of a connection of family v6, is
// an address a peer can have: parsed, of the connection's family, and not unspecified, "this
// network" (0/8), loopback, multicast, broadcast, nor link-local unless allowLinkLocal.
func announceable(addr string, v6, allowLinkLocal bool) bool {
	b, v4, ok := parseAddr(addr)
	if !ok || v4 == v6 {
		return false
	}
	if v4 {
		q := b[12:]
		switch {
		case q[0] == 0, q[0] == 127, q[0] >= 224 && q[0] <= 239, q[0] == 255 && q[1] == 255 && q[2] == 255 && q[3] == 255:
			return false
		case q[0] == 169 && q[1] == 254:
			return allowLinkLocal
		}
		return true
	}
	switch {
	case b == [16]byte{}, b == [16]byte{15: 1}, b[0] == 0xff:
		return false // unspecified, loopback, multicast
	case b[0] == 0xfe && b[1]&0xc0 == 0x80:
		return allowLinkLocal
	}
	return true
}
