package kit

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	"braid/internal/lab/topo"
)

// TracesDir finds the directory of the shipped traces (lab/traces of the repository): $BRAID_TRACES
// if set, else lab/traces in the current directory or one of its parents, else beside the
// running executable (bin/braid finds ../lab/traces).
func TracesDir() (string, error) {
	if d := os.Getenv("BRAID_TRACES"); d != "" {
		return d, nil
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, dir := range starts {
		for {
			cand := filepath.Join(dir, "lab", "traces")
			if fi, err := os.Stat(filepath.Join(cand, "README.md")); err == nil && fi.Mode().IsRegular() {
				return cand, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", errors.New("scenario: lab/traces not found in the current directory, its parents or beside the executable; set BRAID_TRACES to the traces' directory")
}

// LoadTrace loads a trace: name is a path, or the base name of a file of TracesDir such as
// "TMobile-LTE-short.down".
func LoadTrace(name string) (*topo.Trace, error) {
	if filepath.Base(name) == name {
		if _, err := os.Stat(name); err != nil {
			dir, err := TracesDir()
			if err != nil {
				return nil, err
			}
			name = filepath.Join(dir, name)
		}
	}
	return topo.LoadTrace(name)
}

// TraceShape is a link direction that replays the trace name (see LoadTrace) from offset into
// it, with the given one-way delay; set other fields (loss, queue) on the result.
func TraceShape(name string, offset, delay time.Duration) (topo.Shape, error) {
	tr, err := LoadTrace(name)
	if err != nil {
		return topo.Shape{}, err
	}
	return topo.Shape{Trace: tr.WithOffset(offset), Delay: delay}, nil
}
