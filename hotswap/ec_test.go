package hotswap

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// ecShapes are the (K, M) the erasure-coding tests run.
var ecShapes = [][2]int{{2, 2}, {2, 1}, {4, 2}}

// ecJob returns a job of groups erasure-coding groups of k+m hosts with
// perHost ranks each (racks at random), and spares spare hosts.
func ecJob(t *testing.T, rng *rand.Rand, k, m, groups, perHost, spares int, onNoSpare OnNoSpare) Config {
	t.Helper()
	var hs []topology.Host
	for i := range groups * (k + m) {
		hs = append(hs, topology.Host{Name: fmt.Sprintf("h%d", i), Slots: perHost, Rack: fmt.Sprintf("r%d", rng.IntN(4))})
	}
	for i := range spares {
		hs = append(hs, topology.Host{Name: fmt.Sprintf("s%d", i), Slots: perHost, Rack: fmt.Sprintf("r%d", rng.IntN(4)), Spare: true})
	}
	world := groups * (k + m) * perHost
	asg, err := topology.MapRanks(hs, topology.MapOptions{NP: world, By: topology.MapBySlot})
	if err != nil {
		t.Fatal(err)
	}
	ec, err := topology.PlanEC(hs, asg, topology.ECOptions{K: k, M: m})
	if err != nil {
		t.Fatal(err)
	}
	c := Config{World: world, Hosts: hs, EC: ec, Recovery: Recovery(rng.IntN(2)), OnNoSpare: onNoSpare,
		MaxRestarts: 3, HeartbeatTimeout: time.Hour}
	for _, a := range asg {
		c.Assign = append(c.Assign, a.Host)
	}
	return c
}

// ecPerHost returns a rank count per host for which k+m hosts hold a
// multiple of k ranks.
func ecPerHost(rng *rand.Rand, k, m int) int {
	for {
		if g := 1 + rng.IntN(3); (k+m)*g%k == 0 {
			return g
		}
	}
}

// ecOracle follows, independently of the machine, where each rank's
// state survives in the clear: its own slot (gone with its host, back
// once the epoch is restored) and its clear copy on its data host (gone
// with that host, back once the owners report Replicated; a rank on its
// data host has its own slot as its clear copy).
type ecOracle struct {
	rankHost  []int
	groups    []topology.ECGroup
	ownGone   []bool
	clearGone []bool
}

func newECOracle(c Config) *ecOracle {
	return &ecOracle{rankHost: slices.Clone(c.Assign), groups: c.EC,
		ownGone: make([]bool, c.World), clearGone: make([]bool, c.World)}
}

func (o *ecOracle) dataHost(r int) int {
	for _, g := range o.groups {
		for x, dg := range g.DataGroups {
			if slices.Contains(dg, r) {
				return g.Data[x]
			}
		}
	}
	panic(fmt.Sprintf("rank %d in no data group", r))
}

func (o *ecOracle) lost(h int) {
	for r := range o.rankHost {
		if o.rankHost[r] == h {
			o.ownGone[r] = true
		}
		if o.dataHost(r) == h {
			o.clearGone[r] = true
		}
	}
}

func (o *ecOracle) restored() {
	for r := range o.rankHost {
		o.ownGone[r] = false
		if o.rankHost[r] == o.dataHost(r) {
			o.clearGone[r] = false
		}
	}
}

func (o *ecOracle) replicated() { clear(o.clearGone) }

