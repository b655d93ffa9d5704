//go:build linux && !386

package traffic

import (
	"net"
	"syscall"
	"unsafe"
)

// tcpRetransmits returns the total_retrans counter of TCP_INFO for c, or 0 when c is not a TCP
// socket or the kernel does not say.
func tcpRetransmits(c net.Conn) int64 {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	var info syscall.TCPInfo
	var errno syscall.Errno
	err = raw.Control(func(fd uintptr) {
		size := uint32(syscall.SizeofTCPInfo)
		_, _, errno = syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
	})
	if err != nil || errno != 0 {
		return 0
	}
	return int64(info.Total_retrans)
}
