package lab_test

import (
	"context"
	"io"
	"testing"
	"time"

	"braid/internal/lab/labtest"
	"braid/internal/lab/topo"
)

func TestSmokeEcho(t *testing.T) {
	l := labtest.Up(t, labtest.Pair(topo.Shape{Delay: 10 * time.Millisecond, Rate: 50e6}))
	ln, err := l.Host("b").Listen("tcp", "10.99.0.2:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := l.Host("a").Dial(ctx, "tcp", "10.99.0.2:7000")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("handshake %v", time.Since(start))
	defer c.Close()
	buf := make([]byte, 5)
	for range 5 {
		s := time.Now()
		c.Write([]byte("hello"))
		io.ReadFull(c, buf)
		t.Logf("rtt %v %q", time.Since(s), buf)
	}
}
