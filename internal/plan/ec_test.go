package plan

import (
	"errors"
	"math"
	"testing"

	"github.com/gorun/gorun/topology"
)

// TestECWireTraffic pins the EC model to what gorun sends (protect/PROTOCOL.md
// "Erasure coding": each rank sends one share per parity row, each as long
// as its shard, to the row's host unless it is its own, and a clear copy to
// its data host unless it runs there; "Restore": a rank whose data host is
// lost is decoded from K shards). The figures are worked by hand from
// topology.PlanEC's layout.
func TestECWireTraffic(t *testing.T) {
	for _, c := range []struct {
		name                 string
		k, m, hosts, perHost int
		sent, recv           int     // shards, the most any host moves per step
		restore              float64 // shards into the spare, mean over the hosts
		restoreMax           int
	}{
		// one group h0..h1: data group {r0, r1} on data host h0, parity
		// row on h1. r0 sends its share to h1; r1 its clear copy to h0.
		// A lost h0 is decoded from K = 1 shard; h1's r1 from its copy.
		{"ec:1+1", 1, 1, 2, 1, 1, 1, 1, 1},
		// data groups {r0, r1} on h0 and {r2, r3} on h2; rows on h1, h3.
		// Each rank sends 2 shares (h1's and h3's ranks one share and a
		// clear copy); h1 receives the shares of r0, r2, r3. h0 and h2
		// decode from 2 shards, h1 and h3 restore their copy: mean 1.5.
		{"ec:2+2", 2, 2, 4, 1, 2, 3, 1.5, 2},
		// 12 ranks, data groups of 3: {r0,r1,r2}→h0, {r3,r4,r5}→h2,
		// {r6,r7,r8}→h3, {r9,r10,r11}→h5, rows on h1 and h4. Each host
		// sends 2 shards for each of its 2 ranks (h1: one share + a clear
		// copy each); h1 receives the shares of the 10 ranks not on it.
		// Restore: h0 2·4, h1 2·1, h2 2·4, h3 2·4, h4 2·1, h5 2·4: mean 6.
		{"ec:4+2, 2 ranks per host", 4, 2, 6, 2, 4, 10, 6, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := baseInputs()
			in.Hosts, in.RanksPerHost = c.hosts, c.perHost
			in.Redundancy = topology.Redundancy{ECK: c.k, ECM: c.m}
			g, err := ecGroup(in)
			if err != nil {
				t.Fatal(err)
			}
			f := Flows(g)
			if f.Sent != c.sent || f.Received != c.recv || f.Restore != c.restore || f.RestoreMax != c.restoreMax {
				t.Errorf("Flows = %+v, want sent %d, received %d, restore %v (max %d)", f, c.sent, c.recv, c.restore, c.restoreMax)
			}
			m := in.StateBytes
			near(t, "ProtectTime", ProtectTime(in), float64(c.perHost)*m/in.MemBW+float64(max(c.sent, c.recv))*m/in.NetBW, 1e-12)
			near(t, "restore", HostReplaceCost(in).Restore, c.restore*m/in.NetBW, 1e-12)
		})
	}
}

// TestECNotCheaperThanItSends is the reviewer's case: 1000 hosts of one
// 10 GiB rank, ec:2+2 must cost at least what replicas:2 sends per step,
// and its restore more than replicas:1's.
func TestECNotCheaperThanItSends(t *testing.T) {
	in := baseInputs()
	in.Hosts, in.RanksPerHost, in.StateBytes, in.NetBW, in.MemBW = 1000, 1, 10<<30, 25e9, 20e9
	r1, r2, ec := in, in, in
	r1.Redundancy = topology.Redundancy{Replicas: 1}
	r2.Redundancy = topology.Redundancy{Replicas: 2}
	ec.Redundancy = topology.Redundancy{ECK: 2, ECM: 2}
	if ProtectTime(ec) < ProtectTime(r2) {
		t.Errorf("ec:2+2 protects in %v s, less than replicas:2's %v s: it sends at least as much", ProtectTime(ec), ProtectTime(r2))
	}
	if a, b := HostReplaceCost(ec).Restore, HostReplaceCost(r1).Restore; !(a > b) {
		t.Errorf("ec:2+2 restores in %v s, not more than replicas:1's %v s: a data host's ranks are decoded from K shards", a, b)
	}
}

// TestValidateEC: the plan refuses what gorun run refuses (topology.PlanEC).
func TestValidateEC(t *testing.T) {
	for _, c := range []struct {
		name             string
		k, m, hosts, per int
		ok               bool
	}{
		{"whole groups", 2, 2, 8, 1, true},
		{"6 hosts, groups of 4", 2, 2, 6, 1, false},
		{"3 hosts, groups of 4", 2, 2, 3, 1, false},
		{"5 ranks not a multiple of K=3", 3, 2, 5, 1, false},
		{"10 ranks a multiple of K=3? no", 3, 2, 5, 2, false},
		{"15 ranks a multiple of K=3", 3, 2, 5, 3, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := baseInputs()
			in.Hosts, in.RanksPerHost = c.hosts, c.per
			in.Redundancy = topology.Redundancy{ECK: c.k, ECM: c.m}
			err := in.Validate()
			if c.ok != (err == nil) {
				t.Fatalf("Validate = %v, want ok %v", err, c.ok)
			}
			if err != nil && (!errors.Is(err, ErrInput) || !errors.Is(err, topology.ErrECGroups)) {
				t.Errorf("Validate = %v, want ErrInput wrapping topology.ErrECGroups", err)
			}
		})
	}
	in := baseInputs()
	in.Concurrency = 9
	if err := in.Validate(); err == nil {
		t.Errorf("Concurrency 9 passes; gorun run takes 1 to %d", MaxConcurrency)
	}
	if math.IsNaN(ProtectTime(in)) {
		t.Error("NaN")
	}
}
