package sched

import (
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

func picks(t *testing.T, s Scheduler, paths []Path, n int) string {
	t.Helper()
	b := make([]byte, 0, n)
	for range n {
		i, ok := s.Pick(0, paths, 1500)
		if !ok {
			t.Fatal("Pick: ok = false")
		}
		b = append(b, byte('A'+i))
	}
	return string(b)
}

func TestWRRSequences(t *testing.T) {
	tests := []struct {
		weights []float64
		want    string
	}{
		{[]float64{3, 1}, "AABAAABAAABA"},
		{[]float64{1, 1, 1}, "ABCABCABC"},
		{[]float64{5, 1, 1}, "AABACAAAABACAA"}, // nginx's documented order
		{[]float64{0, 0}, "ABAB"},              // no weight, no capacity: equal
	}
	for _, tc := range tests {
		paths := make([]Path, len(tc.weights))
		for i, w := range tc.weights {
			paths[i] = Path{ID: i + 10, Up: true, Weight: w}
		}
		if got := picks(t, &WRR{}, paths, len(tc.want)); got != tc.want {
			t.Errorf("weights %v: %s, want %s", tc.weights, got, tc.want)
		}
	}
}

func TestWRRCapacityAsWeight(t *testing.T) {
	paths := []Path{{ID: 1, Up: true, Capacity: 300e6}, {ID: 2, Up: true, Capacity: 100e6}}
	if got := picks(t, &WRR{}, paths, 8); got != "AABAAABA" {
		t.Fatalf("%s", got)
	}
}

func TestWRRSkipsDownPathsAndRecomputes(t *testing.T) {
	paths := []Path{{ID: 1, Up: true, Weight: 1}, {ID: 2, Up: true, Weight: 1}, {ID: 3, Up: true, Weight: 1}}
	s := &WRR{}
	if got := picks(t, s, paths, 4); got != "ABCA" {
		t.Fatalf("%s", got)
	}
	paths[1].Up = false
	if got := picks(t, s, paths, 4); got != "ACAC" {
		t.Fatalf("B down: %s", got)
	}
	paths[1].Up = true
	paths[2].Weight = 2
	if got := picks(t, s, paths, 8); got != "CABCCABC" {
		t.Fatalf("B up, C weight 2: %s", got)
	}
	for i := range paths {
		paths[i].Up = false
	}
	if _, ok := s.Pick(0, paths, 1500); ok {
		t.Fatal("all down: ok = true")
	}
	if _, ok := s.Pick(0, nil, 1500); ok {
		t.Fatal("no paths: ok = true")
	}
}

func TestMinRTT(t *testing.T) {
	d := time.Millisecond
	paths := []Path{
		{ID: 1, Up: true, Capacity: 100e6, SRTT: 30 * d},
		{ID: 2, Up: true, Capacity: 100e6, SRTT: 10 * d},
		{ID: 3, Up: false, Capacity: 100e6, SRTT: 1 * d},
	}
	var s MinRTT
	if i, ok := s.Pick(0, paths, 1500); !ok || i != 1 {
		t.Fatalf("Pick = %d, %v; want 1 (lowest SRTT that is up)", i, ok)
	}
	// Path 1's limit: 1.2 × 100 Mbit/s × 10 ms / 8 = 150 000 bytes.
	paths[1].InFlight = 150_000
	if i, ok := s.Pick(0, paths, 1500); !ok || i != 0 {
		t.Fatalf("fast path full: Pick = %d, %v; want 0", i, ok)
	}
	paths[0].InFlight = 450_000
	if _, ok := s.Pick(0, paths, 1500); ok {
		t.Fatal("every path full: ok = true")
	}
	// Unknown capacity: no limit. Unknown RTT: first, up to MinWindow.
	paths[0].Capacity = 0
	if i, ok := s.Pick(0, paths, 1500); !ok || i != 0 {
		t.Fatalf("unknown capacity: Pick = %d, %v; want 0", i, ok)
	}
	paths = append(paths, Path{ID: 4, Up: true, InFlight: 1000})
	if i, _ := s.Pick(0, paths, 1500); i != 3 {
		t.Fatalf("unmeasured path: Pick = %d, want 3", i)
	}
	paths[3].InFlight = 64 << 10
	if i, _ := s.Pick(0, paths, 1500); i != 0 {
		t.Fatalf("unmeasured path over MinWindow: Pick = %d, want 0", i)
	}
}

func newPaced(t testing.TB) *Paced {
	t.Helper()
	s, err := NewPaced(PacedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// saturate plays a sender that always has data for dur: it sends whenever Next allows and
// otherwise sleeps until the time Next names. It checks that no path ever got more than one
// burst above its rate, and returns the bytes per path.
func saturate(t *testing.T, s *Paced, paths []Path, from, dur int64, change func(now int64)) []float64 {
	t.Helper()
	const size = 1500
	sent := make([]float64, len(paths))
	now := from
	for now < from+dur {
		if change != nil {
			change(now)
		}
		i, at, ok := s.Next(now, paths, size)
		if !ok {
			t.Fatal("Next: ok = false")
		}
		if at > now {
			if at-now > 10*ms {
				t.Fatalf("Next waits %v", time.Duration(at-now))
			}
			now = at
			continue
		}
		if !paths[i].Up {
			t.Fatalf("sent on path %d, which is down", paths[i].ID)
		}
		sent[i] += size
		st := s.st[i]
		if limit := st.burst + st.rate*float64(now-from); sent[i] > limit+1e-6 {
			t.Fatalf("path %d: %.0f bytes by %v, over its rate by more than a burst (limit %.0f)", paths[i].ID, sent[i], time.Duration(now-from), limit)
		}
	}
	return sent
}

func TestPacedAggregatesInProportion(t *testing.T) {
	paths := []Path{{ID: 1, Up: true, Capacity: 300e6}, {ID: 2, Up: true, Capacity: 100e6}}
	s := newPaced(t)
	sent := saturate(t, s, paths, 5*ms, 1e9, nil)
	ratio := sent[0] / sent[1]
	t.Logf("1 s saturated: %.0f + %.0f bytes, ratio %.4f", sent[0], sent[1], ratio)
	if ratio < 3*0.98 || ratio > 3*1.02 {
		t.Fatalf("bytes %.0f : %.0f, ratio %.3f, want 3 ± 2%%", sent[0], sent[1], ratio)
	}
	// Each path carries its capacity: 37.5 MB and 12.5 MB in a second, plus the first burst.
	for i, want := range []float64{37.5e6, 12.5e6} {
		if sent[i] < want*0.99 || sent[i] > want+s.st[i].burst {
			t.Errorf("path %d: %.0f bytes in 1 s, want %.0f", paths[i].ID, sent[i], want)
		}
	}
}

func TestPacedSplitsByShareBelowCapacity(t *testing.T) {
	// 100 Mbit/s offered over 300 + 100: buckets never run dry, the deficits split 3:1.
	paths := []Path{{ID: 1, Up: true, Capacity: 300e6}, {ID: 2, Up: true, Capacity: 100e6}}
	s := newPaced(t)
	var sent [2]int
	for k := range int64(10000) {
		i, ok := s.Pick(k*120_000, paths, 1500) // 1500 B every 120 µs
		if !ok {
			t.Fatal("Pick: ok = false below capacity")
		}
		sent[i]++
	}
	if sent[0] != 7500 || sent[1] != 2500 {
		t.Fatalf("packets %v, want [7500 2500]", sent)
	}
	// Configured weights override capacity for the split.
	paths[0].Weight, paths[1].Weight = 1, 1
	sent = [2]int{}
	for k := range int64(1000) {
		i, _ := s.Pick(2e9+k*120_000, paths, 1500)
		sent[i]++
	}
	if sent[0] != 500 || sent[1] != 500 {
		t.Fatalf("weights 1:1: packets %v, want [500 500]", sent)
	}
}

func TestPacedPathDownMidRun(t *testing.T) {
	paths := []Path{{ID: 1, Up: true, Capacity: 300e6}, {ID: 2, Up: true, Capacity: 100e6}}
	s := newPaced(t)
	var downAt int64 = 500 * ms
	var sentAfter [2]float64
	var now int64
	for now < 1e9 {
		if now >= downAt {
			paths[1].Up = false
		}
		i, at, ok := s.Next(now, paths, 1500)
		if !ok {
			t.Fatal("ok = false with one path up")
		}
		if at > now {
			now = at
			continue
		}
		if now >= downAt {
			sentAfter[i] += 1500
		}
	}
	if sentAfter[1] != 0 {
		t.Fatalf("path 2 got %.0f bytes after going down", sentAfter[1])
	}
	if want := 37.5e6 / 2; sentAfter[0] < want*0.99 || sentAfter[0] > want*1.01+float64(s.st[0].burst) {
		t.Fatalf("path 1 carried %.0f bytes in the last 500 ms, want %.0f", sentAfter[0], want)
	}
	paths[0].Up = false
	if _, _, ok := s.Next(now, paths, 1500); ok {
		t.Fatal("all down: Next ok = true")
	}
	if _, ok := s.Pick(now, paths, 1500); ok {
		t.Fatal("all down: Pick ok = true")
	}
}

func TestPacedUnknownCapacityUsesDefault(t *testing.T) {
	s, err := NewPaced(PacedConfig{DefaultCapacity: 8e6}) // 1 byte per µs
	if err != nil {
		t.Fatal(err)
	}
	paths := []Path{{ID: 7, Up: true}}
	// Full bucket: 64 KiB go at once, then one packet per 1.5 ms.
	var now int64
	n := 0
	for {
		_, at, _ := s.Next(now, paths, 1500)
		if at > now {
			if want := int64(1500*1000 - (65536-43*1500)*1000); at != want {
				t.Fatalf("after %d packets: next at %d, want %d", n, at, want)
			}
			break
		}
		n++
	}
	if n != 43 {
		t.Fatalf("%d packets in the first burst, want 43 (64 KiB / 1500)", n)
	}
	if _, err := NewPaced(PacedConfig{DefaultCapacity: -1}); err == nil {
		t.Fatal("negative DefaultCapacity accepted")
	}
}

func TestPacedPathsReordered(t *testing.T) {
	s := newPaced(t)
	paths := []Path{{ID: 1, Up: true, Capacity: 8e6}, {ID: 2, Up: true, Capacity: 8e6}}
	for range 100 { // drain both buckets
		s.Next(0, paths, 1500)
	}
	swapped := []Path{paths[1], paths[0]}
	_, at, _ := s.Next(0, swapped, 1500)
	if at == 0 {
		t.Fatal("buckets were lost when the paths were listed in another order")
	}
}

func TestNoAllocs(t *testing.T) {
	paths := []Path{
		{ID: 1, Up: true, Capacity: 300e6, SRTT: 20 * time.Millisecond},
		{ID: 2, Up: true, Capacity: 100e6, SRTT: 40 * time.Millisecond},
		{ID: 3, Up: true, Weight: 2},
	}
	p := newPaced(t)
	w := &WRR{}
	m := &MinRTT{}
	var now int64
	w.Pick(now, paths, 1500)
	p.Next(now, paths, 1500)
	for name, f := range map[string]func(){
		"WRR.Pick":    func() { w.Pick(now, paths, 1500) },
		"Paced.Next":  func() { now += 10_000; p.Next(now, paths, 1500) },
		"Paced.Pick":  func() { now += 10_000; p.Pick(now, paths, 1500) },
		"MinRTT.Pick": func() { m.Pick(now, paths, 1500) },
	} {
		if a := testing.AllocsPerRun(1000, f); a != 0 {
			t.Errorf("%s: %v allocs, want 0", name, a)
		}
	}
}

func benchPaths() []Path {
	return []Path{
		{ID: 1, Up: true, Capacity: 300e6, SRTT: 20 * time.Millisecond},
		{ID: 2, Up: true, Capacity: 100e6, SRTT: 40 * time.Millisecond},
		{ID: 3, Up: true, Capacity: 50e6, SRTT: 60 * time.Millisecond},
	}
}

func BenchmarkWRR(b *testing.B) {
	paths := benchPaths()
	s := &WRR{}
	b.ReportAllocs()
	for b.Loop() {
		s.Pick(0, paths, 1500)
	}
}

func BenchmarkPacedNext(b *testing.B) {
	paths := benchPaths()
	s := newPaced(b)
	b.ReportAllocs()
	var now int64
	for b.Loop() {
		if _, at, _ := s.Next(now, paths, 1500); at > now {
			now = at
		}
	}
}

func BenchmarkMinRTT(b *testing.B) {
	paths := benchPaths()
	s := &MinRTT{}
	b.ReportAllocs()
	for b.Loop() {
		s.Pick(0, paths, 1500)
	}
}

// BenchmarkRBPMPickConn: one pick of the rbpm scheduler over scenario 1's four paths with a
// bounded receiver, 10 µs apart (100 000 packets a second): Decide runs on every pick.
func BenchmarkRBPMPickConn(b *testing.B) {
	ms := time.Millisecond
	paths := []Path{
		{ID: 1, Up: true, SRTT: 22 * ms, MinRTT: 20 * ms, DeliveryRate: 5e6, InFlight: 20000, CWnd: 40000, MSS: 1400},
		{ID: 2, Up: true, SRTT: 22 * ms, MinRTT: 20 * ms, DeliveryRate: 5e6, InFlight: 20000, CWnd: 40000, MSS: 1400},
		{ID: 3, Up: true, SRTT: 22 * ms, MinRTT: 20 * ms, DeliveryRate: 5e6, InFlight: 20000, CWnd: 40000, MSS: 1400},
		{ID: 4, Up: true, SRTT: 210 * ms, MinRTT: 200 * ms, DeliveryRate: 1e6, InFlight: 20000, CWnd: 40000, MSS: 1400},
	}
	s := NewRBPM(RBPMConfig{})
	c := Conn{Avail: 200_000, AvailKnown: true}
	b.ReportAllocs()
	var now int64
	for b.Loop() {
		now += 10_000
		s.PickConn(now, c, paths, 1400)
	}
}