// ecStep feeds e and checks every epoch published: restore sources on
// live hosts, a decode exactly where the oracle says neither the rank's
// own slot nor its clear copy survives. It returns the actions.
func ecStep(t *testing.T, where string, m *Machine, o *ecOracle, now time.Duration, e Event) []Action {
	t.Helper()
	acts := m.Step(now, e)
	last := -1
	for i, a := range acts {
		if _, ok := a.(PublishEpoch); ok {
			last = i
		}
	}
	for i, a := range acts {
		switch a := a.(type) {
		case PublishEpoch:
			o.rankHost, o.groups = slices.Clone(a.RankHost), a.EC
			if a.EC == nil {
				t.Fatalf("%s: epoch %d published without its erasure-coding groups", where, a.Epoch)
			}
		case RestorePlan:
			if i != last+1 {
				continue // superseded within the step
			}
			for _, s := range a.Sources {
				r := s.Rank
				switch {
				case s.Local:
					if o.ownGone[r] {
						t.Fatalf("%s: rank %d restores from its own slot, which is gone", where, r)
					}
				case s.Decode:
					if !o.ownGone[r] || !o.clearGone[r] {
						t.Fatalf("%s: rank %d decodes, but a copy survives (own gone %v, clear copy gone %v)", where, r, o.ownGone[r], o.clearGone[r])
					}
					if !m.alive[s.ParamsHost] {
						t.Fatalf("%s: rank %d's parameters come from lost host %d", where, r, s.ParamsHost)
					}
				default:
					if o.clearGone[r] {
						t.Fatalf("%s: rank %d restores from a clear copy at rank %d, which is gone", where, r, s.OptRank)
					}
					if !m.alive[s.OptHost] || !m.alive[s.ParamsHost] {
						t.Fatalf("%s: rank %d restores from a lost host: %+v", where, r, s)
					}
				}
			}
		}
	}
	return acts
}

func aborted(acts []Action) (Abort, bool) {
	for _, a := range acts {
		if x, ok := a.(Abort); ok {
			return x, true
		}
	}
	return Abort{}, false
}

// TestECLossesWithinM: at most M hosts of each group lost, at once, one
// after another, or while the recovery of an earlier loss is under way
// (before its restore, before its copies and shares are re-sent), never
// stop the job; every rank restores from its own slot or a clear copy
// where one survives, and from a decode only where none does.
func TestECLossesWithinM(t *testing.T) {
	runs := 300
	if testing.Short() {
		runs = 40
	}
	for _, km := range ecShapes {
		k, mm := km[0], km[1]
		t.Run(fmt.Sprintf("%d+%d", k, mm), func(t *testing.T) {
			decodes := 0
			for seed := range runs {
				rng := rand.New(rand.NewPCG(uint64(seed), uint64(k*10+mm)))
				groups := 1 + rng.IntN(2)
				c := ecJob(t, rng, k, mm, groups, ecPerHost(rng, k, mm), groups*mm, OnNoSpareAbort)
				m, err := New(c)
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				o := newECOracle(c)
				now := time.Duration(0)
				for h := range c.Hosts {
					m.Step(now, AgentRegistered{Host: h, Spare: c.Hosts[h].Spare})
				}
				m.Step(now, GPublished{G: 4})
				for r := range c.World {
					m.Step(now, Progress{Rank: r, Step: 4})
				}
				lostIn := make([]int, groups)
				for loss := 0; ; loss++ {
					// A live host holding a place of a group that may
					// still lose one.
					var cands []int
					for gi, g := range m.ec.groups {
						for _, h := range g.Hosts {
							if lostIn[gi] < mm && m.alive[h] && !slices.Contains(cands, h) {
								cands = append(cands, h)
							}
						}
					}
					if len(cands) == 0 {
						break
					}
					h := cands[rng.IntN(len(cands))]
					for gi, g := range m.ec.groups {
						if slices.Contains(g.Hosts, h) {
							lostIn[gi]++
						}
					}
					o.lost(h)
					where := fmt.Sprintf("seed %d loss %d (host %s)", seed, loss, c.Hosts[h].Name)
					now += time.Millisecond
					acts := ecStep(t, where, m, o, now, AgentExited{Host: h, Why: "lost"})
					if a, ok := aborted(acts); ok {
						t.Fatalf("%s: %d+%d lost at most %d hosts per group (%v) and stopped: %s", where, k, mm, mm, lostIn, a.Msg)
					}
					for _, a := range acts {
						if s, ok := a.(RestorePlan); ok {
							for _, x := range s.Sources {
								if x.Decode {
									decodes++
								}
							}
						}
					}
					// What happens before the next loss: nothing (lost at
					// once), the restore, or the restore and the re-send.
					switch rng.IntN(3) {
					case 1:
						now += time.Millisecond
						ecStep(t, where+" resumed", m, o, now, RecoveryReport{Epoch: m.epoch, Stage: StageResumed})
						o.restored()
					case 2:
						now += time.Millisecond
						ecStep(t, where+" resumed", m, o, now, RecoveryReport{Epoch: m.epoch, Stage: StageResumed})
						o.restored()
						ecStep(t, where+" replicated", m, o, now, Replicated{Owner: -1})
						o.replicated()
						if m.under != 0 {
							t.Fatalf("%s: %d owners under-protected after every owner reported Replicated", where, m.under)
						}
					}
				}
				if m.stopped {
					t.Fatalf("seed %d: stopped", seed)
				}
			}
			if decodes == 0 {
				t.Fatal("no rank was ever decoded: the test exercises nothing")
			}
			t.Logf("%d decodes planned", decodes)
		})
	}
}

