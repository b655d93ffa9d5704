// Command replot redraws bench/amptcp's figures and bench/mplb's time figure from the tables
// the full runs published (bench/amptcp/results.md, bench/mplb/mplb.txt), with the figure code
// the reproductions use, so that the published figures follow that code without a new run.
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
	"strings"

	"braid/internal/experiment/amptcp"
	"braid/internal/experiment/mplb"
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

	// mplb: "   10 kB     0.001 ± 0.000      0.001 ± 0.001  ..."
	b, err := os.ReadFile("bench/mplb/mplb.txt")
	must(err)
	mrow := regexp.MustCompile(`^\s+(\d+) (kB|MB)\s+([\d.]+) ± ([\d.]+)\s+([\d.]+) ± ([\d.]+)`)
	ms := mplb.Summary{Names: []string{"unaware (address hash)", "braid lb"}, Runs: 30, Mean: make([][]float64, 2), Half: make([][]float64, 2)}
	for _, line := range strings.Split(string(b), "\n") {
		m := mrow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		size := num(m[1]) * map[string]float64{"kB": 1e3, "MB": 1e6}[m[2]]
		ms.Sizes = append(ms.Sizes, int64(size))
		ms.Mean[0], ms.Half[0] = append(ms.Mean[0], num(m[3])), append(ms.Half[0], num(m[4]))
		ms.Mean[1], ms.Half[1] = append(ms.Mean[1], num(m[5])), append(ms.Half[1], num(m[6]))
	}
	if len(ms.Sizes) != 5 {
		log.Fatalf("replot: bench/mplb/mplb.txt: %d rows, want 5", len(ms.Sizes))
	}
	must(mplb.WriteFigure("bench/mplb/mplb-time.png", mplb.TimeTitle, mplb.TimeLabel, true, ms))
	fmt.Println("bench/mplb/mplb-time.png")
}
