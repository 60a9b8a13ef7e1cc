package keeper

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestGetLogLabel: a getLog carries the restore's label (restart
// generation and the step it resumed from, placement epoch and G), and
// the host asked serves only a log of that trajectory: when host and
// restorer are in different generations or placements, the steps after
// the step the newer one resumed from are refused as stale (no frame,
// the link kept: this source cannot serve), those up to it served; a
// step received in a newer generation than the restore's is refused; a
// log-only copy
// kept across a placement that resumed from G = 8 (an in-place
// recovery, which abandons what came after G) serves the steps up to 8
// and refuses those after it, which the owner never anchored again.
func TestGetLogLabel(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000) // no fold, no refresh: host 1 keeps rank 0's steps 0 to 12
	rs := startDiffRanks(t, c, 2, 47)
	runSteps(t, c, rs, 0, 12)
	o := logHolder(t, c.hosts[1], 0)
	o.mu.Lock()
	ref := slices.Clone(o.sums[12])
	o.mu.Unlock()
	var want []tableEntry
	for _, e := range ref {
		want = append(want, tableEntry{name: e.name, size: e.size})
	}
	maxRec := maxRecordLen(diffN, c.hosts[0].cfg.Diff.codec())
	fetch := func(lb logLabel, from, to int64) (int, error) {
		n := 0
		err := c.hosts[0].links.getLog(context.Background(), 1, 1, 0, lb, from, to, want, diffOpt.Region, maxRec, nil, func(logFrame) error {
			n++
			return nil
		})
		return n, err
	}
	refused := func(what string, n int, err error, msg string) {
		t.Helper()
		if !errors.Is(err, errNoLog) || !errors.Is(err, errPutStale) || n != 0 || !strings.Contains(err.Error(), msg) {
			t.Fatalf("%s: %d frames, %v; want none, a stale refusal saying %q", what, n, err, msg)
		}
	}
	lb := restorerLabel(c.hosts[0])
	for _, tc := range []struct {
		name string
		lb   logLabel
		msg  string
	}{
		{"a newer generation, resumed from step 8", logLabel{gen: lb.gen + 1, epoch: lb.epoch, g: lb.g, resumed: 8}, "this host is in generation 0 yet"},
		{"a newer placement not taken here, resuming from 8", logLabel{gen: lb.gen, epoch: lb.epoch + 1, g: 8}, "this host has not taken it yet"},
		{"an older generation", lb, "this host is in generation 1, which resumed from step 12"}, // last: host 1 restarts
	} {
		if tc.name == "an older generation" {
			// Host 1 restarted into generation 1 (its copy of rank 0 is
			// cut at 12 and kept); a restore of generation 0 is stale.
			if err := c.hosts[1].Restart(lb.gen+1, 12); err != nil {
				t.Fatal(err)
			}
		}
		to := int64(12)
		if tc.name == "an older generation" {
			to = 13 // past the step the newer generation resumed from
		}
		n, err := fetch(tc.lb, 3, to)
		refused(tc.name, n, err, tc.msg)
	}
	// The steps up to the step host 1's newer generation resumed from are
	// final: a restore of the older one reads them.
	if n, err := fetch(lb, 3, 12); err != nil || n != 9 {
		t.Fatalf("getLog of a generation older than the host's, up to the step it resumed from: %d frames, %v; want 9", n, err)
	}
	// A restore under a newer placement, which host 1 has not taken yet,
	// reads the steps up to that placement's G; one of a newer restart
	// generation, into which host 1 has not restarted yet, the steps up
	// to the step it resumed from.
	lb = restorerLabel(c.hosts[1])
	if n, err := fetch(logLabel{gen: lb.gen, epoch: lb.epoch + 1, g: 8, resumed: lb.resumed}, 3, 8); err != nil || n != 5 {
		t.Fatalf("getLog up to the G of a placement host 1 has not taken: %d frames, %v; want 5", n, err)
	}
	if n, err := fetch(logLabel{gen: lb.gen + 1, epoch: lb.epoch, g: lb.g, resumed: 8}, 3, 8); err != nil || n != 5 {
		t.Fatalf("getLog up to the step a generation host 1 is not in yet resumed from: %d frames, %v; want 5", n, err)
	}
	// host 0 restarts too
	if err := c.hosts[0].Restart(lb.gen, 12); err != nil {
		t.Fatal(err)
	}
	if n, err := fetch(lb, 3, 12); err != nil || n != 9 {
		t.Fatalf("getLog under the holder's label: %d frames, %v; want 9", n, err)
	}
	// The owner restarted first into a newer generation and sent step 12
	// again in it: a restore of this generation does not read it.
	o.mu.Lock()
	o.sumGen[12] = lb.gen + 1
	o.mu.Unlock()
	n, err := fetch(lb, 3, 12)
	refused("a step received in a newer generation", n, err, "step 12 was received in restart generation")
	o.mu.Lock()
	o.sumGen[12] = lb.gen
	o.mu.Unlock()

	// Host 1 keeps rank 0's steps 3 to 12 as a log-only copy only (its
	// stores go: they would serve the steps otherwise).
	lg := logOfStore(t, o, want, 2, 12)
	o.mu.Lock()
	o.log, o.logSeq, o.logFenced = lg, c.hosts[1].place().seq, false
	o.cur, o.prev, o.bw = nil, nil, nil
	o.mu.Unlock()
	if n, err := fetch(lb, 3, 12); err != nil || n != 9 {
		t.Fatalf("getLog from the log-only copy: %d frames, %v; want 9", n, err)
	}

	// Both hosts take epoch 2's placement (another layout), which
	// resumes from G = 8.
	for _, h := range c.hosts {
		if err := h.SetPlacement(Placement{Ranks: h.place().ranks, HostOf: []int{0, 1}, Holders: [][]int{{1}, nil}, Epoch: 2, G: 8}); err != nil {
			t.Fatal(err)
		}
	}
	lb = restorerLabel(c.hosts[0])
	if lb.epoch != 2 {
		t.Fatalf("host 0's placement epoch %d, want 2", lb.epoch)
	}
	n, err = fetch(logLabel{gen: lb.gen, epoch: 1, g: -1, resumed: lb.resumed}, 3, 9)
	refused("an older placement", n, err, "this host has taken epoch 2's, which resumed from step 8")
	if n, err := fetch(logLabel{gen: lb.gen, epoch: 1, g: -1, resumed: lb.resumed}, 3, 8); err != nil || n != 5 {
		t.Fatalf("getLog under an older placement, up to the newer one's G: %d frames, %v; want 5", n, err)
	}
	n, err = fetch(lb, 3, 12)
	refused("the steps after the placement's G", n, err, "may be of an abandoned trajectory")
	if n, err := fetch(lb, 3, 8); err != nil || n != 5 {
		t.Fatalf("getLog of the steps up to the placement's G: %d frames, %v; want 5", n, err)
	}
	select {
	case lf := <-c.links:
		t.Fatalf("a link failure was reported: %+v", lf)
	default:
	}
}