// TestECLossesBeyondM: M+1 hosts of a group lost at once stop the job
// with an I3 report naming the group and the lost hosts exactly when a
// lost rank's stripe is left fewer than K shards (counted here from the
// hosts alone: a member's shard survives with its host or its data host,
// a parity row with its host); otherwise every rank is restored.
// topology.ECLoss, which decides by hosts, agrees: it names a rank
// whenever the count does.
func TestECLossesBeyondM(t *testing.T) {
	for _, km := range ecShapes {
		k, mm := km[0], km[1]
		t.Run(fmt.Sprintf("%d+%d", k, mm), func(t *testing.T) {
			stops, survived := 0, 0
			for seed := range 200 {
				rng := rand.New(rand.NewPCG(uint64(seed), 99))
				c := ecJob(t, rng, k, mm, 1, ecPerHost(rng, k, mm), mm+1, OnNoSpareAbort)
				m, err := New(c)
				if err != nil {
					t.Fatal(err)
				}
				for h := range c.Hosts {
					m.Step(0, AgentRegistered{Host: h, Spare: c.Hosts[h].Spare})
				}
				m.Step(0, GPublished{G: 4})
				g := c.EC[0]
				down := slices.Clone(g.Hosts)
				rng.Shuffle(len(down), func(i, j int) { down[i], down[j] = down[j], down[i] })
				down = down[:mm+1]
				dead := func(h int) bool { return slices.Contains(down, h) }
				short := false
				for i := range g.DataGroups[0] {
					have, lost := 0, false
					for x, dg := range g.DataGroups {
						r := dg[i]
						switch {
						case !dead(c.Assign[r]) || !dead(g.Data[x]):
							have++
						default:
							lost = true
						}
					}
					for _, p := range g.Parity {
						if !dead(p) {
							have++
						}
					}
					short = short || lost && have < k
				}
				if short && len(topology.ECLoss(c.EC, down)) == 0 {
					t.Fatalf("seed %d: losing %v leaves a stripe short, but ECLoss loses nothing", seed, down)
				}
				var stop *Abort
				for _, h := range down {
					if a, ok := aborted(m.Step(time.Second, AgentExited{Host: h, Why: "lost"})); ok {
						stop = &a
						break
					}
				}
				switch {
				case short && stop == nil:
					t.Fatalf("seed %d: losing %v leaves a stripe short of %d shards, and the job went on", seed, down, k)
				case !short && stop != nil:
					t.Fatalf("seed %d: losing %v leaves every stripe %d shards, and the job stopped: %s", seed, down, k, stop.Msg)
				case stop != nil:
					stops++
					if !strings.Contains(stop.Msg, "(I3)") || !strings.Contains(stop.Msg, "erasure-coding group 0") ||
						!strings.Contains(stop.Msg, "lost: ") {
						t.Fatalf("seed %d: the stop does not name I3, the group and the lost hosts: %s", seed, stop.Msg)
					}
					for _, h := range down {
						if !m.alive[h] && !strings.Contains(stop.Msg, c.Hosts[h].Name) {
							t.Fatalf("seed %d: the stop does not name lost host %s: %s", seed, c.Hosts[h].Name, stop.Msg)
						}
					}
				default:
					survived++
				}
			}
			if stops == 0 {
				t.Fatal("no M+1 loss was in the wrong places: the test exercises nothing")
			}
			t.Logf("%d stopped, %d survived M+1 losses", stops, survived)
		})
	}
}

