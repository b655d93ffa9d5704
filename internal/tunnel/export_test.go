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
