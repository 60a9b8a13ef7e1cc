package jobstatus

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files in testdata")

func itoa(i int) string { return strconv.Itoa(i) }

func TestCompact(t *testing.T) {
	for _, tt := range []struct {
		in   []int
		want string
	}{
		{nil, ""}, {[]int{3}, "3"}, {[]int{0, 1, 2, 3}, "0-3"}, {[]int{0, 1, 3, 5, 6}, "0-1,3,5-6"}, {[]int{0, 2, 4}, "0,2,4"},
	} {
		if got := Compact(tt.in); got != tt.want {
			t.Errorf("Compact(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// sample is a job of 3 hosts and a spare, after one host loss.
func sample() *Snapshot {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	return &Snapshot{
		Version: Version, Job: "abc123", PID: 4242, Prog: "dptrain", Args: []string{"--steps", "100"},
		Start: t0, Now: t0.Add(95 * time.Second), State: "running", NP: 6, Epoch: 1, Gen: 0, G: 41, D: ptr(int64(40)),
		Redundancy: "replicas:1", Protect: "full", Recovery: "in-place", MetricsURL: "http://127.0.0.1:9400/metrics",
		Hosts: []Host{
			{Name: "h1", Addr: "10.0.0.1", State: HostRunning, Ranks: "0-1", NRanks: 2, Committed: &Range{42, 43}, Replicated: &Range{41, 42}, Durable: &Range{40, 40}},
			{Name: "h2", Addr: "10.0.0.2", State: HostLost},
			{Name: "h3", Addr: "10.0.0.3", State: HostRunning, Ranks: "4-5", NRanks: 2, Committed: &Range{43, 43}, Replicated: &Range{42, 42}, Durable: &Range{40, 40}},
			{Name: "s1", Addr: "10.0.0.4", State: HostRunning, Ranks: "2-3", NRanks: 2, Committed: &Range{42, 42}, Replicated: &Range{41, 41}, Durable: &Range{-1, -1}},
			{Name: "s2", State: HostSpare},
		},
		Spares: []string{"s2"},
		Failures: []Failure{{Epoch: 1, At: t0.Add(30 * time.Second), Class: "host-loss", Decision: "splice", Why: "its agent's control connection closed",
			Cause: "host h2 lost: its agent's control connection closed", Host: "h2", Rank: -1, With: "s1", Ranks: "2-3", Spare: true, RecoverySeconds: ptr(1.234), Done: true}},
		Ranks: []Rank{{0, "h1", 42, 41, 40, 0.5}, {1, "h1", 43, 42, 40, 0.25}},
	}
}

// failures is sample with one failure of each kind and state: a hang
// restarted (superseded by a rank exit), the rank exit restarted, a GPU
// fault splicing its host onto a host with free slots (under way), a lost
// spare (nothing to recover) and a host loss waiting for a suspected host.
func failures() *Snapshot {
	s := sample()
	s.State, s.Epoch, s.Gen = "recovering", 3, 2
	t0 := s.Start
	s.Failures = []Failure{
		{Epoch: 1, At: t0.Add(10 * time.Second), Class: "hang", Decision: "restart", Why: "rank 4 on host h3 made no progress for 30s (hang timeout 30s)",
			Cause: "rank 4 on host h3 made no progress for 30s (hang timeout 30s)", Host: "h3", Rank: 4, Done: true, Superseded: true},
		{Epoch: 2, At: t0.Add(12 * time.Second), Class: "rank-exit", Decision: "restart", Why: "rank 1 on host h1 (pid 12) exited with code 3",
			Cause: "rank 1 on host h1 (pid 12) exited with code 3", Host: "h1", Rank: 1, RecoverySeconds: ptr(2.5), Done: true},
		{Epoch: 3, At: t0.Add(40 * time.Second), Class: "gpu-permanent", Decision: "splice", Why: "GPU 0 permanent fault: xid 79", Host: "h3", Rank: -1,
			With: "h1", Ranks: "4-5"},
		{At: t0.Add(50 * time.Second), Class: "host-loss", Decision: "none", Why: "its agent exited: signal: killed", Host: "s2", Rank: -1, Done: true},
		{At: t0.Add(60 * time.Second), Class: "host-loss", Decision: "wait", Why: "no heartbeat for 3s", Host: "s1", Rank: -1},
	}
	return s
}

// aborted is failures' job after the suspected host did not answer: the
// loss that waited for it ended with the abort.
func aborted() *Snapshot {
	s := failures()
	s.State = "stopping"
	s.Failures[4].Done = true
	s.Failures = append(s.Failures, Failure{At: s.Start.Add(61 * time.Second), Class: "host-loss", Decision: "abort",
		Why: "suspected at 1m0s (rank 0 lost its peer rank 4), not heard from for 1s", Host: "h1", Rank: -1, Done: true})
	return s
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *rewrite {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -rewrite to update):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func TestRender(t *testing.T) {
	for _, tt := range []struct {
		name  string
		s     *Snapshot
		ranks bool
	}{
		{"hostloss.txt", sample(), false},
		{"hostloss-ranks.txt", sample(), true},
		{"failures.txt", failures(), false},
		{"aborted.txt", aborted(), false},
		{"starting.txt", &Snapshot{Job: "j0", State: "starting", Prog: "true", NP: 1, G: -1, Redundancy: "replicas:0", Protect: "full", Recovery: "restart",
			Start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Now: time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC),
			Hosts: []Host{{Name: "localhost", State: HostRunning, Ranks: "0", NRanks: 1}}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := Render(&b, tt.s, tt.ranks); err != nil {
				t.Fatal(err)
			}
			golden(t, tt.name, b.Bytes())
		})
	}
}

// TestSnapshotJSON: the JSON form has the documented field names, and
// decodes back to the same snapshot.
func TestSnapshotJSON(t *testing.T) {
	s := sample()
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "hostloss.json", append(b, '\n'))
	var back Snapshot
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.MarshalIndent(&back, "", "  ")
	if !bytes.Equal(b, b2) {
		t.Errorf("round trip differs:\n%s\n%s", b, b2)
	}
}

// TestCheckVersion: gorun status checks the snapshot's version, as
// events.CheckSchema checks the events file's: a newer one than this
// client knows, or none, is an error wrapping ErrVersion (the client
// warns); before, nothing read "version".
func TestCheckVersion(t *testing.T) {
	for _, tt := range []struct {
		version int
		ok      bool
	}{{Version, true}, {Version + 1, false}, {0, false}} {
		err := CheckVersion(&Snapshot{Version: tt.version})
		if tt.ok != (err == nil) || !tt.ok && !errors.Is(err, ErrVersion) {
			t.Errorf("CheckVersion(version %d) = %v; want ok %v, or ErrVersion", tt.version, err, tt.ok)
		}
	}
	if Version != 1 {
		t.Errorf("Version = %d: version 1 is the first released form (doc: # Versions)", Version)
	}
}
