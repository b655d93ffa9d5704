// Package socks5 encodes and decodes the requests of the federation proxy: plain SOCKS5
// (RFC 1928) for ordinary clients, and the proxy-to-proxy header of the "Multipath Cloud
// Federation" dialect, whose address types carry the original destination and the original
// source of an intercepted connection.
//
// # RFC 1928 (ordinary clients)
//
//	greeting  | VER=5 | NMETHODS | METHODS (NMETHODS bytes) |
//	selection | VER=5 | METHOD |
//	request   | VER=5 | CMD | RSV=0 | ATYP | DST.ADDR (var) | DST.PORT (2) |
//	reply     | VER=5 | REP | RSV=0 | ATYP | BND.ADDR (var) | BND.PORT (2) |
//
// ATYP 1 is an IPv4 address (4 bytes), 3 a domain name (1 length byte, then the name), 4 an
// IPv6 address (16 bytes). Ports are big-endian.
//
// # The braid dialect (proxy to proxy)
//
// The first bytes of every proxy-to-proxy stream, sent together with the client's first data
// and answered by nothing (no round trip):
//
//	 0       1       2       3
//	+-------+-------+-------+---------------------------------------------+
//	| VER=1 | HLEN  | ATYP  | fields of ATYP                              |
//	+-------+-------+-------+---------------------------------------------+
//
//	ATYP 0x05 (IPv4 destination and source), HLEN 19:
//	  DST.ADDR (4) | SRC.ADDR (4) | SRC.PORT (2) | DST.PORT (2) | MARK (4)
//	ATYP 0x06 (IPv6 destination and source), HLEN 43:
//	  DST.ADDR (16) | SRC.ADDR (16) | SRC.PORT (2) | DST.PORT (2) | MARK (4)
//	ATYP 0x01 (IPv4 destination only), HLEN 9:  DST.ADDR (4) | DST.PORT (2)
//	ATYP 0x04 (IPv6 destination only), HLEN 21: DST.ADDR (16) | DST.PORT (2)
//
// The 0x05/0x06 fields are the paper's, in its order (source port before destination port);
// unlike the paper's implementation every field, MARK included, is big-endian, and HLEN names
// the exact length so that a receiver reads the whole header and nothing more.
//
// # Compatibility profile
//
// AppendCompat and DecodeCompat read and write the paper implementation's own bytes: ATYP 5
// (17 bytes) or 6 (41 bytes) as above without VER and HLEN, MARK little-endian (as x86-64 hosts
// wrote it). They never emit the two stray trailing bytes of that implementation.
package socks5

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Version is the SOCKS version byte; DialectVersion the braid dialect's.
const (
	Version        = 0x05
	DialectVersion = 0x01
)

// Authentication methods (RFC 1928 §3).
const (
	MethodNoAuth       = 0x00
	MethodGSSAPI       = 0x01
	MethodUserPass     = 0x02
	MethodNoAcceptable = 0xFF
)

// Commands (RFC 1928 §4).
const (
	CmdConnect      = 0x01
	CmdBind         = 0x02
	CmdUDPAssociate = 0x03
)

// Address types: RFC 1928's and the federation dialect's.
const (
	AtypIPv4       = 0x01
	AtypDomain     = 0x03
	AtypIPv6       = 0x04
	AtypIPv4Source = 0x05 // destination, source and mark, IPv4
	AtypIPv6Source = 0x06 // destination, source and mark, IPv6
)

// Reply codes (RFC 1928 §6).
const (
	RepSucceeded           = 0x00
	RepGeneralFailure      = 0x01
	RepNotAllowed          = 0x02
	RepNetworkUnreachable  = 0x03
	RepHostUnreachable     = 0x04
	RepConnectionRefused   = 0x05
	RepTTLExpired          = 0x06
	RepCommandUnsupported  = 0x07
	RepAddrTypeUnsupported = 0x08
)

