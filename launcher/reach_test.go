package launcher

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// The gathers of the hosts' reach on disk at the level of the job: a
// launcher with its three hosts' agents in this process (127.0.0.1 and
// 127.0.0.2 with a rank each, spare 127.0.0.3) whose reads of the
// checkpoint directory are injected (agent.Config.ReadReach): one that
// hangs is a host that never answers.

const reachScript = `echo "up $GORUN_RANK"; exec env -u GORUN_JOB_ID sleep 600`

// reachRead is what host h's agent reads as its ranks' reach.
type reachRead func(ctx context.Context, host int, dir string, ranks []int) *wire.ResumeReach

// hangingRead returns a read that never returns before the test ends
// (it ignores ctx, as a read stuck in the kernel does), and a channel
// closed once it has begun.
func hangingRead(t *testing.T) (reachRead, <-chan struct{}) {
	started, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	return func(ctx context.Context, host int, dir string, ranks []int) *wire.ResumeReach {
		close(started)
		<-release
		return nil
	}, started
}

// answeringRead answers at once that every rank reaches step base.
func answeringRead(base int64) reachRead {
	return func(ctx context.Context, host int, dir string, ranks []int) *wire.ResumeReach {
		r := &wire.ResumeReach{Host: host, Base: base, Ranks: []wire.ResumeRank{}}
		for _, k := range ranks {
			r.Ranks = append(r.Ranks, wire.ResumeRank{Rank: k, To: base})
		}
		return r
	}
}

// startReachJob runs reachScript as two ranks with a durable tier in
// dir, host h's reads being reads[h], and returns once its agents are
// being started.
func startReachJob(t *testing.T, dir string, resume bool, reachTimeout time.Duration, reads [3]reachRead) (*run, *job) {
	t.Helper()
	jobs := make(chan *job, 1)
	r := startRun(t, 2, reachScript, func(c *Config) {
		c.Hosts = []topology.Host{{Name: "127.0.0.1", Slots: 1}, {Name: "127.0.0.2", Slots: 1}, {Name: "127.0.0.3", Slots: 1, Spare: true}}
		c.Durable = DurableOptions{Dir: dir, Every: 2, Resume: resume}
		c.ReachTimeout = reachTimeout
		c.KillGrace = time.Second
		c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, time.Second
		c.running = func(j *job) { jobs <- j }
		c.agentConfig = func(ac *agent.Config) { ac.ReadReach = reads[ac.Host] }
	})
	return r, <-jobs
}

// resumableDir returns a checkpoint directory holding reachScript's job
// of two ranks with a commit record at step 4.
func resumableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	regions := [][]durable.Region{{{Name: "optimizer", Size: 4096}}, {{Name: "optimizer", Size: 4096}}}
	m := &durable.Manifest{Job: "earlier", World: 2, Regions: regions, Protect: "full", Every: 2,
		Command: commandHash("sh", []string{"-c", reachScript})}
	if err := durable.CreateManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	if err := durable.Commit(dir, 4); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stopped waits for Run's end and returns the line gorun reported the
// stop with (the first "gorun: " line of stderr that has want).
func stopped(t *testing.T, r *run, want string) string {
	t.Helper()
	r.wait()
	if r.code == 0 {
		t.Fatalf("exit code 0; stderr:\n%s", r.stderr.String())
	}
	for l := range strings.Lines(r.stderr.String()) {
		if strings.Contains(l, want) {
			return l
		}
	}
	t.Fatalf("no report with %q; stderr:\n%s", want, r.stderr.String())
	return ""
}

