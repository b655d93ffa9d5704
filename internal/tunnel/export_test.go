package tunnel

import "time"

// SetRekeyTimers makes sessions rekey after rekey and keep the previous one for keep (as 2
// minutes and 10 s do, keep must stay well below rekey), for the tests of rekeying; it returns
// the function that restores the defaults. Call it before tunnels start and restore after
// they stop.
func SetRekeyTimers(rekey, keep time.Duration) (restore func()) {
	oldRekey, oldKeep := rekeyAfter, keepPrevious
	rekeyAfter, keepPrevious = rekey, keep
	return func() { rekeyAfter, keepPrevious = oldRekey, oldKeep }
}

// SetReuseAfter sets how long a learned path must be silent before a new path may take its
// place at max_paths; it returns the function that restores the default.
func SetReuseAfter(d time.Duration) (restore func()) {
	old := reuseAfter
	reuseAfter = d
	return func() { reuseAfter = old }
}