// TestECFreeSlots: with no spare, a lost host's ranks go to a host with
// free slots, outside the group if one has room; inside it (one group
// only), that host holds two places and the group survives one loss less,
// which the report says once the copies are re-sent.
func TestECFreeSlots(t *testing.T) {
	for _, km := range ecShapes {
		k, mm := km[0], km[1]
		for _, groups := range []int{1, 2} {
			t.Run(fmt.Sprintf("%d+%d/groups=%d", k, mm, groups), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, 2))
				per := ecPerHost(rng, k, mm)
				c := ecJob(t, rng, k, mm, groups, per, 0, OnNoSpareFreeSlots)
				for i := range c.Hosts {
					c.Hosts[i].Slots = 2 * per // room for one lost host's ranks
				}
				m, err := New(c)
				if err != nil {
					t.Fatal(err)
				}
				for h := range c.Hosts {
					m.Step(0, AgentRegistered{Host: h})
				}
				m.Step(0, GPublished{G: 4})
				m.Step(0, Progress{Rank: 0, Step: 4})
				lost := c.EC[0].Hosts[0]
				acts := m.Step(time.Second, AgentExited{Host: lost, Why: "lost"})
				if a, ok := aborted(acts); ok {
					t.Fatalf("stopped: %s", a.Msg)
				}
				var with = -1
				for _, a := range acts {
					if s, ok := a.(Splice); ok {
						with = s.With
					}
				}
				inGroup := slices.Contains(c.EC[0].Hosts, with)
				if inGroup != (groups == 1) {
					t.Fatalf("free slots on host %d (in the group: %v) with %d groups", with, inGroup, groups)
				}
				acts = append(acts, m.Step(2*time.Second, RecoveryReport{Epoch: m.epoch, Stage: StageResumed})...)
				acts = append(acts, m.Step(3*time.Second, Replicated{Owner: -1})...)
				// The last word on the group, once everything is re-sent.
				var msg string
				for _, a := range acts {
					if r, ok := a.(Report); ok && (strings.Contains(r.Msg, "erasure-coding group") || strings.Contains(r.Msg, "again")) {
						msg = r.Msg
					}
				}
				want := fmt.Sprintf("survives %s, not %d (host %s holds 2 of its places)", losses(mm-1), mm, c.Hosts[with].Name)
				if inGroup != strings.Contains(msg, want) {
					t.Fatalf("after re-protection (the host in the group: %v): %q; want %q said iff in the group", inGroup, msg, want)
				}
				if got := m.tolerance(0); got != mm-1 && inGroup || got != mm && !inGroup {
					t.Fatalf("group 0 survives %d more losses (the host in the group: %v)", got, inGroup)
				}
			})
		}
	}
}

// TestECConfig: a malformed erasure-coding layout is a configuration
// error.
func TestECConfig(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	base := func() Config { return ecJob(t, rng, 2, 2, 1, 1, 1, OnNoSpareAbort) }
	for _, tt := range []struct {
		name string
		edit func(c *Config)
	}{
		{"spare in a group", func(c *Config) { c.EC[0].Hosts[0], c.EC[0].Data[0] = 4, 4 }},
		{"parity not a host", func(c *Config) { c.EC[0].Parity[0] = c.EC[0].Data[0] }},
		{"rank twice", func(c *Config) { c.EC[0].DataGroups[1][0] = c.EC[0].DataGroups[0][0] }},
		{"unequal data groups", func(c *Config) { c.EC[0].DataGroups[1] = c.EC[0].DataGroups[1][:1] }},
		{"wrong holder", func(c *Config) {
			c.Holders = make([][]int, c.World)
			c.Holders[1] = []int{3}
		}},
		{"no group", func(c *Config) { c.EC = []topology.ECGroup{} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			c.EC = []topology.ECGroup{cloneGroup(c.EC[0])}
			if _, err := New(c); err != nil {
				t.Fatalf("the unedited layout: %v", err)
			}
			tt.edit(&c)
			if _, err := New(c); !errors.Is(err, ErrConfig) {
				t.Fatalf("New = %v; want ErrConfig", err)
			}
		})
	}
}
