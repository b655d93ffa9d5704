// Package units parses and formats the quantities of network configuration (rates, delays,
// loss, sizes) the same way everywhere: in files and on the command line.
package units

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// The parsers below are shared by the TOML reader and the command line, so that
// "rate = \"50mbit\"" in a file and "--rate 50mbit" on the command line mean the same thing.
// Numbers are decimal with an optional fraction ("1.5"); exponents, hexadecimal, underscores,
// NaN and infinities are rejected. Units are case-insensitive (except in Go durations), and
// a space between number and unit is allowed.

// ParseRate parses a rate in bits per second. It accepts "0" and "unlimited" (both 0, which
// means unlimited), a plain number of bit/s, or a number with one of the SI units bit, kbit,
// mbit, gbit (powers of 1000). The spellings bps, kbps, mbps, gbps are synonyms that also
// count bits, not bytes. A "/s" after a bit unit is accepted, so FormatRate's output parses
// back. Fractions are allowed ("1.5mbit"); the result is truncated to whole bits, and a
// non-zero rate below 1 bit/s is an error rather than silently meaning unlimited.
func ParseRate(s string) (uint64, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	if v == "unlimited" {
		return 0, nil
	}
	num, unit := splitNumber(v)
	unit = strings.TrimSpace(unit)
	if strings.HasSuffix(unit, "bit/s") {
		unit = strings.TrimSuffix(unit, "/s")
	}
	mult := rateUnit(unit)
	if mult == 0 {
		return 0, fmt.Errorf("invalid rate %q: unknown unit %q (want bit, kbit, mbit or gbit)", s, unit)
	}
	r, err := parseDecimal(num)
	if err != nil {
		return 0, fmt.Errorf("invalid rate %q: %v", s, err)
	}
	if r.Sign() < 0 {
		return 0, fmt.Errorf("negative rate %q", s)
	}
	n, err := scaleToUint(r, mult, math.MaxUint64)
	if err != nil {
		return 0, fmt.Errorf("invalid rate %q: %v", s, err)
	}
	return n, nil
}

// FormatRate formats a rate in bit/s for humans: "unlimited", "500 bit/s", "50 Mbit/s",
// "1.5 Gbit/s". Values are rounded to three decimals in the largest unit that keeps them at
// least 1.
func FormatRate(bps uint64) string {
	if bps == 0 {
		return "unlimited"
	}
	units := []struct {
		div  float64
		name string
	}{{1e9, "Gbit/s"}, {1e6, "Mbit/s"}, {1e3, "kbit/s"}}
	for _, u := range units {
		if x := math.Round(float64(bps)/u.div*1000) / 1000; x >= 1 {
			return strconv.FormatFloat(x, 'f', -1, 64) + " " + u.name
		}
	}
	return strconv.FormatUint(bps, 10) + " bit/s"
}

// ParseDelay parses a one-way delay: Go duration syntax ("10ms", "1.5ms", "1m30s", "0"), or
// a bare number, which means milliseconds ("10", "0.25").
func ParseDelay(s string) (time.Duration, error) {
	return ParseDuration("delay", s)
}

// ParseDuration is ParseDelay with the name of the quantity in its errors, so that a bad
// jitter is not reported as a bad delay.
func ParseDuration(what, s string) (time.Duration, error) {
	v := strings.TrimSpace(s)
	if r, err := parseDecimal(v); err == nil {
		if r.Sign() < 0 {
			return 0, fmt.Errorf("negative %s %q", what, s)
		}
		n, err := scaleToUint(r, uint64(time.Millisecond), math.MaxInt64)
		if err != nil {
			return 0, fmt.Errorf("invalid %s %q: %v", what, s, err)
		}
		return time.Duration(n), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("invalid %s %q: want a duration such as 10ms", what, s)
	}
	if d < 0 {
		return 0, fmt.Errorf("negative %s %q", what, s)
	}
	return d, nil
}

// ParseLoss parses a random loss rate in percent: "1%", "0.5%", or a bare number, which also
// means percent ("1" is 1 %). The value must be between 0 and 100 inclusive.
func ParseLoss(s string) (float64, error) {
	v := strings.TrimSpace(s)
	v = strings.TrimSpace(strings.TrimSuffix(v, "%"))
	r, err := parseDecimal(v)
	if err != nil {
		return 0, fmt.Errorf("invalid loss %q: %v", s, err)
	}
	if r.Sign() < 0 {
		return 0, fmt.Errorf("negative loss %q", s)
	}
	if r.Cmp(big.NewRat(100, 1)) > 0 {
		return 0, fmt.Errorf("loss over 100 %% %q", s)
	}
	f, _ := r.Float64()
	return f, nil
}

