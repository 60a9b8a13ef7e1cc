package launcher

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/wire"
)

// TestWithDefaultsDurable: the durable tier's settings get their
// defaults (diff batch only in diff mode) and an absolute directory.
func TestWithDefaultsDurable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		mode ProtectMode
		in   DurableOptions
		want DurableOptions
	}{
		{"none", "", DurableOptions{}, DurableOptions{}},
		{"defaults", "", DurableOptions{Dir: dir}, DurableOptions{Dir: dir, Every: 100, Overhead: 0.03}},
		{"diff defaults", ModeDiff, DurableOptions{Dir: dir}, DurableOptions{Dir: dir, Every: 100, Overhead: 0.03, DiffBatch: 5}},
		{"every setting", ModeDiff, DurableOptions{Dir: dir, Every: 7, Concurrency: 8, Overhead: 0.5, DiffBatch: 4096},
			DurableOptions{Dir: dir, Every: 7, Concurrency: 8, Overhead: 0.5, DiffBatch: 4096}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			c.ProtectMode, c.Durable = tc.mode, tc.in
			if tc.mode == ModeDiff {
				c.Replicas = 1
			}
			got, err := c.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if got.Durable != tc.want {
				t.Errorf("Durable %+v, want %+v", got.Durable, tc.want)
			}
		})
	}
	t.Run("relative directory", func(t *testing.T) {
		t.Chdir(dir)
		if err := os.Mkdir("ckpt", 0o700); err != nil {
			t.Fatal(err)
		}
		c := validConfig()
		c.Durable.Dir = "ckpt"
		got, err := c.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(dir, "ckpt"); got.Durable.Dir != want {
			t.Errorf("Dir %q, want %q", got.Durable.Dir, want)
		}
	})
}

