package drive

import (
	"slices"
	"testing"
)

func TestPick(t *testing.T) {
	items := []string{"a", "b", "c"}
	got, err := Pick(items, "3, 1", "path")
	if err != nil || !slices.Equal(got, []string{"c", "a"}) {
		t.Errorf("Pick 3,1 = %v, %v; want [c a]", got, err)
	}
	for _, bad := range []string{"0", "4", "1x", "", "1,,2"} {
		if got, err := Pick(items, bad, "path"); err == nil {
			t.Errorf("Pick %q = %v, want an error", bad, got)
		}
	}
}
