//go:build !linux || 386

package traffic

import "net"

// tcpRetransmits is unknown (0) where this package does not read TCP_INFO.
func tcpRetransmits(net.Conn) int64 { return 0 }
