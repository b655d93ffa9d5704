// Command replot redraws bench/amptcp's figures from the table its full run published
// (bench/amptcp/results.md), with the figure code the reproduction uses, so that the published
// figures follow that code without a new run. (bench/mplb's figures come from a full run of
// 2026-11-25 again, bench/mplb/mplb.txt, and are no longer redrawn.)
//
// Usage, from the module root: go run ./bench/replot
package main

import (
	"bufio"
	"fmt"
	"log"
	"os"
	"regexp"
	"strconv"

	"braid/internal/experiment/amptcp"
)

func must(err error) {
	if err != nil {
		log.Fatalf("replot: %v", err)
	}
}

func num(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	must(err)
	return v
}

func main() {
	// amptcp: "  256     0.67 [0.66-0.70]  ..." five configurations.
	f, err := os.Open("bench/amptcp/results.md")
	must(err)
	cell := regexp.MustCompile(`([\d.]+) \[([\d.]+)-([\d.]+)\]`)
	row := regexp.MustCompile(`^\s+(\d+)\s+[\d.]+ \[`)
	s := amptcp.Summary{Names: []string{"TCP", "MPTCP", "A-MPTCP", "A-MPTCP forced 3", "2 by hand, no LISP"}, Reps: 5,
		Med: make([][]float64, 5), Min: make([][]float64, 5), Max: make([][]float64, 5)}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		cs := cell.FindAllStringSubmatch(sc.Text(), -1)
		if len(cs) != 5 {
			log.Fatalf("replot: bench/amptcp/results.md: a row without 5 cells: %q", sc.Text())
		}
		s.SizesMB = append(s.SizesMB, num(m[1])/1024)
		for i, c := range cs {
			s.Med[i], s.Min[i], s.Max[i] = append(s.Med[i], num(c[1])), append(s.Min[i], num(c[2])), append(s.Max[i], num(c[3]))
		}
	}
	f.Close()
	if len(s.SizesMB) != 30 {
		log.Fatalf("replot: bench/amptcp/results.md: %d rows, want 30", len(s.SizesMB))
	}
	paths, err := amptcp.WriteFigures("bench/amptcp", s)
	must(err)
	fmt.Println(paths)

}
