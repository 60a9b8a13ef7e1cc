package launcher

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/wire"
)

func TestCheckResumeDir(t *testing.T) {
	regions := [][]durable.Region{{{Name: "optimizer", Size: 4096}}, {{Name: "optimizer", Size: 4096}}}
	job := &durable.Manifest{Job: "first", World: 2, Regions: regions, Protect: "diff", Codec: "raw", Every: 10, Command: "dptrain"}
	mk := func(t *testing.T, commit bool) string {
		dir := t.TempDir()
		if err := durable.CreateManifest(dir, job); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := durable.Commit(dir, 20); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	want := func(edit func(m *durable.Manifest)) *durable.Manifest {
		m := &durable.Manifest{World: 2, Protect: "diff", Codec: "raw", Every: 10, Command: "dptrain"}
		if edit != nil {
			edit(m)
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		dir    func(t *testing.T) string
		want   *durable.Manifest
		msg    string
		sentry error
	}{
		{"resumable", func(t *testing.T) string { return mk(t, true) }, want(nil), "", nil},
		{"missing directory", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none") }, want(nil), "does not exist", nil},
		{"not a directory", func(t *testing.T) string {
			d := mk(t, true)
			return filepath.Join(d, "MANIFEST")
		}, want(nil), "is not a directory", nil},
		{"no job", func(t *testing.T) string { return t.TempDir() }, want(nil), "holds no job", durable.ErrNoManifest},
		{"no commit record", func(t *testing.T) string { return mk(t, false) }, want(nil), "no committed version", durable.ErrNotCommitted},
		{"another world size", func(t *testing.T) string { return mk(t, true) }, want(func(m *durable.Manifest) { m.World = 4 }),
			"holds another job or layout: world size 4, the directory's job has 2", durable.ErrMismatch},
		{"another protect mode", func(t *testing.T) string { return mk(t, true) }, want(func(m *durable.Manifest) { m.Protect = "full" }),
			`protect mode "full"`, durable.ErrMismatch},
		{"another command", func(t *testing.T) string { return mk(t, true) }, want(func(m *durable.Manifest) { m.Command = "other" }),
			`command "other"`, durable.ErrMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step, err := checkResumeDir(tc.dir(t), tc.want)
			if tc.msg == "" {
				if err != nil || step != 20 {
					t.Fatalf("%d, %v; want 20", step, err)
				}
				return
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), "--resume: ") {
				t.Errorf("%v, want a ConfigError saying %q", err, tc.msg)
			}
			if tc.sentry != nil && !errors.Is(err, tc.sentry) {
				t.Errorf("%v does not wrap %v", err, tc.sentry)
			}
		})
	}
}

func TestResumeGather(t *testing.T) {
	hostRanks := [][]int{{0, 1}, {2, 3}, nil}
	reach := func(host int, tos ...int64) *wire.ResumeReach {
		r := &wire.ResumeReach{Host: host, Base: 10}
		for i, to := range tos {
			r.Ranks = append(r.Ranks, wire.ResumeRank{Rank: hostRanks[host][i], To: to})
		}
		return r
	}
	for _, tc := range []struct {
		name    string
		reports []*wire.ResumeReach
		t       int64
		msg     string
	}{
		{"the minimum", []*wire.ResumeReach{reach(1, 30, 25), reach(2), reach(0, 27, 40)}, 25, ""},
		{"full mode", []*wire.ResumeReach{reach(0, 10, 10), reach(1, 10, 10)}, 10, ""},
		{"a repeat does not count twice", []*wire.ResumeReach{reach(0, 11, 12), reach(0, 11, 12), reach(1, 13, 14)}, 11, ""},
		{"a rank without a base", []*wire.ResumeReach{reach(0, 11, 12), {Host: 1, Base: 10, Ranks: []wire.ResumeRank{{Rank: 2, To: 12}, {Rank: 3, To: -1, Err: "no complete version of the committed step 10"}}}},
			0, "rank 3 cannot be resumed: no complete version"},
		{"a host that cannot read", []*wire.ResumeReach{{Host: 0, Base: 10, Err: "permission denied"}}, 0, "host 0 cannot read the checkpoint directory: permission denied"},
		{"another base", []*wire.ResumeReach{{Host: 0, Base: 11, Ranks: []wire.ResumeRank{{Rank: 0, To: 11}, {Rank: 1, To: 11}}}}, 0, "committed step 11, the launcher 10"},
		{"another host's ranks", []*wire.ResumeReach{{Host: 0, Base: 10, Ranks: []wire.ResumeRank{{Rank: 2, To: 11}, {Rank: 1, To: 11}}}}, 0, "reported ranks [1 2], it runs [0 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newResumeGather(hostRanks, 4, 10)
			var plan *cascade.Plan
			var err error
			for _, r := range tc.reports {
				var p *cascade.Plan
				if p, err = g.add(r); err != nil {
					break
				}
				if p != nil {
					if plan != nil {
						t.Fatal("decided twice")
					}
					plan = p
				}
			}
			if tc.msg != "" {
				if err == nil || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("%v, want %q", err, tc.msg)
				}
				return
			}
			if err != nil || plan == nil || plan.T != tc.t || plan.Base != 10 {
				t.Fatalf("plan %+v, %v; want T %d", plan, err, tc.t)
			}
		})
	}
}

