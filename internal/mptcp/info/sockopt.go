package info

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Socket options at level SOL_MPTCP.
const (
	optInfo         = 1
	optTCPInfo      = 2
	optSubflowAddrs = 3
	optFullInfo     = 4
)

// getsockopt calls getsockopt(fd, level, opt, buf, &len) with buf as both input and output
// (the MPTCP options read headers from it) and returns the length the kernel wrote.
func getsockopt(c syscall.Conn, level, opt int, buf []byte) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n uint32 = uint32(len(buf))
	var serr syscall.Errno
	cerr := rc.Control(func(fd uintptr) {
		_, _, serr = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt),
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	})
	runtime.KeepAlive(buf)
	if cerr != nil {
		return 0, cerr
	}
	if serr != 0 {
		return 0, serr
	}
	return int(n), nil
}

// checkMPTCP tells an MPTCP socket that fell back from a socket that never was MPTCP.
func checkMPTCP(c syscall.Conn, op string, err error) error {
	var b [4]byte
	if _, perr := getsockopt(c, unix.SOL_SOCKET, unix.SO_PROTOCOL, b[:]); perr == nil && binary.NativeEndian.Uint32(b[:]) != unix.IPPROTO_MPTCP {
		return ErrNotMPTCP
	}
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOPROTOOPT) {
		return ErrFallback
	}
	return fmt.Errorf("info: %s: %w", op, err)
}

// Info returns MPTCP_INFO of an MPTCP socket (a *net.TCPConn from a dialer or listener with
// SetMultipathTCP(true)).
func Info(c syscall.Conn) (ConnInfo, error) {
	buf := make([]byte, mptcpInfoSize)
	n, err := getsockopt(c, unix.SOL_MPTCP, optInfo, buf)
	if err != nil {
		return ConnInfo{}, checkMPTCP(c, "MPTCP_INFO", err)
	}
	return DecodeConnInfo(buf[:n]), nil
}

// subflowArray asks for an array option (MPTCP_TCPINFO, MPTCP_SUBFLOW_ADDRS): a 16-byte
// mptcp_subflow_data header followed by room for n elements of size elem. It grows the
// buffer when the connection has more subflows than it had room for.
func subflowArray(c syscall.Conn, opt int, elem int, what string) ([][]byte, error) {
	n := 8
	for range 4 {
		buf := make([]byte, subflowDataSize+n*elem)
		le := binary.NativeEndian
		le.PutUint32(buf[0:], subflowDataSize)
		le.PutUint32(buf[12:], uint32(elem))
		if _, err := getsockopt(c, unix.SOL_MPTCP, opt, buf); err != nil {
			return nil, checkMPTCP(c, what, err)
		}
		num := int(le.Uint32(buf[4:]))
		if num > n {
			n = num + 4
			continue
		}
		size := int(le.Uint32(buf[12:])) // the kernel writes back min(user, kernel)
		if size == 0 || size > elem {
			size = elem
		}
		out := make([][]byte, num)
		for i := range out {
			out[i] = buf[subflowDataSize+i*size : subflowDataSize+(i+1)*size]
		}
		return out, nil
	}
	return nil, fmt.Errorf("info: %s: the number of subflows keeps growing", what)
}

// TCPInfos returns MPTCP_TCPINFO: the tcp_info of every subflow.
func TCPInfos(c syscall.Conn) ([]TCPInfo, error) {
	elems, err := subflowArray(c, optTCPInfo, tcpInfoSize, "MPTCP_TCPINFO")
	if err != nil {
		return nil, err
	}
	out := make([]TCPInfo, len(elems))
	for i, b := range elems {
		out[i] = DecodeTCPInfo(b)
	}
	return out, nil
}

// SubflowAddrs returns MPTCP_SUBFLOW_ADDRS: the addresses of every subflow.
func SubflowAddrs(c syscall.Conn) ([]AddrPair, error) {
	elems, err := subflowArray(c, optSubflowAddrs, addrsSize, "MPTCP_SUBFLOW_ADDRS")
	if err != nil {
		return nil, err
	}
	out := make([]AddrPair, len(elems))
	for i, b := range elems {
		if out[i], err = decodeAddrPair(b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Full returns MPTCP_FULL_INFO (Linux 6.5+): the connection's mptcp_info and, for every
// subflow, its id, addresses and tcp_info, read atomically by the kernel.
func Full(c syscall.Conn) (Conn, error) {
	n := 8
	for range 4 {
		sf := make([]byte, n*sfInfoSize)
		tcp := make([]byte, n*tcpInfoSize)
		buf := make([]byte, fullInfoSize)
		le := binary.NativeEndian
		le.PutUint32(buf[4:], tcpInfoSize)
		le.PutUint32(buf[12:], sfInfoSize)
		le.PutUint32(buf[20:], uint32(n))
		var pin runtime.Pinner
		pin.Pin(&sf[0])
		pin.Pin(&tcp[0])
		le.PutUint64(buf[24:], uint64(uintptr(unsafe.Pointer(&sf[0]))))
		le.PutUint64(buf[32:], uint64(uintptr(unsafe.Pointer(&tcp[0]))))
		_, err := getsockopt(c, unix.SOL_MPTCP, optFullInfo, buf)
		pin.Unpin()
		if err != nil {
			return Conn{}, checkMPTCP(c, "MPTCP_FULL_INFO", err)
		}
		num := int(le.Uint32(buf[16:]))
		if num > n {
			n = num + 4
			continue
		}
		return decodeFull(buf, sf, tcp, num)
	}
	return Conn{}, errors.New("info: MPTCP_FULL_INFO: the number of subflows keeps growing")
}

// decodeFull reads a struct mptcp_full_info and the arrays it pointed to.
func decodeFull(buf, sf, tcp []byte, num int) (Conn, error) {
	le := binary.NativeEndian
	tsize, ssize := int(le.Uint32(buf[0:])), int(le.Uint32(buf[8:]))
	tsize, ssize = min(tsize, tcpInfoSize), min(ssize, sfInfoSize)
	if num*sfInfoSize > len(sf) || num*tcpInfoSize > len(tcp) || ssize < 8+addrsSize && num > 0 {
		return Conn{}, fmt.Errorf("%w: full info with %d subflows of %d bytes", ErrMalformed, num, ssize)
	}
	c := Conn{Info: DecodeConnInfo(buf[40:fullInfoSize])}
	for i := range num {
		// The kernel lays the arrays out with the user's element sizes.
		s := sf[i*sfInfoSize : (i+1)*sfInfoSize]
		pair, err := decodeAddrPair(s[8:])
		if err != nil {
			return Conn{}, err
		}
		c.Subflows = append(c.Subflows, Subflow{ID: le.Uint32(s), Local: pair.Local, Remote: pair.Remote,
			TCP: DecodeTCPInfo(tcp[i*tcpInfoSize : i*tcpInfoSize+tsize])})
	}
	if len(c.Subflows) > 0 {
		c.Local, c.Remote = c.Subflows[0].Local, c.Subflows[0].Remote
	}
	return c, nil
}