// Errors. Each says what the receiver must do: ErrShort asks for more bytes; the others end
// the exchange (for RFC 1928 requests, ErrAddrType is answered with RepAddrTypeUnsupported and
// ErrCommand with RepCommandUnsupported before closing; a dialect error resets the stream).
var (
	ErrShort    = errors.New("socks5: truncated")
	ErrVersion  = errors.New("socks5: unknown version")
	ErrAddrType = errors.New("socks5: unknown address type")
	ErrCommand  = errors.New("socks5: unsupported command")
	ErrLength   = errors.New("socks5: header length does not match its address type")
	ErrReserved = errors.New("socks5: reserved byte not zero")
	ErrMethods  = errors.New("socks5: greeting offers no methods")
	ErrAddress  = errors.New("socks5: invalid address")
)

// MaxRequestLen is the longest RFC 1928 request (a 255-byte domain name).
const MaxRequestLen = 4 + 1 + 255 + 2

// Addr is a SOCKS destination: an IP address or a domain name, and a port.
type Addr struct {
	IP   netip.Addr // valid for ATYP 1 and 4
	Name string     // set for ATYP 3
	Port uint16
}

// AddrPort returns the address as an AddrPort (invalid for a domain name).
func (a Addr) AddrPort() netip.AddrPort {
	if !a.IP.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a.IP, a.Port)
}

func (a Addr) atyp() (byte, error) {
	switch {
	case a.IP.Is4():
		return AtypIPv4, nil
	case a.IP.Is6():
		return AtypIPv6, nil
	case a.Name != "" && len(a.Name) <= 255:
		return AtypDomain, nil
	}
	return 0, ErrAddress
}

// appendAddr writes ATYP, ADDR and PORT.
func appendAddr(b []byte, a Addr) ([]byte, error) {
	t, err := a.atyp()
	if err != nil {
		return b, err
	}
	b = append(b, t)
	switch t {
	case AtypIPv4:
		ip := a.IP.As4()
		b = append(b, ip[:]...)
	case AtypIPv6:
		ip := a.IP.As16()
		b = append(b, ip[:]...)
	default:
		b = append(b, byte(len(a.Name)))
		b = append(b, a.Name...)
	}
	return binary.BigEndian.AppendUint16(b, a.Port), nil
}

// addrLen returns the length of ATYP|ADDR|PORT at the start of b, from its first one or two
// bytes.
func addrLen(b []byte) (int, error) {
	if len(b) < 1 {
		return 0, ErrShort
	}
	switch b[0] {
	case AtypIPv4:
		return 1 + 4 + 2, nil
	case AtypIPv6:
		return 1 + 16 + 2, nil
	case AtypDomain:
		if len(b) < 2 {
			return 0, ErrShort
		}
		return 2 + int(b[1]) + 2, nil
	}
	return 0, ErrAddrType
}

// decodeAddr reads ATYP|ADDR|PORT from b.
func decodeAddr(b []byte) (Addr, int, error) {
	n, err := addrLen(b)
	if err != nil {
		return Addr{}, 0, err
	}
	if len(b) < n {
		return Addr{}, 0, ErrShort
	}
	var a Addr
	switch b[0] {
	case AtypIPv4:
		a.IP = netip.AddrFrom4([4]byte(b[1:5]))
	case AtypIPv6:
		a.IP = netip.AddrFrom16([16]byte(b[1:17]))
	default:
		if b[1] == 0 {
			return Addr{}, 0, ErrAddress
		}
		a.Name = string(b[2 : 2+int(b[1])])
	}
	a.Port = binary.BigEndian.Uint16(b[n-2:])
	return a, n, nil
}

// Greeting is the client's first message: the methods it offers.
type Greeting struct {
	Methods []byte
}

// GreetingLen returns the length of the greeting starting with b (at least 2 bytes), or
// ErrShort.
func GreetingLen(b []byte) (int, error) {
	if len(b) < 2 {
		return 0, ErrShort
	}
	if b[0] != Version {
		return 0, ErrVersion
	}
	return 2 + int(b[1]), nil
}

