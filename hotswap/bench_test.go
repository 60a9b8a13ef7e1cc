package hotswap

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// bigMachine is a job of hosts×8 ranks on hosts hosts with 8 slots, 8
// more hosts as spares, one replica per rank, spares registered.
func bigMachine(b *testing.B, hosts int) (*Machine, Config) {
	b.Helper()
	const slots, spares = 8, 8
	hs := make([]topology.Host, hosts+spares)
	for i := range hs {
		hs[i] = topology.Host{Name: fmt.Sprintf("n%04d", i), Slots: slots, Rack: fmt.Sprintf("r%d", i/32)}
	}
	c := Config{World: hosts * slots, Hosts: hs, Spares: spares, TP: 8, MaxRestarts: 3, HangTimeout: time.Minute}
	asg, err := topology.MapRanks(hs[:hosts], topology.MapOptions{NP: c.World})
	if err != nil {
		b.Fatal(err)
	}
	for _, a := range asg {
		c.Assign = append(c.Assign, a.Host)
	}
	l, _ := topology.NewLayout(c.World, 8, 1)
	p, err := topology.Place(l, hs[:hosts], asg, topology.PlacementOptions{K: 1})
	if err != nil {
		b.Fatal(err)
	}
	c.Holders = p.Holders
	m, err := New(c)
	if err != nil {
		b.Fatal(err)
	}
	for h := range hs {
		m.Step(0, AgentRegistered{Host: h, Spare: h >= hosts})
	}
	m.Step(0, GPublished{G: 10})
	return m, c
}

// BenchmarkHostLoss steps a job through host losses, one per iteration:
// the loss (hot-swap onto a spare, new epoch, restore plan, invariants),
// the recovery's end, the re-replication and the lost host's return as a
// spare: 4 events. The cost per event is reported against copying the
// rank → host table once, measured in the same run, at two sizes: the
// ratio stays flat when the work per event is O(hosts + ranks).
func BenchmarkHostLoss(b *testing.B) {
	for _, hosts := range []int{320, 1280} {
		b.Run(fmt.Sprintf("ranks=%d/hosts=%d", hosts*8, hosts), func(b *testing.B) {
			m, c := bigMachine(b, hosts)
			dst := make([]int, len(c.Assign))
			baseNs := timeCopy(dst, c.Assign)
			var now time.Duration
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				now += time.Second
				h := m.RankHost(i * 8 % c.World) // a host running ranks
				i++
				m.Step(now, AgentExited{Host: h, Why: "bench"})
				m.Step(now, RecoveryReport{Epoch: m.Epoch(), Stage: StageResumed})
				m.Step(now, Replicated{Owner: -1})
				m.Step(now, AgentRegistered{Host: h, Spare: true})
			}
			if m.Stopped() {
				b.Fatalf("the job stopped: %v", m.ExitCode())
			}
			perEvent := float64(b.Elapsed().Nanoseconds()) / float64(b.N) / 4
			ratio := perEvent / baseNs
			b.ReportMetric(perEvent, "ns/event")
			b.ReportMetric(ratio, "x-table-copy")
			b.Logf("%d ranks, %d hosts: %.0f ns per event = %.1f × copying the rank table (%.0f ns)", c.World, hosts, perEvent, ratio, baseNs)
		})
	}
}

// timeCopy is the baseline: nanoseconds to copy src into dst, averaged
// over at least 20 ms. (testing.Benchmark cannot run inside a benchmark.)
func timeCopy(dst, src []int) float64 {
	n := 0
	start := time.Now()
	for time.Since(start) < 20*time.Millisecond {
		for range 100 {
			copy(dst, src)
		}
		n += 100
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

// BenchmarkHeartbeat: the most frequent event, with the deadline the
// launcher schedules after it, is O(1): its cost per event is reported
// against working the deadline out afresh (O(hosts + ranks)), measured
// in the same run, at two sizes.
func BenchmarkHeartbeat(b *testing.B) {
	for _, hosts := range []int{320, 1280} {
		b.Run(fmt.Sprintf("ranks=%d/hosts=%d", hosts*8, hosts), func(b *testing.B) {
			m, c := bigMachine(b, hosts)
			m.Step(time.Second, Tick{})
			scan := 0
			start := time.Now()
			for time.Since(start) < 20*time.Millisecond {
				m.deadline()
				scan++
			}
			scanNs := float64(time.Since(start).Nanoseconds()) / float64(scan)
			now := time.Second
			h := 0
			for b.Loop() {
				now += time.Microsecond
				m.Step(now, Heartbeat{Host: h})
				m.NextDeadline()
				h = (h + 1) % len(c.Hosts) // the spares too: all stay alive
			}
			perEvent := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(perEvent, "ns/event")
			b.ReportMetric(perEvent/scanNs, "x-deadline-scan")
			b.Logf("%d hosts: %.0f ns per heartbeat and deadline = %.3f × working the deadline out afresh (%.0f ns)", hosts, perEvent, perEvent/scanNs, scanNs)
		})
	}
}
