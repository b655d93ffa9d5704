package drive

import (
	"fmt"
	"strconv"
	"strings"
)

// Pick returns the items that list names by their 1-based index, comma-separated, in the
// list's order (a driver's flag choosing some of its cases or paths); what names an item in
// the error ("case", "path").
func Pick[T any](items []T, list, what string) ([]T, error) {
	var kept []T
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > len(items) {
			return nil, fmt.Errorf("%q is not a %s number from 1 to %d", f, what, len(items))
		}
		kept = append(kept, items[n-1])
	}
	return kept, nil
}
