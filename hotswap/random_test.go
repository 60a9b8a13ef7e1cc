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
	switch rng.IntN(16) {
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
	}
	return Tick{}
}

// TestRandomEvents: random event sequences never panic, epochs only grow,
// and every published epoch satisfies I1–I4, or the machine aborted with a
// report (and publishes nothing after).
func TestRandomEvents(t *testing.T) {
	runs, steps := 400, 300
	if testing.Short() {
		runs = 50
	}
	published, ecRuns := 0, 0
	for seed := range runs {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		c, ok := randomConfig(rng)
		if !ok {
			continue
		}
		m, err := New(c)
		if err != nil {
			t.Fatalf("seed %d: New: %v", seed, err)
		}
		if c.EC != nil {
			ecRuns++
		}
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
		for i := range steps {
			now += time.Duration(rng.IntN(2000)) * time.Millisecond
			e := randomEvent(rng, &c, m)
			if p, ok := e.(Progress); ok && m.rank(p.Rank) {
				committed[p.Rank] = max(committed[p.Rank], p.Step)
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
					// Code 0 only for MPI_Abort(comm, 0), as under Hydra.
					if a.Code == 0 && !strings.Contains(a.Msg, "MPI_Abort with exit code 0") || a.Msg == "" {
						t.Fatalf("%s: abort without code or report: %v", where, a)
					}
				case Restart:
					if aborted {
						t.Fatalf("%s: restart after an abort", where)
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
	t.Logf("%d epochs published, %d runs with erasure coding", published, ecRuns)
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