// ParseSize parses a size in bytes: a plain number, or a number with the SI units b, kb, mb,
// gb (powers of 1000) or the binary units KiB, MiB, GiB (powers of 1024), e.g. "64000",
// "64kb", "64KiB", "1.5mb", "1MiB". Fractions are truncated to whole bytes; a non-zero size
// below one byte is an error, since 0 means "default" to the emulator.
func ParseSize(s string) (int, error) {
	num, unit := splitNumber(strings.ToLower(strings.TrimSpace(s)))
	unit = strings.TrimSpace(unit)
	mult := sizeUnit(unit)
	if mult == 0 {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (want b, kb, mb, gb, KiB, MiB or GiB)", s, unit)
	}
	r, err := parseDecimal(num)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %v", s, err)
	}
	if r.Sign() < 0 {
		return 0, fmt.Errorf("negative size %q", s)
	}
	n, err := scaleToUint(r, mult, math.MaxInt)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %v", s, err)
	}
	return int(n), nil
}

// rateUnit returns the multiplier of a lower-case rate unit, or 0 if it is unknown. "bps" and
// its multiples count bits here, as in tc(8), not bytes: a lab rate is always a line rate.
func rateUnit(u string) uint64 {
	switch u {
	case "", "bit", "bps":
		return 1
	case "kbit", "kbps":
		return 1e3
	case "mbit", "mbps":
		return 1e6
	case "gbit", "gbps":
		return 1e9
	}
	return 0
}

// sizeUnit returns the multiplier of a lower-case size unit, or 0 if it is unknown.
func sizeUnit(u string) uint64 {
	switch u {
	case "", "b":
		return 1
	case "kb":
		return 1e3
	case "mb":
		return 1e6
	case "gb":
		return 1e9
	case "kib":
		return 1 << 10
	case "mib":
		return 1 << 20
	case "gib":
		return 1 << 30
	}
	return 0
}

// splitNumber splits s after its leading sign, digits and dots.
func splitNumber(s string) (num, unit string) {
	i := 0
	for i < len(s) && (s[i] == '-' || s[i] == '+' || s[i] == '.' || s[i] >= '0' && s[i] <= '9') {
		i++
	}
	return s[:i], s[i:]
}

// parseDecimal parses an optionally signed decimal number with an optional fraction exactly.
// It checks the syntax itself because big.Rat.SetString and strconv.ParseFloat also accept
// exponents, fractions like "1/2", hexadecimal, "NaN" and "Inf", none of which belong in a
// lab file.
func parseDecimal(s string) (*big.Rat, error) {
	digits := strings.TrimLeft(s, "+-")
	if len(s)-len(digits) > 1 {
		return nil, fmt.Errorf("not a number")
	}
	seenDigit, seenDot := false, false
	for _, c := range digits {
		switch {
		case c >= '0' && c <= '9':
			seenDigit = true
		case c == '.' && !seenDot:
			seenDot = true
		default:
			return nil, fmt.Errorf("not a number")
		}
	}
	if !seenDigit {
		if s == "" {
			return nil, fmt.Errorf("empty value")
		}
		return nil, fmt.Errorf("not a number")
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, fmt.Errorf("not a number")
	}
	return r, nil
}

// scaleToUint returns r*mult truncated to an integer, which must be at most max. A non-zero r
// that truncates to 0 is an error because 0 has a special meaning for every quantity here
// (unlimited rate, no delay, default queue).
func scaleToUint(r *big.Rat, mult, max uint64) (uint64, error) {
	x := new(big.Rat).Mul(r, new(big.Rat).SetUint64(mult))
	n := new(big.Int).Quo(x.Num(), x.Denom())
	if n.Sign() == 0 && x.Sign() != 0 {
		return 0, fmt.Errorf("too small")
	}
	if !n.IsUint64() || n.Uint64() > max {
		return 0, fmt.Errorf("too large")
	}
	return n.Uint64(), nil
}
