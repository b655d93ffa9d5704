package lab

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// The labs of this process, so that a signal removes them all.
var (
	liveMu      sync.Mutex
	live        = map[*Lab]bool{}
	handlerOnce sync.Once
)

func register(l *Lab, handleSignals bool) {
	liveMu.Lock()
	live[l] = true
	liveMu.Unlock()
	if handleSignals {
		handlerOnce.Do(startSignalHandler)
	}
}

func unregister(l *Lab) {
	liveMu.Lock()
	delete(live, l)
	liveMu.Unlock()
}

// startSignalHandler removes every lab of this process on SIGINT, SIGTERM or SIGHUP, then lets
// the signal take its default course, so an interrupted test run leaves no namespace behind and
// still ends as interrupted.
func startSignalHandler() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		sig := <-ch
		CloseAll()
		signal.Reset(sig)
		syscall.Kill(os.Getpid(), sig.(syscall.Signal))
	}()
}

// CloseAll closes every lab of this process.
func CloseAll() {
	liveMu.Lock()
	labs := make([]*Lab, 0, len(live))
	for l := range live {
		labs = append(labs, l)
	}
	liveMu.Unlock()
	var wg sync.WaitGroup
	for _, l := range labs {
		wg.Go(func() { l.Close() })
	}
	wg.Wait()
}
