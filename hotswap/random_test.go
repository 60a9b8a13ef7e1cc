package hotswap

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// randomConfig returns a valid random job, or false.
func randomConfig(rng *rand.Rand) (Config, bool) {
	nh := 2 + rng.IntN(7)
	hs := make([]topology.Host, nh)
	for i := range hs {
		hs[i] = topology.Host{Name: fmt.Sprintf("h%d", i), Slots: 1 + rng.IntN(4), Rack: fmt.Sprintf("r%d", rng.IntN(3))}
	}
	spares := rng.IntN(min(3, nh))
	slots := 0
	for _, h := range hs[:nh-spares] {
		slots += h.Slots
	}
	c := Config{Hosts: hs, Spares: spares, World: 1 + rng.IntN(slots), MaxRestarts: rng.IntN(4),
		Recovery: Recovery(rng.IntN(2)), OnNoSpare: OnNoSpare(rng.IntN(2)), HangTimeout: time.Duration(rng.IntN(3)) * 10 * time.Second,
		HeartbeatTimeout: 5 * time.Second}
	asg, err := topology.MapRanks(hs[:nh-spares], topology.MapOptions{NP: c.World, By: topology.MapBy(rng.IntN(2))})
	if err != nil {
		return c, false
	}
	for _, a := range asg {
		c.Assign = append(c.Assign, a.Host)
	}
	if rng.IntN(3) == 0 {
		// Erasure coding where the hosts and ranks allow it.
		km := [][2]int{{2, 2}, {2, 1}, {4, 2}, {1, 1}}[rng.IntN(4)]
		if groups, err := topology.PlanEC(hs[:nh-spares], asg, topology.ECOptions{K: km[0], M: km[1]}); err == nil {
			c.EC = groups
			// M+1 more spares with room for any host's ranks: more
			// than M hosts of a group can be replaced (TestRandomEvents
			// loses them: a durable tier rolls back).
			room := 0
			for _, h := range hs {
				room = max(room, h.Slots)
			}
			for i := range km[1] + 1 {
				c.Hosts = append(c.Hosts, topology.Host{Name: fmt.Sprintf("x%d", i), Slots: room, Rack: fmt.Sprintf("r%d", rng.IntN(3))})
			}
			c.Spares += km[1] + 1
			return c, true
		}
	}
	if k := rng.IntN(3); k > 0 {
		l, _ := topology.NewLayout(c.World, 1, 1)
		if p, err := topology.Place(l, hs[:nh-spares], asg, topology.PlacementOptions{K: k}); err == nil {
			c.Holders = p.Holders
		}
	}
	return c, true
}

func randomEvent(rng *rand.Rand, c *Config, m *Machine) Event {
	r := rng.IntN(c.World+2) - 1 // sometimes out of range
	h := rng.IntN(len(c.Hosts)+2) - 1
	switch rng.IntN(17) {
	case 0, 1:
		host := h
		if m.rank(r) && rng.IntN(4) > 0 {
			host = m.rankHost[r]
		}
		e := RankExited{Rank: r, Host: host, Gen: m.gen, Code: rng.IntN(3)}
		switch rng.IntN(5) {
		case 0:
			e.Signal = syscall.SIGKILL
		case 1:
			e.Abort = true
		case 2:
			e.Stopped = true
		}
		return e
	case 2:
		return AgentExited{Host: h, Why: "random"}
	case 3:
		return AgentRegistered{Host: h, Spare: rng.IntN(2) == 0}
	case 4, 5:
		return Heartbeat{Host: h}
	case 6:
		return ControlDropped{Host: h}
	case 7:
		return ReplicationFailed{From: h, To: rng.IntN(len(c.Hosts))}
	case 8:
		return PeerLost{Rank: r, Peers: []int{rng.IntN(c.World), rng.IntN(c.World + 3)}}
	case 9:
		return GPUHealth{Host: h, Class: []string{GPUPermanent, GPUTransient, GPUUnknown, ""}[rng.IntN(4)]}
	case 10:
		return Progress{Rank: r, Step: int64(rng.IntN(20))}
	case 11:
		if rng.IntN(8) == 0 {
			return Signal{Sig: []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR1}[rng.IntN(3)]}
		}
		return Tick{}
	case 12:
		return GPublished{G: int64(rng.IntN(20))}
	case 13:
		return Replicated{Owner: r}
	case 14:
		return RecoveryReport{Epoch: max(m.epoch, 1) - uint64(rng.IntN(2)), Stage: Stage(rng.IntN(4))}
	case 15:
		// An MPI_Abort told before the rank's exit (which a later
		// RankExited with Abort set may or may not bring), now and then
		// of another host or an earlier generation.
		host, gen := h, m.gen-uint64(rng.IntN(2))
		if m.rank(r) && rng.IntN(4) > 0 {
			host = m.rankHost[r]
		}
		return RankAborted{Rank: r, Host: host, Gen: gen, Code: rng.IntN(3), Msg: "random abort"}
	}
	return Tick{}
}

