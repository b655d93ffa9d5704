package app

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"braid/internal/mptcp/pm"
	"braid/internal/mptcp/pm/core"
)

func TestPMStatusTableShowsRBPM(t *testing.T) {
	st := pm.Status{Policy: "rbpm", Connections: []core.ConnStatus{{Token: 0xabc, Subflows: []core.SubflowStatus{
		{ID: 1, Local: "10.9.0.1:40000", Remote: "10.9.0.2:5201", State: "up"}}}},
		RBPM: &pm.RBPMStatus{Decisions: core.RBPMCounters{Demotions: 1}, Connections: []core.RBPMConn{{Token: 0xabc, Window: 1116288, SendBuffer: 925696, Subflows: []core.RBPMSubflow{
			{Local: "10.9.0.1:40000", Remote: "10.9.0.2:5201", Active: true, Reason: "new", Score: 1},
			{Local: "10.9.3.1:45000", Remote: "10.9.0.2:5201", Reason: "would block the receive buffer", Score: -1, Required: 215578, Avail: 64128}}}}}}
	body, _ := json.Marshal(map[string]any{"role": "pm", "pm": st})
	var o, e bytes.Buffer
	if code := printPMStatus(env{stdout: &o, stderr: &e}, body, false); code != 0 {
		t.Fatalf("code %d: %s", code, e.String())
	}
	for _, want := range []string{"policy rbpm", "00000abc", "demoted", "would block the receive buffer", "215578 B", "64128 B", "1 demotions", "1116288 B", "925696 B"} {
		if !strings.Contains(o.String(), want) {
			t.Errorf("missing %q in:\n%s", want, o.String())
		}
	}
	if code := printPMStatus(env{stdout: &o, stderr: &e}, []byte(`{"role":"pm"}`), false); code == 0 {
		t.Error("a document without the pm section was accepted")
	}
}
