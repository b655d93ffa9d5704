package rbpm

import (
	"bytes"
	"image/png"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"

	"braid/internal/experiment/kit"
)

func TestRBPMReport(t *testing.T) {
	dir := t.TempDir()
	rows := []RBPMRow{
		{Scenario: "S1", Config: RBPMKernelDefault, Goodput: 500_000, PerPath: [][]float64{{1e5, 2e5}, {3e4, 1e4}}},
		{Scenario: "S1", Config: RBPMKernelPolicy, Goodput: 750_000, PerPath: [][]float64{{4e5, 5e5}, {0, 0}}, Note: "1 demotions"},
		{Scenario: "S2", Config: "tunnel, rbpm", Goodput: 900_000},
	}
	var out bytes.Buffer
	if err := WriteRBPMReport(&out, kit.Options{Out: dir}, rows); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"1114986", "898705", "275563", "1.50x", "1 demotions", "tunnel, rbpm", "rbpm-S1-2.png"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.png"))
	if len(files) != 2 {
		t.Fatalf("figures %v, want 2 (rows without samples are not drawn)", files)
	}
	f, err := os.Open(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil || img.Bounds().Dx() != int(kit.FigureWidth/vg.Inch*kit.PNGDPI) {
		t.Fatalf("figure: %v, %v", err, img)
	}
}

func TestRBPMAddresses(t *testing.T) {
	for i := range 4 {
		if got := rbpmPathOf(rbpmAddr(i, 1)); got != i {
			t.Errorf("path of %v = %d", rbpmAddr(i, 1), got)
		}
	}
	for _, a := range []string{"10.8.1.1", "fd09::1", "192.0.2.1"} {
		if got := rbpmPathOf(netip.MustParseAddr(a)); got != -1 {
			t.Errorf("path of %s = %d, want -1", a, got)
		}
	}
	if got := rbpmPathOf(netip.MustParseAddr("::ffff:10.9.2.1")); got != 2 {
		t.Errorf("mapped address: %d", got)
	}
	sc := RBPMScenarios()
	if len(sc) != 2 || len(sc[0].Paths) != 4 || sc[0].Paths[sc[0].Slow].Rate != 1e6 || sc[1].Paths[sc[1].Slow].Rate != 1e6 || sc[1].Paths[1].QueuePackets != 100 {
		t.Fatalf("scenarios %+v", sc)
	}
}