// TestRandomEvents: random event sequences never panic, epochs only grow,
// and every published epoch satisfies I1–I4, or the machine aborted with a
// report (and publishes nothing after).
func TestRandomEvents(t *testing.T) {
	// Not fewer under -short: 50 runs roll nothing back (and the whole
	// test takes well under a second).
	runs, steps := 400, 300
	published, ecRuns, rollbacks, ecRollbacks, diffECRollbacks := 0, 0, 0, 0, 0
	for seed := range runs {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		c, ok := randomConfig(rng)
		if !ok {
			continue
		}
		// Half the runs have a durable tier with a commit record, whose
		// reach the loop below gives when asked (GatherReach): the
		// random events' sequence is the same either way.
		c.Durable = seed%2 == 0
		// Under EC, half the runs of each kind in diff mode (its
		// roll-back restarts the base schedule from T).
		c.Diff = c.EC != nil && seed%4 < 2
		m, err := New(c)
		if err != nil {
			t.Fatalf("seed %d: New: %v", seed, err)
		}
		if c.EC != nil {
			ecRuns++
		}
		var gather *GatherReach
		for h := range c.Hosts {
			m.Step(0, AgentRegistered{Host: h, Spare: true})
		}
		var now time.Duration
		var epoch uint64
		committed := make([]int64, c.World) // the highest step each rank reported
		for i := range committed {
			committed[i] = -1
		}
		aborted := false
		// Under EC, once in a run, early (random events stop most runs
		// within a few dozen steps), more than M hosts of one group are
		// lost in one instant: memory cannot restore them, a durable
		// tier rolls the job back (rarely reached by random events).
		burstAt, burst := -1, []Event(nil)
		if c.EC != nil {
			burstAt = 1 + rng.IntN(10)
		}
		for i := range steps {
			if i == burstAt && !m.stopped {
				burst = groupBurst(rng, m, committed)
			}
			var e Event
			if len(burst) > 0 {
				e, burst = burst[0], burst[1:]
			} else {
				now += time.Duration(rng.IntN(2000)) * time.Millisecond
				e = randomEvent(rng, &c, m)
			}
			if gather != nil && i%3 == 0 {
				// The reach on disk: at or below G, or none (every
				// fourth answer an error, some of an earlier epoch).
				e = DiskReach{Epoch: gather.Epoch - uint64(i%5/4), T: max(gather.Base, m.g-int64(i%7))}
				if i%4 == 0 {
					e = DiskReach{Epoch: gather.Epoch, T: -1, Err: "random"}
				}
				gather = nil
			}
			if i == 0 && c.Durable {
				e = DiskCommitted{Step: 0}
			}
			if p, ok := e.(Progress); ok && m.rank(p.Rank) {
				committed[p.Rank] = max(committed[p.Rank], p.Step)
			}
			if g, ok := e.(GPublished); ok {
				// G is a step every rank has committed (and replicated),
				// whatever Progress events said before or say after.
				for r := range committed {
					committed[r] = max(committed[r], g.G)
				}
			}
			where := fmt.Sprintf("seed %d step %d (%v)", seed, i, e)
			acts := m.Step(now, e)
			// Liveness is read after the step: only its last epoch is
			// checked against it (an earlier one in the same step, say two
			// hosts lost on one tick, was superseded at once).
			last := -1
			for j, a := range acts {
				switch a.(type) {
				case PublishEpoch:
					last = j
				case Abort:
					last = -2 // the step ended the job: nothing to hold it to
				}
			}
			for j, a := range acts {
				switch a := a.(type) {
				case PublishEpoch:
					published++
					if aborted {
						t.Fatalf("%s: published epoch %d after an abort", where, a.Epoch)
					}
					if a.Epoch <= epoch {
						t.Fatalf("%s: epoch %d after %d", where, a.Epoch, epoch)
					}
					epoch = a.Epoch
					if j == last {
						checkEpoch(t, where, m, &c, a, committed)
					}
				case RestorePlan:
					for _, s := range a.Sources {
						if j != last+1 {
							break
						}
						if s.Decode && (m.ec == nil || s.OptHost != -1 || !m.alive[s.ParamsHost]) ||
							!s.Local && !s.Decode && (!m.alive[s.OptHost] || !m.alive[s.ParamsHost]) {
							t.Fatalf("%s: rank %d restores from a lost host: %+v", where, s.Rank, s)
						}
					}
				case Abort:
					aborted = true
					// The events never make G pass a rank's committed step
					// (a published G is committed by every rank): the
					// machine has no cause to stop for I4.
					if strings.Contains(a.Msg, "invariant I4") {
						t.Fatalf("%s: stopped for I4, which the events never break: %v", where, a)
					}
					// Code 0 only for MPI_Abort(comm, 0), as under Hydra.
					if a.Code == 0 && !strings.Contains(a.Msg, "MPI_Abort with exit code 0") || a.Msg == "" {
						t.Fatalf("%s: abort without code or report: %v", where, a)
					}
				case Restart:
					if aborted {
						t.Fatalf("%s: restart after an abort", where)
					}
				case GatherReach:
					if !c.Durable {
						t.Fatalf("%s: %v without a durable tier", where, a)
					}
					gather = &a
				case RollbackToDisk:
					rollbacks++
					if c.EC != nil {
						ecRollbacks++
						if c.Diff {
							diffECRollbacks++
						}
					}
					// Its restart, the epoch at G = T and a plan with
					// every rank from its own slot follow.
					rest := acts[j+1:]
					if len(rest) < 3 || rest[0] != (Restart{Gen: a.Gen, Epoch: a.Epoch, G: a.T}) {
						t.Fatalf("%s: %v not followed by its restart: %v", where, a, rest)
					}
					p, ok := rest[1].(PublishEpoch)
					plan, ok2 := rest[2].(RestorePlan)
					if !ok || !ok2 || p.G != a.T || plan.G != a.T || a.T > a.From {
						t.Fatalf("%s: %v followed by %v", where, a, rest)
					}
					for _, s := range plan.Sources {
						if !s.Local {
							t.Fatalf("%s: after %v rank %d does not restore from its own slot", where, a, s.Rank)
						}
					}
				}
			}
			if m.Epoch() < epoch {
				t.Fatalf("%s: epoch went back to %d", where, m.Epoch())
			}
			// The kept deadline is never later than the true one.
			if d, ok := m.deadline(); ok {
				if kd, kok := m.NextDeadline(); !kok || kd > d {
					t.Fatalf("%s: NextDeadline %v (%v), but a deadline is due at %v", where, kd, kok, d)
				}
			}
		}
	}
	if published == 0 {
		t.Fatal("no epoch was ever published: the test exercises nothing")
	}
	if ecRuns == 0 {
		t.Fatal("no run used erasure coding: the test exercises none of it")
	}
	if rollbacks == 0 {
		t.Fatal("no run rolled back to disk: the test exercises none of it")
	}
	if ecRollbacks == 0 {
		t.Fatal("no run rolled back to disk under erasure coding: the test exercises none of it")
	}
	if diffECRollbacks == 0 {
		t.Fatal("no run rolled back to disk in diff mode under erasure coding: the test exercises none of it")
	}
	t.Logf("%d epochs published, %d runs with erasure coding, %d roll-backs to disk (%d under erasure coding, %d of them in diff mode)", published, ecRuns, rollbacks, ecRollbacks, diffECRollbacks)
}

