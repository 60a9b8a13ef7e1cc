package hotswap

import (
	"fmt"
	"testing"
)

// TestMoveLosesLeavesState: moveLoses works out a host's loss on a copy
// of the loss bookkeeping; the machine's own state (liveness, own slots,
// copies, shares, logs, placement, the count of owners under-protected)
// is the same after it as before, whatever it finds, under replicas and
// under erasure coding (full and diff mode).
func TestMoveLosesLeavesState(t *testing.T) {
	tests := []struct {
		name   string
		script []string
		host   int
		with   int
		lose   bool // moveLoses finds a loss
	}{
		{"replicas, earlier loss restoring from the host", []string{
			"config hosts=h0:2,h1:2,h2:2,s0:2,s1:2 spares=s0,s1 world=6 replicas=1",
			"event g g=3 at=1s",
			"event agent-exited host=h0 why=lost at=2s",
		}, 1, 4, true},
		{"replicas, nothing lost", []string{
			"config hosts=h0:2,h1:2,h2:2,s0:2,s1:2 spares=s0,s1 world=6 replicas=1",
			"event g g=3 at=1s",
		}, 1, 3, false},
		{"ec full, parity host others decode from", []string{
			"config hosts=h0:2,h1:2,h2:2,s0:2,s1:2 spares=s0,s1 world=6 ec=2+1",
			"event g g=4 at=1s",
			"event progress rank=all step=4 at=1s",
			"event agent-exited host=h2 why=lost at=2s",
		}, 1, 4, true},
		{"ec diff, data host", []string{
			"config hosts=h0,h1,h2,h3,s0,s1 spares=s0,s1 world=4 ec=2+2 diff",
			"event g g=4 at=1s",
			"event progress rank=all step=4 at=1s",
		}, 0, 4, false},
	}
	snapshot := func(m *Machine) string {
		s := fmt.Sprint(m.alive, m.localOK, m.rankHost, m.copyOK, m.missing, m.under, m.logOK, m.retained, m.hostRanks, m.holders, len(m.out))
		if m.ec != nil {
			s += fmt.Sprint(m.ec.share)
		}
		return s
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &driver{}
			for _, c := range tc.script {
				if out := d.run(c); len(out) > 6 && out[:6] == "error:" || len(out) > 6 && out[:6] == "panic:" {
					t.Fatalf("%s: %s", c, out)
				}
			}
			before := snapshot(d.m)
			got := d.m.moveLoses(tc.host, tc.with)
			if (got != "") != tc.lose {
				t.Errorf("moveLoses(%d, %d) = %q; want a loss: %v", tc.host, tc.with, got, tc.lose)
			}
			if after := snapshot(d.m); after != before {
				t.Errorf("moveLoses changed the machine's state:\nbefore %s\nafter  %s", before, after)
			}
			if again := d.m.moveLoses(tc.host, tc.with); again != got {
				t.Errorf("moveLoses again = %q, first %q", again, got)
			}
		})
	}
}
