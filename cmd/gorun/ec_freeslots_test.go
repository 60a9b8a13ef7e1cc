package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/testcluster"
	"github.com/gorun/gorun/topology"
)

// TestECFreeSlots loses one of four hosts under --redundancy ec:2+2 with
// no spare (--on-no-spare free-slots, the default), while the survivors
// compute, in both recovery modes: the lost host's ranks go to the free
// slots of a surviving host of the group, which takes the lost host's
// place too and then holds two places of the group (the epoch's table
// carries the doubled place: it was refused, and the job stopped with
// "cannot publish epoch"). The job must end as a run without failure:
// exit 0 and the same final hashes; -v states the group's reduced
// tolerance once the copies and shares are re-sent.
func TestECFreeSlots(t *testing.T) {
	h := testcluster.NetnsHosts(t, 4)
	// Two ranks per host (--map-by node), two free slots each.
	hf := filepath.Join(t.TempDir(), "hostfile")
	var lines string
	hosts := make([]topology.Host, len(h.Names))
	for i, n := range h.Names {
		lines += fmt.Sprintf("%s slots=4\n", n)
		hosts[i] = topology.Host{Name: n, Slots: 4}
	}
	if err := os.WriteFile(hf, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	// The group as the launcher plans it.
	asg, err := topology.MapRanks(hosts, topology.MapOptions{NP: 8, By: topology.MapByNode})
	if err != nil {
		t.Fatal(err)
	}
	groups, err := topology.PlanEC(hosts, asg, topology.ECOptions{K: 2, M: 2})
	if err != nil || len(groups) != 1 {
		t.Fatalf("PlanEC = %v, %v; want one group", groups, err)
	}
	g := groups[0]
	t.Logf("data hosts %v, parity hosts %v", g.Data, g.Parity)
	start := func(t *testing.T, flags ...string) *hsRun {
		ev := filepath.Join(t.TempDir(), "events.jsonl")
		full := []string{"-np", "8", "--hostfile", hf, "--map-by", "node", "--rsh", "ip netns exec", "--bind", h.BridgeAddr,
			"-v", "--events", ev, "--kill-grace", "2", "--redundancy", "ec:2+2"}
		full = append(full, flags...)
		full = append(full, "--", "sh", "-c", printJobID, dptrainBin(t))
		full = append(full, hsArgs...)
		return &hsRun{job: startProtectedJob(t, append(full, "--protect")...), events: ev}
	}
	ref := start(t)
	wantP, wantO := dptrainHashes(t, ref.finish(t, 0))

	for _, mode := range []string{"restart", "in-place"} {
		for _, tc := range []struct {
			name string
			lost int
		}{
			// The lost ranks' clear copies are on their data hosts, which
			// survive: they restore from them.
			{"parity host", g.Parity[0]},
			// The lost ranks' own slots and clear copies (they run on
			// their data host) are both lost: they are decoded.
			{"data host", g.Data[0]},
		} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				r := start(t, "--recovery", mode)
				r.waitStep(t, 8)
				if err := h.KillAll(tc.lost); err != nil {
					t.Fatal(err)
				}
				res := r.finish(t, 0)
				defer func() {
					if t.Failed() {
						t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
					}
				}()
				checkHashes(t, res, wantP, wantO)
				sp := ofKind[events.Splice](readEvents(t, r.events))
				if len(sp) != 1 || sp[0].Spare || sp[0].Lost != h.Names[tc.lost] {
					t.Fatalf("splices %+v, want host %s's ranks moved to free slots once", sp, h.Names[tc.lost])
				}
				with := slices.Index(h.Names, sp[0].With)
				if with < 0 || !slices.Contains(g.Hosts, with) || with == tc.lost {
					t.Fatalf("ranks moved to %s, not a surviving host of the group %v", sp[0].With, g.Hosts)
				}
				// The group, the lost host's place taken, survives one host
				// loss fewer once everything is re-sent (when the lost
				// ranks' clear copies were on the host that took them,
				// there is nothing to re-send: said at the splice).
				names := make([]string, len(g.Hosts))
				for i, x := range g.Hosts {
					if x == tc.lost {
						x = with
					}
					names[i] = h.Names[x]
				}
				want := fmt.Sprintf("erasure-coding group 0 (hosts %s) survives 1 more host loss, not 2 (host %s holds 2 of its places)",
					strings.Join(names, ","), h.Names[with])
				if !strings.Contains(res.stderr, want) {
					t.Errorf("stderr does not say %q", want)
				}
			})
		}
	}
}