// TestRollbackReachTimeout: a roll-back whose hosts never report their
// ranks' reach on disk stops the job once Config.ReachTimeout has passed
// since the OpReach, naming them (the survivor and the spare that took
// the lost host's rank), and the agents exit although their reads still
// hang. Without the loop's reachTick the job waits for ever (Run does
// not return).
func TestRollbackReachTimeout(t *testing.T) {
	dir := t.TempDir()
	read0, started0 := hangingRead(t)
	read2, started2 := hangingRead(t)
	r, j := startReachJob(t, dir, false, 500*time.Millisecond, [3]reachRead{read0, nil, read2})
	r.waitLines(regexp.MustCompile(`(?m)^\[\d\] up \d$`), 2)

	// Both ranks commit step 2 and its durable version (markers 0, 2):
	// the launcher writes the commit record, and G is 2. No replicas:
	// a lost host's rank is in no memory tier.
	regions := []wire.DurableRegion{{Name: "optimizer", Size: 4096}}
	for h := range 2 {
		j.progress <- &wire.UpProgress{Host: h, Ranks: []wire.RankProgress{{Rank: h, Committed: 2, Replicated: 2,
			D: &wire.RankDurable{Markers: []int64{0, 2}, Resolved: 2, Regions: regions}}}}
	}
	waitUntil(t, r, "the commit record at step 2", func() bool {
		s, err := durable.ReadCommitted(dir)
		return err == nil && s == 2
	})

	j.killAgent(j.hosts[1])
	<-started0
	<-started2
	line := stopped(t, r, "cannot roll back")
	for _, w := range []string{
		"host 127.0.0.2 lost",
		"rank 1's state at step 2 is lost with host 127.0.0.2",
		"and the job cannot roll back to --ckpt-dir: hosts 127.0.0.1, 127.0.0.3: no report of the ranks' reach on disk within 500ms; stopping the job",
	} {
		if !strings.Contains(line, w) {
			t.Errorf("the stop %q does not say %q", line, w)
		}
	}
}

// TestResumeReachTimeout: --resume's hosts never report their ranks'
// reach: the job stops once Config.ReachTimeout has passed since the
// first epoch table, naming them, and the agents exit although their
// reads still hang.
func TestResumeReachTimeout(t *testing.T) {
	read0, started0 := hangingRead(t)
	read1, started1 := hangingRead(t)
	r, _ := startReachJob(t, resumableDir(t), true, 500*time.Millisecond, [3]reachRead{read0, read1, nil})
	<-started0
	<-started1
	line := stopped(t, r, "--resume")
	if w := "--resume: hosts 127.0.0.1, 127.0.0.2: no report of the ranks' reach on disk within 500ms; stopping the job"; !strings.Contains(line, w) {
		t.Errorf("the stop %q does not say %q", line, w)
	}
}

// TestResumeHostLost: a host with ranks lost while --resume waits stops
// the job, naming it, whether it had reported its ranks' reach (before,
// the machine moved its ranks and the survivors' agents stopped the job
// with "epoch 1 came before the ranks' states were rebuilt; not
// supported", which named no host) or not (fence → lostHost). The limit
// (10 minutes) plays no part.
func TestResumeHostLost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answers  int // the host that answers at once (the other's read hangs)
		lose     int
		want     string
		reported bool // wait for the launcher to take the answer first
	}{
		{"silent host", 0, 1, "--resume: host 127.0.0.2 was lost before it reported its ranks' reach on disk; stopping the job", false},
		{"host that reported", 0, 0, "--resume: host 127.0.0.1 was lost before the ranks' states were rebuilt from the checkpoint directory", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reads [3]reachRead
			hang, started := hangingRead(t)
			reads[tc.answers], reads[1-tc.answers] = answeringRead(4), hang
			r, j := startReachJob(t, resumableDir(t), true, 0, reads)
			<-started
			if tc.reported {
				waitUntil(t, r, "the launcher took host 0's reach", func() bool {
					return strings.Contains(r.log.String(), `msg="a host's reach on disk" host=0`)
				})
			}
			j.killAgent(j.hosts[tc.lose])
			line := stopped(t, r, "--resume")
			if !strings.Contains(line, tc.want) {
				t.Errorf("the stop %q does not say %q", line, tc.want)
			}
			if strings.Contains(r.stderr.String(), "not supported") {
				t.Errorf("an agent stopped the job on a new epoch:\n%s", r.stderr.String())
			}
		})
	}
}
