package topo

import (
	"strings"
	"testing"
)

func TestParseOffload(t *testing.T) {
	tests := []struct {
		in      string
		want    Offload
		wantErr string
	}{
		{"", OffloadAuto, ""},
		{"auto", OffloadAuto, ""},
		{"on", OffloadOn, ""},
		{"OFF", OffloadOff, ""},
		{"yes", OffloadAuto, `invalid offload "yes"`},
	}
	for _, tt := range tests {
		got, err := ParseOffload(tt.in)
		switch {
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("ParseOffload(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ParseOffload(%q): error %v, want %q", tt.in, err, tt.wantErr)
		}
		if err == nil && tt.in != "" && got.String() != strings.ToLower(tt.in) {
			t.Errorf("ParseOffload(%q).String() = %q", tt.in, got)
		}
	}
}
