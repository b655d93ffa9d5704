package sched

// ECF is the earliest-completion-first scheduler (Lim et al., CoNEXT 2017): when the MinRTT
// choice s is not the fastest path f, it compares finishing the queued data on f alone with
// using s, and waits for f when f alone would finish first and s would finish later. With
// k = Conn.Queued, windows cw in bytes, x_f = max(k, cw_f), x_s = max(k, cw_s),
// δ = max(rttvar_f, rttvar_s), β = 1/4 and the waiting bit w:
//
//	if srtt_f·(x_f + cw_f) < (1 + β·w)·cw_f·(srtt_s + δ):
//	    if srtt_s·x_s ≥ cw_s·(2·srtt_f + δ): w = 1, wait
//	    else: send on s
//	else: w = 0, send on s
//
// Windows come from CWnd, else as in MinRTT. Pick assumes k = 0.
type ECF struct {
	MinWindow int // as MinRTT's
	waiting   bool
}

// Pick implements Scheduler with nothing queued beyond this packet.
func (e *ECF) Pick(now int64, paths []Path, size int) (int, bool) {
	return e.PickConn(now, Conn{}, paths, size)
}

// PickConn implements ConnScheduler.
func (e *ECF) PickConn(now int64, c Conn, paths []Path, size int) (int, bool) {
	s := minRTTPick(paths, e.MinWindow, nil)
	if s < 0 {
		return 0, false
	}
	f := fastest(paths)
	if f < 0 || f == s || paths[s].SRTT <= 0 {
		return s, true
	}
	ps, pf := &paths[s], &paths[f]
	mw := minWindow(e.MinWindow)
	cwF := packetsIn(pf, mw) * float64(pf.mss())
	cwS := packetsIn(ps, mw) * float64(ps.mss())
	k := float64(max(c.Queued, size))
	xf, xs := max(k, cwF), max(k, cwS)
	delta := max(pf.RTTVar, ps.RTTVar).Seconds()
	srttF, srttS := pf.SRTT.Seconds(), ps.SRTT.Seconds()
	w := 0.0
	if e.waiting {
		w = 1
	}
	if srttF*(xf+cwF) < (1+0.25*w)*cwF*(srttS+delta) {
		if srttS*xs >= cwS*(2*srttF+delta) {
			e.waiting = true
			return 0, false
		}
		return s, true
	}
	e.waiting = false
	return s, true
}
