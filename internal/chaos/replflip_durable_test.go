package chaos

import (
	"fmt"
	"strings"
	"testing"
)

// TestReplicaFlipPromiseDurable: a lost host's rank whose only copies
// left are flipped is within the promise when --ckpt-dir had a version
// committed at injection (the job rolls back to it), and beyond it
// without --ckpt-dir or with nothing committed yet.
func TestReplicaFlipPromiseDurable(t *testing.T) {
	names := []string{"h0", "h1", "h2", "h3"}
	base := Config{Workload: Dptrain, Hosts: 3, Spares: 1, RanksPerHost: 1, Redundancy: "replicas:1", Protect: "full"}
	withDisk := base
	withDisk.Durable = true
	for _, tc := range []struct {
		name       string
		c          Config
		committed  bool
		wantWithin bool
	}{
		{"no --ckpt-dir", base, false, false},
		{"--ckpt-dir, nothing committed", withDisk, false, false},
		{"--ckpt-dir, a version committed", withDisk, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Precheck(tc.c, names)
			if p.Err != nil {
				t.Fatal(p.Err)
			}
			f := replicaOwner(Fault{Kind: ReplicaFlip, Host: 0, Host2: -1, Rank: -1}, p)
			var lines []string
			for r, h := range p.HostOf {
				if h == f.Host2 {
					lines = append(lines, fmt.Sprintf("flipped %d %d 7 optimizer", f.Host, r))
				}
			}
			if !flippedEvery(append(lines, fmt.Sprintf("done %d %d", f.Host, len(lines))), f, p) {
				t.Fatalf("the flip %q did not hit every rank of host %d", lines, f.Host2)
			}
			within, why := withinReplicaFlip(f, f.Lost(), p, tc.c, tc.committed, true)
			if within != tc.wantWithin {
				t.Fatalf("within = %v (%s), want %v", within, why, tc.wantWithin)
			}
			if !within && !strings.Contains(why, onlyFlipped) {
				t.Errorf("beyond the promise without saying the only copies were flipped (the oracle's replica-flip rules key on it): %s", why)
			}
		})
	}
}