// TestWithDefaultsDurableErrors: bad durable settings, and a directory
// that is missing, not one, not writable, or holds checkpoints a new job
// would overwrite, are ConfigErrors saying what and naming the
// directory; nothing in the directory changes.
func TestWithDefaultsDurableErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir() // another job's checkpoints
	m := &durable.Manifest{Job: "otherjob", World: 1, Regions: [][]durable.Region{{{Name: "optimizer", Size: 4096}}}, Protect: "full", Every: 10, Command: "x"}
	if err := durable.CreateManifest(other, m); err != nil {
		t.Fatal(err)
	}
	leftover := t.TempDir() // a rank's files without a manifest
	st, err := durable.Open(leftover, 0, []durable.Region{{Name: "optimizer", Size: 4096}}, durable.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	readOnly := t.TempDir()
	if err := os.Chmod(readOnly, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(readOnly, 0o700) })
	tests := []struct {
		name   string
		change func(*Config)
		msg    string
	}{
		{"every without a directory", func(c *Config) { c.Durable.Every = 10 }, "--ckpt-every needs --ckpt-dir"},
		{"concurrency without a directory", func(c *Config) { c.Durable.Concurrency = 2 }, "--ckpt-concurrency needs --ckpt-dir"},
		{"overhead without a directory", func(c *Config) { c.Durable.Overhead = 0.1 }, "--ckpt-overhead needs --ckpt-dir"},
		{"batch without a directory", func(c *Config) { c.Durable.DiffBatch = 5 }, "--diff-batch needs --ckpt-dir"},
		{"resume without a directory", func(c *Config) { c.Durable.Resume = true }, "--resume needs --ckpt-dir"},
		{"every negative", func(c *Config) { c.Durable.Dir, c.Durable.Every = dir, -1 }, "--ckpt-every -1: want 1 to 2^31"},
		{"every too long", func(c *Config) { c.Durable.Dir, c.Durable.Every = dir, MaxCkptEvery+1 }, "--ckpt-every 2147483649: want 1 to 2^31"},
		{"concurrency too high", func(c *Config) { c.Durable.Dir, c.Durable.Concurrency = dir, 9 }, "--ckpt-concurrency 9: want 1 to 8"},
		{"overhead one", func(c *Config) { c.Durable.Dir, c.Durable.Overhead = dir, 1 }, "--ckpt-overhead 1: want 0 < q < 1"},
		{"overhead negative", func(c *Config) { c.Durable.Dir, c.Durable.Overhead = dir, -0.1 }, "--ckpt-overhead -0.1: want 0 < q < 1"},
		{"batch in full mode", func(c *Config) { c.Durable.Dir, c.Durable.DiffBatch = dir, 5 }, "--diff-batch only applies with --protect-mode diff"},
		{"batch too long", func(c *Config) { c.Durable.Dir, c.Durable.DiffBatch = dir, 4097 }, "--diff-batch 4097: want 1 to 4096"},
		{"missing directory", func(c *Config) { c.Durable.Dir = filepath.Join(dir, "none") }, "--ckpt-dir " + filepath.Join(dir, "none") + ": " + filepath.Join(dir, "none") + " does not exist"},
		{"not a directory", func(c *Config) { c.Durable.Dir = file }, "--ckpt-dir " + file + ": " + file + " is not a directory"},
		{"another job's checkpoints", func(c *Config) { c.Durable.Dir = other }, "--ckpt-dir " + other + " holds job otherjob's checkpoints; use --resume or another --ckpt-dir"},
		{"a rank's files without a manifest", func(c *Config) { c.Durable.Dir = leftover }, "--ckpt-dir " + leftover + " holds rank 0's checkpoints of a job that wrote no manifest; use another --ckpt-dir"},
	}
	if os.Geteuid() != 0 { // root writes anywhere
		tests = append(tests, struct {
			name   string
			change func(*Config)
			msg    string
		}{"not writable", func(c *Config) { c.Durable.Dir = readOnly }, ""})
	}
	before, err := durable.List(other)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.change(&c)
			_, err := c.withDefaults()
			if tt.msg == "" {
				if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "is not writable") {
					t.Fatalf("error %v, want a ConfigError saying the directory is not writable", err)
				}
				return
			}
			checkConfigError(t, err, tt.msg)
		})
	}
	after, err := durable.List(other)
	if err != nil {
		t.Fatal(err)
	}
	if after.Manifest == nil || after.Manifest.Job != before.Manifest.Job || len(after.Ranks) != len(before.Ranks) {
		t.Fatalf("the other job's directory changed: %+v", after)
	}
	// With --resume the directory is checked against this job
	// (checkResumeDir): another job's is refused, saying what differs.
	c := validConfig()
	c.Durable = DurableOptions{Dir: other, Resume: true}
	if _, err := c.withDefaults(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "holds another job or layout") {
		t.Fatalf("--resume of another job's directory: %v, want a ConfigError naming what differs", err)
	}
}

// TestCommitStep: the step to commit is the newest every rank has a
// marker of, after the commit record and at or below G.
func TestCommitStep(t *testing.T) {
	rd := func(markers ...int64) *wire.RankDurable { return &wire.RankDurable{Markers: markers} }
	for _, tc := range []struct {
		name         string
		reports      []*wire.RankDurable
		g, committed int64
		want         int64
	}{
		{"no ranks", nil, 10, -1, -1},
		{"a rank not reported", []*wire.RankDurable{rd(0), nil}, 10, -1, -1},
		{"rank 0 not reported", []*wire.RankDurable{nil, rd(0)}, 10, -1, -1},
		{"no markers", []*wire.RankDurable{rd(), rd()}, 10, -1, -1},
		{"every rank has 0", []*wire.RankDurable{rd(0), rd(0)}, 10, -1, 0},
		{"the newest common", []*wire.RankDurable{rd(0, 4, 8), rd(0, 4), rd(4, 8)}, 10, -1, 4},
		{"not every rank has it", []*wire.RankDurable{rd(8), rd(4)}, 10, -1, -1},
		{"past G", []*wire.RankDurable{rd(4, 8), rd(4, 8)}, 7, -1, 4},
		{"nothing at or below G", []*wire.RankDurable{rd(8), rd(8)}, 7, -1, -1},
		{"committed already", []*wire.RankDurable{rd(4, 8), rd(4, 8)}, 10, 8, -1},
		{"never backwards", []*wire.RankDurable{rd(4), rd(4)}, 10, 8, -1},
		{"forward", []*wire.RankDurable{rd(4, 8, 12), rd(8, 12)}, 12, 8, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := commitStep(tc.reports, tc.g, tc.committed); got != tc.want {
				t.Fatalf("commitStep = %d, want %d", got, tc.want)
			}
		})
	}
}

