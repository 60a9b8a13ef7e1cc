package hotswap

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// diffOracle: whether a rank lost in diff mode under EC restores, decided
// from the hosts alone, and checkDiffPlan, which holds a restore plan to it.

// diffOracle decides, from the hosts alone, whether a rank lost with its
// host can be restored in diff mode under EC when every role was valid
// before the losses and none was re-sent since: from its clear copy
// (its data host alive), else by a decode at H (K of its stripe's shards:
// member y's on y's data host, row j on parity host j) and a replay from
// a surviving copy of its log (its clear copy's holder or a log-only
// holder). Places and holders are the job's first ones: a replacement
// holds nothing yet.
type diffOracle struct {
	c    Config
	data []int // each rank's data host
	logs [][]int
	// runs is each rank's host now (follow), which its own slot is on;
	// c.Assign is where its roles were when they were last valid.
	runs []int
}

func newDiffOracle(c Config) *diffOracle {
	o := &diffOracle{c: c, data: make([]int, c.World), runs: slices.Clone(c.Assign)}
	hostRanks := make([][]int, len(c.Hosts))
	for r, h := range c.Assign {
		hostRanks[h] = append(hostRanks[h], r)
	}
	for _, g := range c.EC {
		for x, dg := range g.DataGroups {
			for _, r := range dg {
				o.data[r] = g.Data[x]
			}
		}
	}
	o.logs = topology.ECLogHolders(c.EC, c.Assign, hostRanks)
	return o
}

// splice applies the splices of acts onto spares to the oracle's
// placement, by their own rule and not the machine's tables: the spare
// takes the lost host's ranks and its places in every group, and the
// ranks keep their roles (clear copies, logs), now on the spare. Call it
// once the roles are re-protected (valid where they now are). It fails
// t on a splice onto free slots, which the oracle does not model.
func (o *diffOracle) splice(t *testing.T, acts []Action) {
	t.Helper()
	for _, a := range acts {
		sp, ok := a.(Splice)
		if !ok {
			continue
		}
		if !sp.Spare {
			t.Fatalf("oracle: splice onto free slots %v", sp)
		}
		o.c.Assign = slices.Clone(o.c.Assign)
		for r, h := range o.c.Assign {
			if h == sp.Lost {
				o.c.Assign[r] = sp.With
				o.runs[r] = sp.With
			}
		}
		swap := func(hs []int) []int {
			out := slices.Clone(hs)
			for i, h := range out {
				if h == sp.Lost {
					out[i] = sp.With
				}
			}
			return out
		}
		groups := slices.Clone(o.c.EC)
		for i := range groups {
			groups[i].Hosts, groups[i].Data, groups[i].Parity = swap(groups[i].Hosts), swap(groups[i].Data), swap(groups[i].Parity)
		}
		o.c.EC = groups
		for r, h := range o.data {
			if h == sp.Lost {
				o.data[r] = sp.With
			}
		}
	}
}

// follow moves the ranks of acts' splices in o.runs (where they run and
// keep their own slots), not their roles.
func (o *diffOracle) follow(acts []Action) {
	for _, a := range acts {
		if sp, ok := a.(Splice); ok {
			for _, r := range sp.Ranks {
				o.runs[r] = sp.With
			}
		}
	}
}

// reprotect reports Replicated for every owner acts left under-protected
// (UnderProtected), all at once: what the launcher does in diff mode
// under EC once H reached the epoch's G (every rank coded its base at G
// under the epoch's placement), never for one owner alone.
func reprotect(m *Machine, now time.Duration, acts []Action) []Action {
	var out []Action
	for _, a := range acts {
		if u, ok := a.(UnderProtected); ok {
			for _, o := range u.Owners {
				out = append(out, m.Step(now, Replicated{Owner: o})...)
			}
		}
	}
	return out
}

// recoverable reports whether rank r (lost) restores with hosts down lost.
func (o *diffOracle) recoverable(r int, down []int) bool {
	dead := func(h int) bool { return slices.Contains(down, h) }
	if o.c.Assign[r] != o.data[r] && !dead(o.data[r]) {
		return true // its clear copy
	}
	log := false
	for _, x := range o.logs[r] {
		log = log || !dead(o.c.Assign[x])
	}
	if !log {
		return false
	}
	for _, g := range o.c.EC {
		for x, dg := range g.DataGroups {
			i := slices.Index(dg, r)
			if i < 0 {
				continue
			}
			_ = x
			have := 0
			for _, dg := range g.DataGroups {
				if !dead(o.data[dg[i]]) {
					have++
				}
			}
			for _, p := range g.Parity {
				if !dead(p) {
					have++
				}
			}
			return have >= len(g.Data)
		}
	}
	panic(fmt.Sprintf("rank %d in no stripe", r))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkDiffPlan checks the last restore plan of acts against the oracle,
// with hosts down lost since every role was last valid: a rank restores
// from its own slot only if its host was not lost, from a clear copy only
// on its live data host, and by a decode only where that is gone and the
// oracle can decode it.
func checkDiffPlan(t *testing.T, where string, m *Machine, o *diffOracle, acts []Action, down []int, decodes *int) {
	t.Helper()
	var plan *RestorePlan
	for _, a := range acts {
		if p, ok := a.(RestorePlan); ok {
			plan = &p
		}
	}
	if plan == nil {
		return
	}
	for _, s := range plan.Sources {
		r := s.Rank
		lost := slices.Contains(down, o.runs[r])
		switch {
		case s.Local:
			if lost && m.g >= 0 {
				t.Fatalf("%s: rank %d restores from its own slot, lost with its host", where, r)
			}
		case s.Decode:
			*decodes++
			if o.c.Assign[r] != o.data[r] && !slices.Contains(down, o.data[r]) {
				t.Fatalf("%s: rank %d decodes, but its clear copy survives", where, r)
			}
			if !o.recoverable(r, down) {
				t.Fatalf("%s: rank %d decodes, but the oracle cannot", where, r)
			}
		default:
			if s.OptHost != o.data[r] || slices.Contains(down, s.OptHost) || !m.alive[s.OptHost] {
				t.Fatalf("%s: rank %d restores from a copy on host %d, not its live data host %d", where, r, s.OptHost, o.data[r])
			}
		}
	}
}
