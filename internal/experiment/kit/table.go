package kit

import "fmt"

// Matched names a check's outcome in a table: "matches" or "DIFFERS".
func Matched(ok bool) string {
	if ok {
		return "matches"
	}
	return "DIFFERS"
}

// YesNo is "yes" or "NO" (in capitals, to stand out in a table).
func YesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

// RateText is a rate in bit/s as "12.3 Mbit/s".
func RateText(bps uint64) string { return fmt.Sprintf("%.1f Mbit/s", float64(bps)/1e6) }
