package topology

import (
	"fmt"
	"testing"
	"time"
)

// benchHosts is the benchmark's cluster: hosts of 8 slots, 32 hosts to a
// rack, 8 to a switch.
func benchHosts(n int) []Host {
	hosts := make([]Host, n)
	for i := range hosts {
		hosts[i] = Host{Name: fmt.Sprintf("node%05d", i), Slots: 8, Rack: fmt.Sprintf("r%02d", i/32), Switch: fmt.Sprintf("s%03d", i/8)}
	}
	return hosts
}

// BenchmarkPlace: placement for 16,384 ranks on 2,048 hosts in 64 racks
// with K=2, as it runs inside every recovery (target: under 100 ms), for a
// data-parallel-only layout (one ring of 16,384) and TP=8 (eight rings of
// 2,048, one rank per host each), with both policies, and with skewed
// racks (half the hosts in one). The baseline, measured in the same run,
// is MapRanks on the same hosts: the least work a recovery does anyway.
//
//	go test -run '^$' -bench BenchmarkPlace ./topology/
func BenchmarkPlace(b *testing.B) {
	const np = 16384
	hosts := benchHosts(2048)
	mapStart := time.Now()
	var assign []Assignment
	const mapRuns = 20
	for range mapRuns {
		var err error
		if assign, err = MapRanks(hosts, MapOptions{NP: np}); err != nil {
			b.Fatal(err)
		}
	}
	mapTime := time.Since(mapStart) / mapRuns
	// Half the hosts in one rack, the rest over 63: racks run out of
	// room for the big rack's replicas (the worst case for the search).
	skewed := benchHosts(2048)
	for i := range skewed {
		if i < 1024 {
			skewed[i].Rack = "big"
		} else {
			skewed[i].Rack = fmt.Sprintf("r%02d", i%63)
		}
	}
	for _, tc := range []struct {
		name   string
		hosts  []Host
		tp     int
		policy Policy
	}{
		{"even", hosts, 1, CrossDomain},
		{"even", hosts, 8, CrossDomain},
		{"even", hosts, 1, SameDomain},
		{"even", hosts, 8, SameDomain},
		{"skewed", skewed, 1, CrossDomain},
	} {
		b.Run(fmt.Sprintf("racks=%s/tp=%d/%v", tc.name, tc.tp, tc.policy), func(b *testing.B) {
			l, err := NewLayout(np, tc.tp, 1)
			if err != nil {
				b.Fatal(err)
			}
			var p *Placement
			for b.Loop() {
				if p, err = Place(l, tc.hosts, assign, PlacementOptions{K: 2, Policy: tc.policy}); err != nil {
					b.Fatal(err)
				}
			}
			per := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(per)/float64(time.Millisecond), "ms/place")
			b.ReportMetric(float64(per)/float64(100*time.Millisecond), "×budget(100ms)")
			b.ReportMetric(float64(per)/float64(mapTime), "×MapRanks")
			b.ReportMetric(float64(p.Guarantee()), "guarantee-level")
		})
	}
}

// BenchmarkPlanEC: erasure-coding groups of 4 data + 2 parity hosts over
// 2,046 hosts of 8 ranks (16,368 ranks), beside MapRanks measured in the
// same run.
func BenchmarkPlanEC(b *testing.B) {
	hosts := benchHosts(2046)
	start := time.Now()
	assign, err := MapRanks(hosts, MapOptions{NP: 8 * 2046})
	if err != nil {
		b.Fatal(err)
	}
	mapTime := time.Since(start)
	for _, spread := range []bool{false, true} {
		b.Run(fmt.Sprintf("spread=%v", spread), func(b *testing.B) {
			for b.Loop() {
				if _, err := PlanEC(hosts, assign, ECOptions{K: 4, M: 2, Spread: spread}); err != nil {
					b.Fatal(err)
				}
			}
			per := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(per)/float64(time.Millisecond), "ms/plan")
			b.ReportMetric(float64(per)/float64(mapTime), "×MapRanks")
		})
	}
}
