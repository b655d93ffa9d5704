package lb_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"braid/internal/experiment/mplb"
	"braid/internal/lab"
)

// floodTransferSize is the download that TestLabTokenFlood times before and during the flood:
// about 3 s over the client's two 100 Mbit/s links.
const floodTransferSize = 64 << 20

// timedDownload opens an MPTCP connection to the VIP, downloads size bytes and checks every
// one of them: the backends' servers send byte(offset) at each offset (mplb.MPLBServers).
// It returns the rate in bit/s.
func timedDownload(ctx context.Context, l *lab.Lab, size int) (float64, error) {
	c, err := mplb.MPLBDial(ctx, l)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	start := time.Now()
	req := make([]byte, 9)
	req[0] = 'D'
	binary.BigEndian.PutUint64(req[1:], uint64(size))
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	buf := make([]byte, 256<<10)
	for off := 0; off < size; {
		n, err := c.Read(buf[:min(len(buf), size-off)])
		for i, b := range buf[:n] {
			if b != byte(off+i) {
				return 0, fmt.Errorf("download damaged at byte %d: %#x, want %#x", off+i, b, byte(off+i))
			}
		}
		off += n
		if err != nil {
			if err == io.EOF && off < size {
				err = io.ErrUnexpectedEOF
			}
			if off < size {
				return 0, fmt.Errorf("after %d of %d bytes: %w", off, size, err)
			}
		}
	}
	d := time.Since(start)
	var k [1]byte // the backend's number closes the answer
	if _, err := io.ReadFull(c, k[:]); err != nil {
		return 0, err
	}
	return float64(size) * 8 / d.Seconds(), nil
}

// median is the middle of rates (the mean of the two middle ones when their number is even).
// Not kit.Median: that one takes the upper of the two, which would favour the flooded side,
// whose number of downloads is often even.
func median(rates []float64) float64 {
	s := slices.Clone(rates)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// mbits lists rates in Mbit/s, one decimal, for the log.
func mbits(rates []float64) []string {
	out := make([]string, len(rates))
	for i, r := range rates {
		out[i] = strconv.FormatFloat(r/1e6, 'f', 1, 64)
	}
	return out
}