// Decode overwrites g with the greeting at the start of b and returns its length. Errors:
// ErrShort, ErrVersion, ErrMethods; on error g is zero.
func (g *Greeting) Decode(b []byte) (int, error) {
	*g = Greeting{}
	n, err := GreetingLen(b)
	if err != nil {
		return 0, err
	}
	if n == 2 {
		return 0, ErrMethods
	}
	if len(b) < n {
		return 0, ErrShort
	}
	g.Methods = append([]byte(nil), b[2:n]...)
	return n, nil
}

// Append appends the greeting to b.
func (g Greeting) Append(b []byte) ([]byte, error) {
	if len(g.Methods) == 0 || len(g.Methods) > 255 {
		return b, ErrMethods
	}
	b = append(b, Version, byte(len(g.Methods)))
	return append(b, g.Methods...), nil
}

// Offers reports whether the greeting offers method m.
func (g Greeting) Offers(m byte) bool {
	for _, x := range g.Methods {
		if x == m {
			return true
		}
	}
	return false
}

// AppendSelection appends the server's method selection.
func AppendSelection(b []byte, method byte) []byte { return append(b, Version, method) }

// Request is an RFC 1928 request.
type Request struct {
	Cmd byte
	Dst Addr
}

// RequestLen returns the length of the request starting with b, from its first 4 (5 for a
// domain name) bytes, or ErrShort; ErrVersion and ErrAddrType as Decode.
func RequestLen(b []byte) (int, error) {
	if len(b) < 4 {
		return 0, ErrShort
	}
	if b[0] != Version {
		return 0, ErrVersion
	}
	n, err := addrLen(b[3:])
	if err != nil {
		return 0, err
	}
	return 3 + n, nil
}

// Decode overwrites r with the request at the start of b and returns its length. Errors, in
// the order checked: ErrShort, ErrVersion, ErrAddrType, ErrReserved, ErrAddress, ErrCommand
// (the whole request was read: the caller can answer it). On error r is zero, except that
// with ErrCommand r holds the request.
func (r *Request) Decode(b []byte) (int, error) {
	*r = Request{}
	n, err := RequestLen(b)
	if err != nil {
		return 0, err
	}
	if len(b) < n {
		return 0, ErrShort
	}
	if b[2] != 0 {
		return 0, ErrReserved
	}
	a, _, err := decodeAddr(b[3:n])
	if err != nil {
		return 0, err
	}
	r.Cmd, r.Dst = b[1], a
	if r.Cmd != CmdConnect && r.Cmd != CmdBind && r.Cmd != CmdUDPAssociate {
		return n, ErrCommand
	}
	return n, nil
}

// Append appends the request to b.
func (r Request) Append(b []byte) ([]byte, error) {
	if r.Cmd != CmdConnect && r.Cmd != CmdBind && r.Cmd != CmdUDPAssociate {
		return b, ErrCommand
	}
	return appendAddr(append(b, Version, r.Cmd, 0), r.Dst)
}

// Reply is the server's answer to a request.
type Reply struct {
	Code byte
	Bind Addr
}

// Append appends the reply to b. An unset Bind is written as 0.0.0.0:0.
func (r Reply) Append(b []byte) ([]byte, error) {
	a := r.Bind
	if !a.IP.IsValid() && a.Name == "" {
		a = Addr{IP: netip.IPv4Unspecified()}
	}
	return appendAddr(append(b, Version, r.Code, 0), a)
}

// Decode overwrites r with the reply at the start of b and returns its length. Errors:
// ErrShort, ErrVersion, ErrAddrType, ErrReserved, ErrAddress.
func (r *Reply) Decode(b []byte) (int, error) {
	*r = Reply{}
	n, err := RequestLen(b) // same shape
	if err != nil {
		return 0, err
	}
	if len(b) < n {
		return 0, ErrShort
	}
	if b[2] != 0 {
		return 0, ErrReserved
	}
	a, _, err := decodeAddr(b[3:n])
	if err != nil {
		return 0, err
	}
	r.Code, r.Bind = b[1], a
	return n, nil
}