// TestReachGatherBounded: a host with ranks that never reports its
// ranks' reach on disk does not hold the job forever. A roll-back's
// gather asks the silent hosts again every heartbeat timeout, and once
// the limit has passed (and not before) the gather says which hosts did
// not report; a host that reported, a spare, a gather without a limit
// or one decided never do. A host lost while it was to report ends
// --resume's gather (lostHost). The clock is injected.
func TestReachGatherBounded(t *testing.T) {
	hostRanks := [][]int{{0, 1}, {2, 3}, nil}
	names := []string{"a", "b", "spare"}
	t0 := time.Unix(1000, 0)
	const limit, every = 10 * time.Second, 3 * time.Second
	reach := func(host int) *wire.ResumeReach {
		r := &wire.ResumeReach{Host: host, Base: 10, Epoch: 2}
		for _, k := range hostRanks[host] {
			r.Ranks = append(r.Ranks, wire.ResumeRank{Rank: k, To: 12})
		}
		return r
	}
	type tick struct {
		at     time.Duration // since t0
		resend bool
		err    string // "" none; else the error's text
	}
	for _, tc := range []struct {
		name    string
		reports []int // hosts that report, before the ticks
		limit   time.Duration
		ask     bool // a roll-back (sends OpReach again)
		ticks   []tick
	}{
		{"both silent", nil, limit, true, []tick{
			{1 * time.Second, false, ""},
			{3 * time.Second, true, ""},
			{4 * time.Second, false, ""},
			{6 * time.Second, true, ""},
			{9999 * time.Millisecond, true, ""},
			{10 * time.Second, false, "the roll-back: hosts a, b: no report of the ranks' reach on disk within 10s"},
		}},
		{"one silent", []int{0}, limit, true, []tick{
			{3 * time.Second, true, ""},
			{11 * time.Second, false, "the roll-back: host b: no report of the ranks' reach on disk within 10s"},
		}},
		{"the spare does not count", []int{2, 1}, limit, true, []tick{
			{11 * time.Second, false, "the roll-back: host a: no report"},
		}},
		{"every host reported", []int{1, 0}, limit, true, []tick{
			{3 * time.Second, false, ""},
			{time.Hour, false, ""},
		}},
		{"--resume sends nothing again", nil, limit, false, []tick{
			{3 * time.Second, false, ""},
			{10 * time.Second, false, "hosts a, b: no report"},
		}},
		{"no limit", nil, 0, true, []tick{
			{time.Hour, true, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newResumeGather(hostRanks, 4, 10)
			g.what, g.epoch, g.names, g.limit = "the roll-back", 2, names, tc.limit
			g.since, g.asked = t0, t0
			if tc.ask {
				g.ask = &wire.Control{Op: wire.OpReach, Epoch: 2, G: 10}
			}
			for _, h := range tc.reports {
				if _, err := g.add(reach(h)); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range tc.ticks {
				resend, err := g.tick(t0.Add(k.at), every)
				if resend != k.resend {
					t.Errorf("at %v: resend %v, want %v", k.at, resend, k.resend)
				}
				switch {
				case k.err == "" && err != nil:
					t.Fatalf("at %v: %v, want no error", k.at, err)
				case k.err != "" && (err == nil || !errors.Is(err, errReachOverdue) || !strings.Contains(err.Error(), k.err)):
					t.Fatalf("at %v: %v, want errReachOverdue with %q", k.at, err, k.err)
				}
			}
		})
	}
	t.Run("--resume's limit starts at the first table", func(t *testing.T) {
		g := newResumeGather(hostRanks, 4, 10)
		g.names, g.limit = names, limit
		for _, k := range []struct {
			at       time.Duration
			tableOut bool
			err      bool
		}{
			{time.Hour, false, false},    // the agents are still starting
			{2 * time.Hour, true, false}, // the table: the limit runs from here
			{2*time.Hour + limit - time.Millisecond, true, false},
			{2*time.Hour + limit, true, true},
		} {
			err := g.tickFromTable(t0.Add(k.at), k.tableOut)
			if (err != nil) != k.err || err != nil && !errors.Is(err, errReachOverdue) {
				t.Fatalf("at %v (table out: %v): %v, want an error: %v", k.at, k.tableOut, err, k.err)
			}
		}
	})
	t.Run("lost host", func(t *testing.T) {
		g := newResumeGather(hostRanks, 4, 10)
		g.names = names
		if _, err := g.add(&wire.ResumeReach{Host: 0, Base: 10, Ranks: []wire.ResumeRank{{Rank: 0, To: 10}, {Rank: 1, To: 10}}}); err != nil {
			t.Fatal(err)
		}
		for h, want := range []string{"", "--resume: host b was lost before it reported its ranks' reach on disk", ""} {
			err := g.lostHost(h)
			if got := fmt.Sprint(err); want == "" && err != nil || want != "" && got != want {
				t.Errorf("lostHost(%d) = %v, want %q", h, err, want)
			}
		}
	})
}

// TestReachTickStopping: once the job stops (the machine aborted while
// a roll-back's reach was gathered, say), reachTick drops the gathers: it
// neither sends OpReach again nor stops the job a second time. Before,
// j.reach was kept and the OpReach sent again every heartbeat timeout
// while the job stopped. (The job has no control plane: a broadcast or
// a step would panic.)
func TestReachTickStopping(t *testing.T) {
	t0 := time.Unix(1000, 0)
	g := newResumeGather([][]int{{0}, {1}}, 2, 10)
	g.what, g.epoch, g.limit = "the roll-back", 2, time.Minute
	g.since, g.asked = t0, t0
	g.ask = &wire.Control{Op: wire.OpReach, Epoch: 2, G: 10}
	r := newResumeGather([][]int{{0}, {1}}, 2, 10)
	r.since, r.limit = t0, time.Minute
	j := &job{reach: g, resume: r, stopping: true, cfg: Config{HeartbeatTimeout: time.Second}}
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("reachTick acted on a gather while the job stops: %v", p)
		}
	}()
	for _, at := range []time.Duration{2 * time.Second, time.Hour} {
		j.reachTick(t0.Add(at))
	}
	if j.reach != nil || j.resume != nil {
		t.Fatalf("the gathers are kept while the job stops: reach %v, resume %v", j.reach != nil, j.resume != nil)
	}
}