// durableJob is a job of 4 ranks on 2 hosts (0, 1 and 2, 3) with a
// durable tier in dir, fed progress reports by the test: its published
// G messages are kept.
func durableJob(t *testing.T, dir string) (*job, *[]*wire.GlobalStep, *bytes.Buffer) {
	t.Helper()
	var stderr bytes.Buffer
	cfg := validConfig()
	cfg.Durable = DurableOptions{Dir: dir, Every: 2, Overhead: 0.03}
	cfg.Prog, cfg.Args = "dptrain", []string{"--steps", "8"}
	j := &job{cfg: cfg, log: slog.New(slog.DiscardHandler), id: "durablejob", world: 4, gen: 0}
	j.out = newOutputMux(&bytes.Buffer{}, &stderr, 4, false, false, "")
	t.Cleanup(func() { j.out.close() })
	var published []*wire.GlobalStep
	j.prog = newProgress([][]int{{0, 1}, {2, 3}}, []int{0, 0, 1, 1}, func(g *wire.GlobalStep) { published = append(published, g) })
	j.dur = j.newDurableTier()
	return j, &published, &stderr
}

var durableTestRegions = []wire.DurableRegion{{Name: "optimizer", Size: 4096}, {Name: "meta", Size: 64}}

// durableReport is a progress report of host (0: ranks 0 and 1, 1: 2
// and 3) of durableJob, every rank at committed step c, replicated p,
// resolved x, with markers.
func durableReport(host int, c, p, x int64, markers ...int64) *wire.UpProgress {
	u := &wire.UpProgress{Host: host}
	for _, r := range [][]int{{0, 1}, {2, 3}}[host] {
		u.Ranks = append(u.Ranks, wire.RankProgress{Rank: r, Committed: c, Replicated: p,
			D: &wire.RankDurable{Markers: markers, Resolved: x, Regions: durableTestRegions}})
	}
	return u
}