// Header is the dialect's proxy-to-proxy request: where to connect, and which source to
// restore there. Src is invalid when the header carries no source (ATYP 1 and 4).
type Header struct {
	Dst  netip.AddrPort
	Src  netip.AddrPort
	Mark uint32
}

// Dialect header lengths per address type (VER, HLEN and ATYP included).
const (
	hlenIPv4       = 3 + 4 + 2
	hlenIPv6       = 3 + 16 + 2
	hlenIPv4Source = 3 + 4 + 4 + 2 + 2 + 4
	hlenIPv6Source = 3 + 16 + 16 + 2 + 2 + 4
	// MaxHeaderLen is the longest dialect header.
	MaxHeaderLen = hlenIPv6Source
	// MinHeaderLen is the shortest, and what HeaderLen needs to see.
	MinHeaderLen = 3
)

func dialectLen(atyp byte) int {
	switch atyp {
	case AtypIPv4:
		return hlenIPv4
	case AtypIPv6:
		return hlenIPv6
	case AtypIPv4Source:
		return hlenIPv4Source
	case AtypIPv6Source:
		return hlenIPv6Source
	}
	return 0
}

// HeaderLen returns the length of the dialect header starting with b (its first 3 bytes), so
// that a receiver reads exactly that much. Errors: ErrShort, ErrVersion, ErrAddrType, ErrLength.
func HeaderLen(b []byte) (int, error) {
	if len(b) < MinHeaderLen {
		return 0, ErrShort
	}
	if b[0] != DialectVersion {
		return 0, ErrVersion
	}
	n := dialectLen(b[2])
	if n == 0 {
		return 0, ErrAddrType
	}
	if int(b[1]) != n {
		return 0, ErrLength
	}
	return n, nil
}

// Decode overwrites h with the dialect header at the start of b and returns its length.
// Errors, in the order checked: ErrShort, ErrVersion, ErrAddrType, ErrLength, ErrAddress (an
// unspecified or zero-port destination); on error h is zero.
func (h *Header) Decode(b []byte) (int, error) {
	*h = Header{}
	n, err := HeaderLen(b)
	if err != nil {
		return 0, err
	}
	if len(b) < n {
		return 0, ErrShort
	}
	var d Header
	f := b[3:n]
	switch b[2] {
	case AtypIPv4:
		d.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(f[0:4])), binary.BigEndian.Uint16(f[4:6]))
	case AtypIPv6:
		d.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(f[0:16])), binary.BigEndian.Uint16(f[16:18]))
	case AtypIPv4Source:
		d = decodeSourced(f, 4, binary.BigEndian)
	case AtypIPv6Source:
		d = decodeSourced(f, 16, binary.BigEndian)
	}
	if err := d.check(); err != nil {
		return 0, err
	}
	*h = d
	return n, nil
}

// decodeSourced reads DST.ADDR | SRC.ADDR | SRC.PORT | DST.PORT | MARK with addresses of size
// bytes and MARK in byte order o.
func decodeSourced(f []byte, size int, o binary.ByteOrder) Header {
	var dst, src netip.Addr
	if size == 4 {
		dst, src = netip.AddrFrom4([4]byte(f[0:4])), netip.AddrFrom4([4]byte(f[4:8]))
	} else {
		dst, src = netip.AddrFrom16([16]byte(f[0:16])), netip.AddrFrom16([16]byte(f[16:32]))
	}
	p := f[2*size:]
	return Header{
		Src:  netip.AddrPortFrom(src, binary.BigEndian.Uint16(p[0:2])),
		Dst:  netip.AddrPortFrom(dst, binary.BigEndian.Uint16(p[2:4])),
		Mark: o.Uint32(p[4:8]),
	}
}

func (h Header) check() error {
	if !h.Dst.IsValid() || h.Dst.Addr().IsUnspecified() || h.Dst.Port() == 0 || h.Dst.Addr().Is4In6() {
		return ErrAddress
	}
	if h.Src.IsValid() {
		if h.Src.Addr().IsUnspecified() || h.Src.Port() == 0 || h.Src.Addr().Is4In6() || h.Src.Addr().Is4() != h.Dst.Addr().Is4() {
			return ErrAddress
		}
	}
	return nil
}