// groupBurst returns the events of a loss of M+1 live hosts of a random
// erasure-coding group (fewer if fewer are alive) in one instant, after
// a heartbeat of every live host (none times out meanwhile) and, when no
// G is published yet, a G every rank has committed (committed: the
// highest step each rank reported).
func groupBurst(rng *rand.Rand, m *Machine, committed []int64) []Event {
	var es []Event
	for h := range m.alive {
		if m.alive[h] {
			es = append(es, Heartbeat{Host: h})
		}
	}
	if m.g < 0 {
		g := int64(rng.IntN(20))
		for _, s := range committed {
			if s >= 0 {
				g = min(g, s)
			}
		}
		es = append(es, GPublished{G: g})
	}
	gr := m.ec.groups[rng.IntN(len(m.ec.groups))]
	var hs []int
	for _, h := range gr.Hosts {
		if m.alive[h] {
			hs = append(hs, h)
		}
	}
	rng.Shuffle(len(hs), func(i, j int) { hs[i], hs[j] = hs[j], hs[i] })
	for _, h := range hs[:min(len(hs), m.ec.m+1)] {
		es = append(es, AgentExited{Host: h, Why: "burst"})
	}
	return es
}

// checkEpoch checks I1, I2 and I4 on a published epoch, independently of
// the machine's own check.
func checkEpoch(t *testing.T, where string, m *Machine, c *Config, p PublishEpoch, committed []int64) {
	t.Helper()
	if len(p.RankHost) != c.World {
		t.Fatalf("%s: I2: table of %d ranks for %d", where, len(p.RankHost), c.World)
	}
	load := make([]int, len(c.Hosts))
	for r, h := range p.RankHost {
		if h < 0 || h >= len(c.Hosts) || !m.alive[h] {
			t.Fatalf("%s: I1: rank %d on host %d, not alive", where, r, h)
		}
		load[h]++
	}
	for h, n := range load {
		if n > c.Hosts[h].Slots {
			t.Fatalf("%s: I1: host %d has %d ranks for %d slots", where, h, n, c.Hosts[h].Slots)
		}
	}
	for r, s := range committed {
		if s >= 0 && p.G > s {
			t.Fatalf("%s: I4: resume from %d, rank %d committed %d", where, p.G, r, s)
		}
	}
}

// FuzzMachine feeds the machine byte-chosen events.
func FuzzMachine(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(42), uint64(7))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		rng := rand.New(rand.NewPCG(a, b))
		c, ok := randomConfig(rng)
		if !ok {
			return
		}
		m, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		var now time.Duration
		for range 200 {
			now += time.Duration(rng.IntN(3000)) * time.Millisecond
			m.Step(now, randomEvent(rng, &c, m))
			m.NextDeadline()
		}
	})
}