// TestDurableCommits: the launcher writes the manifest once every rank
// reported its regions, commits a step only once every rank has its
// marker and every rank's resolved step and G reached it, never moves
// the record backwards, and publishes each commit as the watermark on G
// with X, the steps decided.
func TestDurableCommits(t *testing.T) {
	dir := t.TempDir()
	j, published, _ := durableJob(t, dir)
	rep := durableReport
	steps := []struct {
		name      string
		u         *wire.UpProgress
		manifest  bool
		committed int64 // -1: no record
	}{
		{"host 0's markers, host 1 unknown", rep(0, 2, 2, 2, 0, 2), false, -1},
		{"host 1 has 0, its save of 2 in flight", rep(1, 2, 2, 1, 0), true, 0},
		{"host 1 has 2", rep(1, 2, 2, 2, 0, 2), true, 2},
		{"host 0 has 4, past G", rep(0, 4, 3, 4, 2, 4), true, 2},
		{"host 1 has 4, G is 3", rep(1, 4, 4, 4, 2, 4), true, 2},
		{"G reaches 4", rep(0, 4, 4, 4, 2, 4), true, 4},
		{"an old report", rep(1, 4, 4, 4, 2), true, 4},
	}
	for _, s := range steps {
		if err := j.prog.handle(s.u); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		j.durableProgress(s.u)
		_, merr := durable.ReadManifest(dir)
		if (merr == nil) != s.manifest {
			t.Fatalf("%s: manifest: %v, want one: %v", s.name, merr, s.manifest)
		}
		c, cerr := durable.ReadCommitted(dir)
		switch {
		case s.committed < 0 && !errors.Is(cerr, durable.ErrNotCommitted):
			t.Fatalf("%s: commit record %d, %v; want none", s.name, c, cerr)
		case s.committed >= 0 && (cerr != nil || c != s.committed):
			t.Fatalf("%s: commit record %d, %v; want %d", s.name, c, cerr, s.committed)
		}
	}
	var ds, xs []int64
	for _, g := range *published {
		if _, err := wire.DecodeGlobalStep(wire.Marshal(g)); err != nil {
			t.Fatalf("published %+v: %v", g, err)
		}
		if g.D != nil && (len(ds) == 0 || ds[len(ds)-1] != *g.D) {
			ds = append(ds, *g.D)
		}
		if g.X != nil && (len(xs) == 0 || xs[len(xs)-1] != *g.X) {
			xs = append(xs, *g.X)
		}
	}
	if !slices.Equal(ds, []int64{0, 2, 4}) || !slices.Equal(xs, []int64{1, 2, 3, 4}) {
		t.Fatalf("published watermarks %v and resolved steps %v, want [0 2 4] and [1 2 3 4]", ds, xs)
	}
	m, err := durable.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Job != "durablejob" || m.World != 4 || len(m.Regions) != 4 || m.Regions[3][1] != (durable.Region{Name: "meta", Size: 64}) ||
		m.Every != 2 || m.Protect != "full" || m.Command != commandHash("dptrain", []string{"--steps", "8"}) || len(m.Command) != 64 {
		t.Fatalf("manifest %+v", m)
	}
}

// TestDurableNoCommitWithoutRegions: a rank that never reported its
// regions (it never protected its state) keeps the manifest, and so any
// commit, from being written.
func TestDurableNoCommitWithoutRegions(t *testing.T) {
	dir := t.TempDir()
	j, _, _ := durableJob(t, dir)
	for host, ranks := range [][]int{{0, 1}, {2, 3}} {
		u := &wire.UpProgress{Host: host}
		for _, r := range ranks {
			d := &wire.RankDurable{Markers: []int64{0}, Regions: durableTestRegions}
			if r == 3 {
				d = nil
			}
			u.Ranks = append(u.Ranks, wire.RankProgress{Rank: r, Committed: 2, Replicated: 2, D: d})
		}
		if err := j.prog.handle(u); err != nil {
			t.Fatal(err)
		}
		j.durableProgress(u)
	}
	if _, err := durable.ReadManifest(dir); !errors.Is(err, durable.ErrNoManifest) {
		t.Fatalf("manifest written without rank 3's regions: %v", err)
	}
	if _, err := durable.ReadCommitted(dir); !errors.Is(err, durable.ErrNotCommitted) {
		t.Fatalf("commit record without rank 3's marker: %v", err)
	}
}

