package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestReplicaFlipPromise: replica-flip's lost host is one whose ranks'
// replicas the flipped holder keeps (by the launcher's placement), the
// agent's lines say whether the flip hit every such rank, and the
// promise holds only where another holder, on neither host, keeps a copy
// of every rank of the lost host.
func TestReplicaFlipPromise(t *testing.T) {
	names := []string{"h0", "h1", "h2", "h3", "h4", "h5"}
	for _, tc := range []struct {
		name       string
		c          Config
		holder     int
		lines      []string // the agent's, of the holder
		busy       bool     // the agent names the lost host's ranks busy
		wantHit    bool
		wantWithin bool
		half       bool // busy, and also flipped (one buffer flipped, the other pinned by a get)
	}{
		{"replicas:1, the only copy flipped", Config{Workload: Dptrain, Hosts: 3, Spares: 1, RanksPerHost: 1, Redundancy: "replicas:1", Protect: "full"},
			0, nil, false, true, false, false},
		{"replicas:1, the owner's replica busy", Config{Workload: Dptrain, Hosts: 3, Spares: 1, RanksPerHost: 1, Redundancy: "replicas:1", Protect: "full"},
			0, nil, true, false, true, false},
		{"replicas:1, one buffer flipped, the other busy", Config{Workload: Dptrain, Hosts: 3, Spares: 1, RanksPerHost: 1, Redundancy: "replicas:1", Protect: "full"},
			0, nil, true, false, true, true},
		{"replicas:2, a good copy left", Config{Workload: Dptrain, Hosts: 3, Spares: 1, RanksPerHost: 1, Redundancy: "replicas:2", Protect: "full"},
			0, nil, false, true, true, false},
		{"replicas:2, no spare", Config{Workload: Dptrain, Hosts: 3, RanksPerHost: 1, Redundancy: "replicas:2", Protect: "full"},
			0, nil, false, true, false, false},
		{"replicas:1, nothing of the owner flipped", Config{Workload: Dptrain, Hosts: 3, Spares: 1, RanksPerHost: 1, Redundancy: "replicas:1", Protect: "full"},
			0, []string{"done 0 0"}, false, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !replicaFlipApplies(tc.c) {
				t.Fatalf("replica-flip does not apply to %s", tc.c.Key())
			}
			p := Precheck(tc.c, names)
			if p.Err != nil {
				t.Fatal(p.Err)
			}
			f := replicaOwner(Fault{Kind: ReplicaFlip, Host: tc.holder, Host2: -1, Rank: -1}, p)
			if f.Host2 < 0 || f.Host2 == f.Host {
				t.Fatalf("replicaOwner gave lost host %d for holder %d (holders %v)", f.Host2, f.Host, p.Holders)
			}
			lines := tc.lines
			if lines == nil {
				for r, h := range p.HostOf {
					switch {
					case h != f.Host2:
					case tc.busy:
						if tc.half {
							lines = append(lines, fmt.Sprintf("flipped %d %d 7 optimizer", f.Host, r))
						}
						lines = append(lines, fmt.Sprintf("busy %d %d", f.Host, r))
					default:
						lines = append(lines, fmt.Sprintf("flipped %d %d 7 optimizer", f.Host, r))
					}
				}
				lines = append(lines, fmt.Sprintf("done %d %d", f.Host, len(lines)))
			}
			hit := flippedEvery(lines, f, p)
			if hit != tc.wantHit {
				t.Errorf("flippedEvery(%q) = %v, want %v", lines, hit, tc.wantHit)
			}
			within, why := withinReplicaFlip(f, f.Lost(), p, tc.c, false, hit)
			if within != tc.wantWithin {
				t.Errorf("within = %v (%s), want %v (holders %v)", within, why, tc.wantWithin, p.Holders)
			}
		})
	}
	for _, c := range []Config{
		{Workload: Dptrain, Redundancy: "replicas:1", Protect: "diff"},
		{Workload: Dptrain, Redundancy: "ec:2+1", Protect: "full"},
		{Workload: Dptrain, Redundancy: "replicas:0", Protect: "full"},
		{Workload: MPICH, Redundancy: "replicas:1", Protect: "full"},
	} {
		if Applies(ReplicaFlip, c) {
			t.Errorf("replica-flip applies to %s/%s/%s: its replicas are not whole buffers", c.Workload, c.Redundancy, c.Protect)
		}
	}
}

// TestAwaitFlip: the wait for the holder's agent's lines ends on its
// "done" (or "refused") line, with ErrJobEnded once the job ended (not a
// spin to the deadline and an injection error), and with ErrNotLanded
// when no such line came in time.
func TestAwaitFlip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    string // the flip file's content ("" none)
		ended   bool   // the job has ended
		want    error
		wantLen int
	}{
		{"done", "flipped 0 2 7 optimizer\ndone 0 1\n", false, nil, 2},
		{"refused", "refused 0: diff mode\n", false, nil, 1},
		{"another host's done", "done 1 0\n", true, ErrJobEnded, 1},
		{"job ended", "", true, ErrJobEnded, 0},
		{"no line in time", "busy 0 2\n", false, ErrNotLanded, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &Job{Hosts: []string{"h0", "h1"}, Flips: filepath.Join(t.TempDir(), "flips"), done: make(chan struct{})}
			if tc.file != "" {
				if err := os.WriteFile(j.Flips, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.ended {
				close(j.done)
			}
			lines, err := awaitFlip(j, 0, 0, 0)
			if !errors.Is(err, tc.want) || tc.want == nil && err != nil {
				t.Errorf("awaitFlip: %v, want %v", err, tc.want)
			}
			if len(lines) != tc.wantLen {
				t.Errorf("awaitFlip's lines %q, want %d", lines, tc.wantLen)
			}
		})
	}
}
