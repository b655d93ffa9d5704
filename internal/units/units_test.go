package units

import (
	"strings"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr string // substring of the error; "" means success
	}{
		{"0", 0, ""},
		{"unlimited", 0, ""},
		{"Unlimited", 0, ""},
		{"1000", 1000, ""},
		{"100bit", 100, ""},
		{"64kbit", 64000, ""},
		{"50mbit", 50_000_000, ""},
		{"50Mbit", 50_000_000, ""},
		{"50 mbit", 50_000_000, ""},
		{"1gbit", 1_000_000_000, ""},
		{"1.5mbit", 1_500_000, ""},
		{"0.5kbit", 500, ""},
		{"10bps", 10, ""},
		{"10kbps", 10_000, ""},
		{"10mbps", 10_000_000, ""},
		{"10GBPS", 10_000_000_000, ""},
		{"50 Mbit/s", 50_000_000, ""}, // FormatRate's output
		{" 2mbit ", 2_000_000, ""},
		{"18446744073709551615", 1<<64 - 1, ""},
		{"", 0, `invalid rate "": empty value`},
		{"-1mbit", 0, `negative rate "-1mbit"`},
		{"18446744073709551616", 0, `invalid rate "18446744073709551616": too large`},
		{"20000000000gbit", 0, "too large"},
		{"50mbyte", 0, `invalid rate "50mbyte": unknown unit "mbyte"`},
		{"fast", 0, `unknown unit "fast"`},
		{"mbit", 0, `invalid rate "mbit": empty value`},
		{"0.1bit", 0, "too small"},
		{"1e6", 0, `unknown unit "e6"`},
		{"1.2.3mbit", 0, "not a number"},
		{"--1", 0, "not a number"},
		{"NaN", 0, "unknown unit"},
	}
	for _, tt := range tests {
		got, err := ParseRate(tt.in)
		checkParse(t, "ParseRate", tt.in, got, err, tt.want, tt.wantErr)
	}
}

func TestFormatRate(t *testing.T) {
	tests := []struct {
		in   uint64
		want string
	}{
		{0, "unlimited"},
		{1, "1 bit/s"},
		{999, "999 bit/s"},
		{1000, "1 kbit/s"},
		{64_000, "64 kbit/s"},
		{1_500_000, "1.5 Mbit/s"},
		{50_000_000, "50 Mbit/s"},
		{999_999_999, "1 Gbit/s"},
		{1_000_000_000, "1 Gbit/s"},
		{1_234_567, "1.235 Mbit/s"},
		{40_000_000_000, "40 Gbit/s"},
	}
	for _, tt := range tests {
		if got := FormatRate(tt.in); got != tt.want {
			t.Errorf("FormatRate(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
	// What FormatRate prints, ParseRate reads back, up to the rounding.
	for _, r := range []uint64{1, 64_000, 50_000_000, 1_500_000, 40_000_000_000} {
		if got, err := ParseRate(FormatRate(r)); err != nil || got != r {
			t.Errorf("ParseRate(FormatRate(%d)) = %d, %v", r, got, err)
		}
	}
}

func TestParseDelay(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr string
	}{
		{"0", 0, ""},
		{"10ms", 10 * time.Millisecond, ""},
		{"1.5ms", 1500 * time.Microsecond, ""},
		{"250us", 250 * time.Microsecond, ""},
		{"1m30s", 90 * time.Second, ""},
		{"10", 10 * time.Millisecond, ""}, // a bare number is milliseconds
		{"0.25", 250 * time.Microsecond, ""},
		{" 5ms ", 5 * time.Millisecond, ""},
		{"-0", 0, ""},
		{"", 0, `invalid delay ""`},
		{"-5ms", 0, `negative delay "-5ms"`},
		{"-5", 0, `negative delay "-5"`},
		{"5 parsecs", 0, `invalid delay "5 parsecs"`},
		{"10MS", 0, `invalid delay "10MS"`},
		{"1e3", 0, `invalid delay "1e3"`},
		{"9999999999999999", 0, "too large"},
		{"0.0000001", 0, "too small"},
	}
	for _, tt := range tests {
		got, err := ParseDelay(tt.in)
		checkParse(t, "ParseDelay", tt.in, got, err, tt.want, tt.wantErr)
	}
}

func TestParseLoss(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr string
	}{
		{"0", 0, ""},
		{"0%", 0, ""},
		{"1%", 1, ""},
		{"0.5%", 0.5, ""},
		{"1", 1, ""}, // a bare number is percent too
		{"100%", 100, ""},
		{"100", 100, ""},
		{"2.5 %", 2.5, ""},
		{"", 0, `invalid loss "": empty value`},
		{"%", 0, `invalid loss "%": empty value`},
		{"100.0001%", 0, `loss over 100 % "100.0001%"`},
		{"150%", 0, `loss over 100 % "150%"`},
		{"-1%", 0, `negative loss "-1%"`},
		{"lots", 0, `invalid loss "lots": not a number`},
		{"1%%", 0, "not a number"},
		{"NaN", 0, "not a number"},
		{"Inf", 0, "not a number"},
	}
	for _, tt := range tests {
		got, err := ParseLoss(tt.in)
		checkParse(t, "ParseLoss", tt.in, got, err, tt.want, tt.wantErr)
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr string
	}{
		{"0", 0, ""},
		{"64000", 64000, ""},
		{"1500b", 1500, ""},
		{"64kb", 64_000, ""},
		{"64KB", 64_000, ""},
		{"150KB", 150_000, ""},
		{"64KiB", 65_536, ""},
		{"64kib", 65_536, ""},
		{"1.5mb", 1_500_000, ""},
		{"1MiB", 1 << 20, ""},
		{"1.5MiB", 3 << 19, ""},
		{"2gb", 2_000_000_000, ""},
		{"1GiB", 1 << 30, ""},
		{"", 0, `invalid size "": empty value`},
		{"-1kb", 0, `negative size "-1kb"`},
		{"64k", 0, `unknown unit "k"`},
		{"64 bytes", 0, `unknown unit "bytes"`},
		{"0.1b", 0, "too small"},
		{"99999999999999999999", 0, "too large"},
		{"1.2.3kb", 0, "not a number"},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		checkParse(t, "ParseSize", tt.in, got, err, tt.want, tt.wantErr)
	}
}

// checkParse checks one result of a parser against a table entry: the value if wantErr is
// empty, else that the error contains wantErr.
func checkParse[T comparable](t *testing.T, fn, in string, got T, err error, want T, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("%s(%q): unexpected error %v", fn, in, err)
	case wantErr == "" && got != want:
		t.Errorf("%s(%q) = %v, want %v", fn, in, got, want)
	case wantErr != "" && err == nil:
		t.Errorf("%s(%q) = %v, want error containing %q", fn, in, got, wantErr)
	case wantErr != "" && !strings.Contains(err.Error(), wantErr):
		t.Errorf("%s(%q): error %q, want it to contain %q", fn, in, err, wantErr)
	}
}