// TestDurableFallingBehind: with G more than twice --ckpt-every past the
// commit record, the launcher says so, naming the ranks that skipped or
// failed the most, at most every 30 s.
func TestDurableFallingBehind(t *testing.T) {
	j, _, stderr := durableJob(t, t.TempDir())
	for host, ranks := range [][]int{{0, 1}, {2, 3}} {
		u := &wire.UpProgress{Host: host}
		for _, r := range ranks {
			u.Ranks = append(u.Ranks, wire.RankProgress{Rank: r, Committed: 9, Replicated: 9, Stages: 10,
				D: &wire.RankDurable{Skipped: int64(r), Failed: int64(r % 2), Regions: durableTestRegions}})
		}
		if err := j.prog.handle(u); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Unix(1000, 0)
	j.durableTick(now)
	j.durableTick(now.Add(10 * time.Second)) // within 30 s: not again
	j.out.close()
	want := "gorun: the durable tier is falling behind: no version committed yet, G is step 9 (rank 3: 3 bases skipped, 1 failed; rank 1: 1 bases skipped, 1 failed; rank 2: 2 bases skipped, 0 failed)\n"
	if got := stderr.String(); got != want {
		t.Fatalf("stderr:\n%q\nwant\n%q", got, want)
	}
}

// TestFallingBehindText: the warning names the commit record, how far G
// is past it, and why: ranks without a store first, then those that
// skipped or failed the most.
func TestFallingBehindText(t *testing.T) {
	rp := func(r int, d *wire.RankDurable) wire.RankProgress { return wire.RankProgress{Rank: r, D: d} }
	for _, tc := range []struct {
		name         string
		g, committed int64
		ranks        []wire.RankProgress
		want         string
	}{
		{"slow saves", 40, 10, []wire.RankProgress{rp(0, &wire.RankDurable{}), rp(1, &wire.RankDurable{})},
			"the durable tier is falling behind: committed version step 10, 30 steps behind G (no base skipped or failed: the saves are slow)"},
		{"no store", 40, 10, []wire.RankProgress{rp(0, &wire.RankDurable{Skipped: 9}), rp(1, &wire.RankDurable{Off: "durable: no space left on device"})},
			"the durable tier is falling behind: committed version step 10, 30 steps behind G (rank 1 has no store: durable: no space left on device; rank 0: 9 bases skipped, 0 failed)"},
		{"not open", 40, 10, []wire.RankProgress{rp(0, nil), rp(1, &wire.RankDurable{})},
			"the durable tier is falling behind: committed version step 10, 30 steps behind G (rank 0 has not opened its store)"},
		{"many ranks", 40, 10, []wire.RankProgress{rp(0, &wire.RankDurable{Failed: 1}), rp(1, &wire.RankDurable{Failed: 2}), rp(2, &wire.RankDurable{Failed: 3}), rp(3, &wire.RankDurable{Failed: 4}), rp(4, &wire.RankDurable{Failed: 5})},
			"the durable tier is falling behind: committed version step 10, 30 steps behind G (rank 4: 0 bases skipped, 5 failed; rank 3: 0 bases skipped, 4 failed; rank 2: 0 bases skipped, 3 failed; and 2 more)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fallingBehind(tc.g, tc.committed, tc.ranks); got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestDurableTable: -v's end-of-job report of the durable tier: the
// commit record, each rank's saves and rates, and the footprint.
func TestDurableTable(t *testing.T) {
	dir := t.TempDir()
	j, _, _ := durableJob(t, dir)
	st, err := durable.Open(dir, 0, []durable.Region{{Name: "optimizer", Size: 4096}}, durable.Options{Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Save(context.Background(), 0, [][]byte{make([]byte, 4096)}, []uint32{crc32c.Checksum(make([]byte, 4096))}, nil); err != nil {
		t.Fatal(err)
	}
	st.Close()
	j.prog.handle(&wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{{Rank: 0, Committed: 4, Replicated: 4,
		D: &wire.RankDurable{Markers: []int64{0}, Saves: 2, Skipped: 1, WriteNS: 2e9, Bytes: 4e8, HoldNS: 3e6, N: 2}}}})
	got := j.durableTable()
	for _, want := range []string{
		"durable tier: " + dir + ", a base every 2 steps, no version committed\n",
		"       0      2        1       0           1s        200          3ms    2\n",
		"       3      -\n",
		"durable footprint: ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// TestDurableTableDiffLog: in diff mode -v's report gains each rank's
// differential log on disk: steps written, dropped, batches failed.
func TestDurableTableDiffLog(t *testing.T) {
	j, _, _ := durableJob(t, t.TempDir())
	j.prog.handle(&wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{
		{Rank: 0, Committed: 4, Replicated: 4, D: &wire.RankDurable{Resolved: -1, Log: &wire.DiffLogStats{Steps: 5}}},
		{Rank: 1, Committed: 4, Replicated: 4, D: &wire.RankDurable{Resolved: -1, Log: &wire.DiffLogStats{Steps: 1, Dropped: 4, Failed: 1}}}}})
	j.prog.handle(&wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{{Rank: 2, Committed: 4, Replicated: 4, D: &wire.RankDurable{Resolved: -1}}}})
	got := j.durableTable()
	for _, want := range []string{
		"stage wait    N log written log dropped log failed\n",
		"    0           5           0          0\n",
		"    0           1           4          1\n",
		"    0           -           -          -\n",
		"       3      -\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// TestResolvedStep: X is the minimum of G and every rank's resolved
// step, none while a rank has not reported.
func TestResolvedStep(t *testing.T) {
	rd := func(x int64) *wire.RankDurable { return &wire.RankDurable{Resolved: x} }
	for _, tc := range []struct {
		name    string
		reports []*wire.RankDurable
		g       int64
		want    int64
	}{
		{"no ranks", nil, 10, -1},
		{"a rank not reported", []*wire.RankDurable{rd(8), nil}, 10, -1},
		{"the slowest rank", []*wire.RankDurable{rd(8), rd(3), rd(9)}, 10, 3},
		{"G", []*wire.RankDurable{rd(8), rd(9)}, 6, 6},
		{"nothing resolved", []*wire.RankDurable{rd(8), rd(-1)}, 10, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolvedStep(tc.reports, tc.g); got != tc.want {
				t.Fatalf("resolvedStep = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestDurableAbandons: the launcher decides every step up to X. When the
// ranks' saves share no step after the commit record (host 1's save of
// 12 failed, host 0's succeeded), nothing is committed but X moves on,
// so that host 0 frees its version of 12; a marker of a step at or below
// a published X (a report from a host that took ranks over and found
// step 12's marker on disk) never commits it; the next common step
// does.
func TestDurableAbandons(t *testing.T) {
	dir := t.TempDir()
	j, published, _ := durableJob(t, dir)
	lastX := func() (d, x int64) {
		d, x = -1, -1
		for _, g := range *published {
			if g.D != nil {
				d = *g.D
			}
			if g.X != nil {
				x = *g.X
			}
		}
		return d, x
	}
	for _, s := range []struct {
		name         string
		u            *wire.UpProgress
		committed, x int64
	}{
		{"host 0 saved 8", durableReport(0, 8, 8, 8, 8), -1, -1},
		{"host 1 saved 8", durableReport(1, 8, 8, 8, 8), 8, 8},
		{"host 0 saved 12", durableReport(0, 12, 12, 12, 8, 12), 8, 8},
		{"host 1's save of 12 failed", durableReport(1, 12, 12, 12, 8), 8, 12},
		{"host 1 reports 12's marker after all", durableReport(1, 13, 13, 13, 8, 12), 8, 12},
		{"host 0 saved 16", durableReport(0, 16, 16, 16, 8, 16), 8, 13},
		{"host 1 saved 16", durableReport(1, 16, 16, 16, 8, 12, 16), 16, 16},
	} {
		if err := j.prog.handle(s.u); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		j.durableProgress(s.u)
		c, err := durable.ReadCommitted(dir)
		if s.committed < 0 && !errors.Is(err, durable.ErrNotCommitted) || s.committed >= 0 && (err != nil || c != s.committed) {
			t.Fatalf("%s: commit record %d, %v; want %d", s.name, c, err, s.committed)
		}
		if d, x := lastX(); d != s.committed || x != s.x {
			t.Fatalf("%s: published D %d, X %d; want %d and %d", s.name, d, x, s.committed, s.x)
		}
	}
}

// TestDurableExitCarriesLastCommit: the end of a job (issue 17's flaky
// e2e): the last report of the ranks commits a step as they end, and the
// OpExit that then ends the agents (finish) carries that D and X, as G
// last published them, for an agent that exits before it handles that
// G. Without a durable decision it carries none.
func TestDurableExitCarriesLastCommit(t *testing.T) {
	dir := t.TempDir()
	j, published, _ := durableJob(t, dir)
	if c := j.exitControl(); c.Op != wire.OpExit || c.D != nil || c.X != nil {
		t.Fatalf("exit before any decision: %+v, want OpExit without D or X", c)
	}
	for _, u := range []*wire.UpProgress{
		durableReport(0, 2, 2, 2, 0, 2),
		durableReport(1, 2, 2, 2, 0, 2),
		// The last report, as the ranks end: 4 committed.
		durableReport(0, 4, 4, 4, 2, 4),
		durableReport(1, 4, 4, 4, 2, 4),
	} {
		if err := j.prog.handle(u); err != nil {
			t.Fatal(err)
		}
		j.durableProgress(u)
	}
	if c, err := durable.ReadCommitted(dir); err != nil || c != 4 {
		t.Fatalf("commit record %d, %v; want 4", c, err)
	}
	last := (*published)[len(*published)-1]
	c, err := wire.DecodeControl(wire.Marshal(j.exitControl()))
	if err != nil {
		t.Fatal(err)
	}
	if c.Op != wire.OpExit || c.D == nil || c.X == nil || *c.D != 4 || *c.X != 4 || *c.D != *last.D || *c.X != *last.X {
		v := func(p *int64) string {
			if p == nil {
				return "none"
			}
			return strconv.FormatInt(*p, 10)
		}
		t.Fatalf("exit %s with D %s, X %s; want OpExit with D 4 and X 4, as the last G (D %s, X %s)", c.Op, v(c.D), v(c.X), v(last.D), v(last.X))
	}
}

// TestDiffLogLostWarning: a rank's differential log on disk that lost
// steps is said once per burst, at most every 30 s, with the steps lost
// since the last warning and the last error; nothing without losses.
func TestDiffLogLostWarning(t *testing.T) {
	j, _, stderr := durableJob(t, t.TempDir())
	report := func(committed int64, logs [4]*wire.DiffLogStats) {
		t.Helper()
		for host, ranks := range [][]int{{0, 1}, {2, 3}} {
			u := &wire.UpProgress{Host: host}
			for _, r := range ranks {
				u.Ranks = append(u.Ranks, wire.RankProgress{Rank: r, Committed: committed, Replicated: committed, Stages: committed + 1,
					D: &wire.RankDurable{Resolved: -1, Regions: durableTestRegions, Log: logs[r]}})
			}
			if err := j.prog.handle(u); err != nil {
				t.Fatal(err)
			}
		}
	}
	ok := &wire.DiffLogStats{Steps: 2}
	now := time.Unix(1000, 0)
	report(1, [4]*wire.DiffLogStats{ok, ok, ok, nil})
	j.durableTick(now) // no drops: nothing
	report(2, [4]*wire.DiffLogStats{ok, {Steps: 1, Dropped: 2, Failed: 1, LastErr: "no space left on device"}, ok, nil})
	j.durableTick(now.Add(time.Second))
	report(3, [4]*wire.DiffLogStats{ok, {Steps: 1, Dropped: 3, Failed: 2, LastErr: "no space left on device"}, ok, nil})
	j.durableTick(now.Add(10 * time.Second)) // within 30 s of the last: not yet
	j.durableTick(now.Add(40 * time.Second)) // the one more step lost since
	j.durableTick(now.Add(80 * time.Second)) // none lost since: nothing
	j.out.close()
	want := "gorun: the differential log on disk lost 2 steps of rank 1 (last error: no space left on device): --resume and a roll-back reach only up to its first lost step until a base is committed\n" +
		"gorun: the differential log on disk lost 1 steps of rank 1 (last error: no space left on device): --resume and a roll-back reach only up to its first lost step until a base is committed\n"
	if got := stderr.String(); got != want {
		t.Fatalf("stderr:\n%q\nwant\n%q", got, want)
	}
}

// TestDiffLogLostText: with a commit record, the warning names its step.
func TestDiffLogLostText(t *testing.T) {
	got := diffLogLost(2, 4, "", 10)
	want := "the differential log on disk lost 4 steps of rank 2: --resume and a roll-back reach only up to its first lost step after the committed version step 10 until the next base is committed"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
