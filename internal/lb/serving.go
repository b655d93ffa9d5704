package lb

// Serving reports whether the balancer can take new connections: at least one backend is up
// and not drained. An instance of a fleet announces its VIPs only while it is serving, so that
// upstream routers send nothing to an instance with nowhere to send it.
func (l *LB) Serving() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.backends {
		if b.up && b.spec.Weight > 0 {
			return true
		}
	}
	return false
}
