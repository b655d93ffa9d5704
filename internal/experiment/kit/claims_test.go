package kit

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// failedNames returns the names of c's failed claims, joined.
func failedNames(c *Claims) string {
	var n []string
	for _, k := range c.Failed() {
		n = append(n, k.Name)
	}
	return strings.Join(n, "; ")
}

func TestClaimsPrintAndErr(t *testing.T) {
	c := &Claims{}
	c.Within("in", 5, 1, 10, "%.0f")
	c.AtLeast("low", 0.5, 1, "%.1f")
	var b bytes.Buffer
	c.Print(&b)
	if !strings.Contains(b.String(), "PASS  in: 5, bound 1 to 10") || !strings.Contains(b.String(), "FAIL  low: 0.5, bound >= 1.0") ||
		!strings.Contains(b.String(), "checks: 1 of 2 FAILED") {
		t.Errorf("printed:\n%s", b.String())
	}
	err := c.Err()
	var f *ClaimsFailed
	if !errors.Is(err, ErrClaims) || !errors.As(errors.Join(errors.New("plot"), err), &f) || len(f.Failed) != 1 || f.Total != 2 {
		t.Errorf("Err: %v", err)
	}
	if (&Claims{}).Err() != nil {
		t.Error("no claims: Err is not nil")
	}
}
