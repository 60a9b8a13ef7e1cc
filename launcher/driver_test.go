package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// readEvents reads an --events record with events.ReadAll, the schema's
// own reader: a line it does not read fails the test.
func readEvents(t *testing.T, s string) []events.Record {
	t.Helper()
	recs, err := events.ReadAll(strings.NewReader(s))
	if err != nil {
		t.Fatalf("reading --events: %v\n%s", err, s)
	}
	return recs
}

// firstOf returns the body of the first record of kind E in recs; there
// being none fails the test.
func firstOf[E events.Event](t *testing.T, recs []events.Record) E {
	t.Helper()
	for _, r := range recs {
		if e, ok := r.Event.(E); ok {
			return e
		}
	}
	var e E
	t.Fatalf("no %q record in --events: %+v", e.Kind(), recs)
	return e
}

// waitUntil polls cond until it holds; the limit only tells a hang.
func waitUntil(t *testing.T, r *run, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		select {
		case <-r.done:
			t.Fatalf("Run returned (%d, %v) before %s", r.code, r.err, what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 20 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startSpareJob runs two ranks on hosts 127.0.0.1 and 127.0.0.2 (one
// slot each) with spare 127.0.0.3, --recovery in-place and one replica,
// and returns once both ranks run and the spare has registered.
func startSpareJob(t *testing.T) (*run, *job, *syncBuffer) {
	t.Helper()
	events := &syncBuffer{}
	jobs := make(chan *job, 1)
	// The agents of the three hosts are this process: an agent that ends
	// kills the processes of the job re-parented to it (by GORUN_JOB_ID in
	// their environment), every host's ranks here. The ranks drop the
	// variable so that only their own agent ends them.
	r := startRun(t, 2, `echo "up $GORUN_RANK gen $GORUN_RESTART_COUNT"; exec env -u GORUN_JOB_ID sleep 600`, func(c *Config) {
		c.Hosts = []topology.Host{{Name: "127.0.0.1", Slots: 1}, {Name: "127.0.0.2", Slots: 1}, {Name: "127.0.0.3", Slots: 1, Spare: true}}
		c.Events = events
		c.Replicas = 1
		c.Recovery = hotswap.RecoveryInPlace
		c.KillGrace = time.Second
		// The agent of this branch does not start ranks placed on a
		// spare: the stop gives up on them after the heartbeat timeout.
		c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, time.Second
		c.running = func(j *job) { jobs <- j }
	})
	j := <-jobs
	r.waitLines(regexp.MustCompile(`(?m)^\[\d\] up \d gen 0$`), 2)

	// The spare registers and stays idle: in the table, without ranks.
	waitUntil(t, r, "registered spare in the table", func() bool {
		tab := j.rv.Table()
		return tab != nil && tab.Hosts[2].Addr != ""
	})
	if tab := j.rv.Table(); !tab.Hosts[2].Spare || tab.Hosts[2].Ranks.Len() != 0 || tab.Epoch != 0 {
		t.Fatalf("epoch %d, spare's entry %+v: want epoch 0 and an idle spare", tab.Epoch, tab.Hosts[2])
	}

	return r, j, events
}

// TestDriverSplicesLostHostOntoSpare: a spare's agent starts with the job
// and registers idle (a Spare host of the table, without ranks). When a
// host with ranks is lost, the launcher fences it, moves its ranks onto
// the spare in its own tables and publishes a new epoch placing them on
// the spare, with the restore plan of the rank whose own slot went with
// its host; --events records each of these. (--recovery in-place: the
// survivors keep running. What the agents do with the table is theirs:
// the agent of this branch cannot start ranks on a spare, so the test
// stops at the table.)
func TestDriverSplicesLostHostOntoSpare(t *testing.T) {
	r, j, evs := startSpareJob(t)

	// Both ranks protected step 5 (as their hosts' agents report it):
	// rank 1's optimizer shard has a copy on rank 0's host.
	for h := range 2 {
		j.progress <- &wire.UpProgress{Host: h, Ranks: []wire.RankProgress{{Rank: h, Committed: 5, Replicated: 5}}}
	}
	waitUntil(t, r, "G = 5", func() bool { return j.prog.G() == 5 })

	// Host 1 (127.0.0.2, rank 1) is lost: its agent ends.
	j.killAgent(j.hosts[1])
	waitUntil(t, r, "published epoch in --events", func() bool { return strings.Contains(evs.String(), `"event":"publish"`) })

	tab := j.rv.Table()
	if tab.Epoch != 1 || tab.Gen != 0 || tab.G != 5 {
		t.Errorf("table: epoch %d gen %d G %d, want 1 0 5 (in place: the generation goes on)", tab.Epoch, tab.Gen, tab.G)
	}
	ranksOf := func(h int) []int {
		rs, err := tab.Hosts[h].Ranks.Expand(2)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	if !tab.Hosts[1].Fenced || len(ranksOf(1)) != 0 {
		t.Errorf("lost host's entry %+v: want fenced, without ranks", tab.Hosts[1])
	}
	if !slices.Equal(ranksOf(2), []int{1}) || tab.Hosts[2].Spare || !slices.Equal(ranksOf(0), []int{0}) {
		t.Errorf("ranks: host 0 %v, spare %v (spare flag %v), want [0] and [1] (no longer idle)", ranksOf(0), ranksOf(2), tab.Hosts[2].Spare)
	}
	if want := []wire.RestoreRow{{Rank: 1, Opt: 0, Params: 0}}; !slices.Equal(tab.Restore, want) {
		t.Errorf("restore rows %+v, want %+v", tab.Restore, want)
	}

	r.signals <- syscall.SIGTERM
	r.wait()
	if r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want %d (stopped by SIGTERM)", r.code, 128+int(syscall.SIGTERM))
	}
	if !strings.Contains(r.stderr.String(), "host 127.0.0.2 lost") || !strings.Contains(r.stderr.String(), "to spare 127.0.0.3") {
		t.Errorf("the swap was not reported:\n%s", r.stderr.String())
	}

	// The --events record, read back.
	recs := readEvents(t, evs.String())
	if e := firstOf[events.Fence](t, recs); e.Host != "127.0.0.2" {
		t.Errorf("fence %+v, want host 127.0.0.2", e)
	}
	if e := firstOf[events.Splice](t, recs); e.Lost != "127.0.0.2" || e.With != "127.0.0.3" || !e.Spare || !slices.Equal(e.Ranks, []int{1}) || e.Epoch != 1 {
		t.Errorf("splice %+v, want rank 1 from 127.0.0.2 to spare 127.0.0.3 in epoch 1", e)
	}
	if e := firstOf[events.Publish](t, recs); e.Epoch != 1 || e.Gen != 0 || e.G != 5 || e.Restore != 1 {
		t.Errorf("publish %+v, want epoch 1 gen 0 G 5 with 1 restore row", e)
	}
	for _, rec := range recs {
		if e, ok := rec.Event.(events.Restart); ok {
			t.Errorf("a restart in place: %+v", e)
		}
	}
	checkRecordOrder(t, evs.String(), "launch", "rendezvous", "failure", "fence", "splice", "publish", "exit")
}

// TestDriverRefusesInPlaceWithoutRankClient: --recovery in-place keeps the
// survivors running, which takes gorun's rank client; a program that
// never reported progress through it is refused at the first recovery,
// with a report, rather than left with survivors that cannot join.
func TestDriverRefusesInPlaceWithoutRankClient(t *testing.T) {
	r, j, evs := startSpareJob(t)
	j.killAgent(j.hosts[1])
	r.wait()
	if r.code != ExitFailure {
		t.Errorf("exit %d, want %d", r.code, ExitFailure)
	}
	if want := "--recovery in-place: the program never opened gorun's rank socket"; !strings.Contains(r.stderr.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, r.stderr.String())
	}
	for _, rec := range readEvents(t, evs.String()) {
		if e, ok := rec.Event.(events.Publish); ok {
			t.Errorf("an epoch was published: %+v", e)
		}
	}
}

// TestHeartbeatsRateLimited: every heartbeat refreshes the host's last
// contact, but the loop (and the machine) hears of a host at most once
// per half heartbeat interval, and not at all once it is fenced.
func TestHeartbeatsRateLimited(t *testing.T) {
	j := &job{beats: make(chan int, 16), quit: make(chan struct{})}
	j.cfg.HeartbeatInterval = time.Hour
	a, b := &hostAgent{index: 0}, &hostAgent{index: 1}
	for range 5 {
		j.heard(a)
		j.heard(b)
	}
	if got := len(j.beats); got != 2 {
		t.Errorf("%d heartbeats passed on for 10 received from 2 hosts within half an interval, want 2", got)
	}
	if a.lastSeen.Load() == 0 || b.lastSeen.Load() == 0 {
		t.Error("last contact not recorded")
	}
	// Half an interval later, the next one is passed on.
	a.beatSent.Add(-int64(time.Hour / 2))
	j.heard(a)
	if got := len(j.beats); got != 3 {
		t.Errorf("%d heartbeats passed on after half an interval, want 3", got)
	}
	// A probed host's answer goes on at once, rate or not.
	a.probed.Store(true)
	j.heard(a)
	if got := len(j.beats); got != 4 {
		t.Errorf("%d heartbeats passed on after a probe's answer, want 4", got)
	}
	j.heard(a)
	if got := len(j.beats); got != 4 {
		t.Errorf("%d heartbeats passed on after the probe was answered, want still 4", got)
	}
	b.fenced.Store(true)
	b.beatSent.Store(0)
	j.heard(b)
	if got := len(j.beats); got != 4 {
		t.Errorf("a fenced host's heartbeat was passed on (%d)", got)
	}
}

// TestSpareThatCannotStart: a spare whose agent cannot start is reported
// and not counted; the job runs on the other hosts.
func TestSpareThatCannotStart(t *testing.T) {
	// The rank runs until the test saw the report: a job that ended
	// first would have nothing to report.
	goOn := filepath.Join(t.TempDir(), "go-on")
	r := startRun(t, 1, `while [ ! -e `+goOn+` ]; do sleep 0.01; done; echo "ran $GORUN_RANK"`, func(c *Config) {
		c.Hosts = []topology.Host{{Name: "127.0.0.1", Slots: 1}, {Name: "spare.invalid", Slots: 1}}
		c.Spares = 1
		c.Bind = "127.0.0.1"
		c.Rsh = []string{"false"} // the spare's agent exits at once
	})
	want := "cannot start agent on spare host spare.invalid"
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(r.stderr.String(), want) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.WriteFile(goOn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r.wait()
	if r.code != 0 || !strings.Contains(r.stdout.String(), "[0] ran 0") {
		t.Errorf("exit %d, stdout %q: want 0 and the rank's line", r.code, r.stdout.String())
	}
	if !strings.Contains(r.stderr.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, r.stderr.String())
	}
}

// TestRestoreRows: the restore plan's sources become the epoch table's
// rows: none for a rank restoring from its own slot, the copy's rank for
// one restoring from a clear copy or replica, and Decode for one rebuilt
// from its erasure-coding stripe, whose row passes the table's checks.
func TestRestoreRows(t *testing.T) {
	sources := []hotswap.Source{
		{Rank: 0, Local: true, OptRank: 0, OptHost: 0, ParamsRank: 0, ParamsHost: 0},
		{Rank: 1, OptRank: 0, OptHost: 0, ParamsRank: 3, ParamsHost: 3},
		{Rank: 2, Decode: true, OptRank: -1, OptHost: -1, ParamsRank: 3, ParamsHost: 3},
		{Rank: 3, Local: true, OptRank: 3, OptHost: 3, ParamsRank: 3, ParamsHost: 3},
	}
	rows := restoreRows(sources)
	want := []wire.RestoreRow{{Rank: 1, Opt: 0, Params: 3}, {Rank: 2, Opt: 2, Params: 3, Decode: true}}
	if !slices.Equal(rows, want) {
		t.Fatalf("rows %+v, want %+v", rows, want)
	}
	var hosts []wire.TableHost
	for i, n := range []string{"a", "b", "c", "d"} {
		hosts = append(hosts, wire.TableHost{Name: n, Addr: fmt.Sprintf("127.0.0.%d", i+1), Ranks: wire.CompressRanks([]int{i})})
	}
	tab := wire.EpochTable{Version: wire.Version, Job: NewJobID(), World: 4, G: 5, Restore: rows, Hosts: hosts,
		EC: &wire.ECTable{K: 2, M: 2, Groups: []wire.ECGroupRow{{Hosts: []int{0, 1, 2, 3}, Data: []int{0, 2}, Parity: []int{1, 3}, DataGroups: [][]int{{0, 1}, {2, 3}}}}}}
	if err := tab.Validate(); err != nil {
		t.Fatalf("the table refuses the rows: %v", err)
	}
}