// Append appends the dialect header to b: ATYP 5 or 6 when Src is valid (both of Dst's
// family), else 1 or 4 (Mark is then not sent). IPv4-mapped IPv6 addresses are sent as IPv4.
func (h Header) Append(b []byte) ([]byte, error) {
	h = h.unmapped()
	if err := h.check(); err != nil {
		return b, err
	}
	v4 := h.Dst.Addr().Is4()
	switch {
	case !h.Src.IsValid() && v4:
		b = append(b, DialectVersion, hlenIPv4, AtypIPv4)
		ip := h.Dst.Addr().As4()
		b = append(b, ip[:]...)
		return binary.BigEndian.AppendUint16(b, h.Dst.Port()), nil
	case !h.Src.IsValid():
		b = append(b, DialectVersion, hlenIPv6, AtypIPv6)
		ip := h.Dst.Addr().As16()
		b = append(b, ip[:]...)
		return binary.BigEndian.AppendUint16(b, h.Dst.Port()), nil
	case v4:
		b = append(b, DialectVersion, hlenIPv4Source, AtypIPv4Source)
	default:
		b = append(b, DialectVersion, hlenIPv6Source, AtypIPv6Source)
	}
	return appendSourced(b, h, binary.BigEndian), nil
}

func appendSourced(b []byte, h Header, o binary.AppendByteOrder) []byte {
	if h.Dst.Addr().Is4() {
		d, s := h.Dst.Addr().As4(), h.Src.Addr().As4()
		b = append(append(b, d[:]...), s[:]...)
	} else {
		d, s := h.Dst.Addr().As16(), h.Src.Addr().As16()
		b = append(append(b, d[:]...), s[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, h.Src.Port())
	b = binary.BigEndian.AppendUint16(b, h.Dst.Port())
	return o.AppendUint32(b, h.Mark)
}

func (h Header) unmapped() Header {
	if h.Dst.IsValid() {
		h.Dst = netip.AddrPortFrom(h.Dst.Addr().Unmap(), h.Dst.Port())
	}
	if h.Src.IsValid() {
		h.Src = netip.AddrPortFrom(h.Src.Addr().Unmap(), h.Src.Port())
	}
	return h
}

// Compatibility profile lengths.
const (
	CompatIPv4Len = 1 + 4 + 4 + 2 + 2 + 4
	CompatIPv6Len = 1 + 16 + 16 + 2 + 2 + 4
)

// AppendCompat appends h in the paper implementation's layout (ATYP 5 or 6, MARK
// little-endian, no trailing bytes). Src must be valid.
func AppendCompat(b []byte, h Header) ([]byte, error) {
	h = h.unmapped()
	if !h.Src.IsValid() {
		return b, ErrAddress
	}
	if err := h.check(); err != nil {
		return b, err
	}
	if h.Dst.Addr().Is4() {
		b = append(b, AtypIPv4Source)
	} else {
		b = append(b, AtypIPv6Source)
	}
	return appendSourced(b, h, binary.LittleEndian), nil
}

// DecodeCompat overwrites h with a header in the paper implementation's layout at the start
// of b and returns its length (17 or 41). Errors: ErrShort, ErrAddrType (only ATYP 5 and 6,
// with the high nibble masked off as that implementation does), ErrAddress.
func DecodeCompat(h *Header, b []byte) (int, error) {
	*h = Header{}
	if len(b) < 1 {
		return 0, ErrShort
	}
	var n, size int
	switch b[0] & 0x0F {
	case AtypIPv4Source:
		n, size = CompatIPv4Len, 4
	case AtypIPv6Source:
		n, size = CompatIPv6Len, 16
	default:
		return 0, ErrAddrType
	}
	if len(b) < n {
		return 0, ErrShort
	}
	d := decodeSourced(b[1:n], size, binary.LittleEndian)
	if err := d.check(); err != nil {
		return 0, err
	}
	*h = d
	return n, nil
}
