package app

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"braid/internal/mptcp/pm"
)

// printPMStatus prints a path manager's status: its connections' subflows and, under the rbpm
// policy, which subflows are demoted to backup and why.
func printPMStatus(e env, body []byte, asJSON bool) int {
	var doc struct {
		Role string     `json:"role"`
		PM   *pm.Status `json:"pm"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.PM == nil {
		fmt.Fprintf(e.stderr, "braid status: not a path-manager status document: %v\n", err)
		return exitError
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(doc)
		return exitOK
	}
	st := doc.PM
	fmt.Fprintf(e.stdout, "path manager, policy %s, %d uplinks, %d connections\n", st.Policy, len(st.Uplinks), len(st.Connections))
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tID\tLOCAL\tREMOTE\tSTATE\tBACKUP")
	for _, c := range st.Connections {
		for _, s := range c.Subflows {
			fmt.Fprintf(tw, "%08x\t%d\t%s\t%s\t%s\t%v\n", c.Token, s.ID, s.Local, s.Remote, s.State, s.Backup)
		}
	}
	tw.Flush()
	if r := st.RBPM; r != nil {
		fmt.Fprintf(e.stdout, "\nrbpm: %d demotions, %d restores\n", r.Decisions.Demotions, r.Decisions.Restores)
		// The available buffer is the smaller of the peer's window and the send buffer.
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOKEN\tPEER WINDOW\tSEND BUFFER")
		for _, c := range r.Connections {
			sndbuf := "unknown"
			if c.SendBuffer > 0 {
				sndbuf = fmt.Sprintf("%d B", c.SendBuffer)
			}
			fmt.Fprintf(tw, "%08x\t%d B\t%s\n", c.Token, c.Window, sndbuf)
		}
		tw.Flush()
		fmt.Fprintln(e.stdout)
		tw = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOKEN\tLOCAL\tREMOTE\tRBPM\tWHY\tSCORE\tREQUIRED\tAVAILABLE")
		for _, c := range r.Connections {
			for _, s := range c.Subflows {
				state := "active"
				if !s.Active {
					state = "demoted"
				}
				fmt.Fprintf(tw, "%08x\t%s\t%s\t%s\t%s\t%.2f\t%d B\t%d B\n", c.Token, s.Local, s.Remote, state, s.Reason, s.Score, s.Required, s.Avail)
			}
		}
		tw.Flush()
	}
	return exitOK
}
