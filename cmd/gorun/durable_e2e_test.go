package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/testcluster"
)

// End-to-end tests of the durable tier (--ckpt-dir): dptrain --protect on
// namespace hosts, whose files are one file system (the checkpoint
// directory is shared, as on a cluster's shared file system). The job
// must end as one without a durable tier (exit 0, the same hashes) with a
// commit record near its last base step, every file verifying, and what
// the commit record makes useless reclaimed.

// durableFiles is how many base files a rank keeps with the automatic
// concurrency: at most 4 saves in flight, plus one (internal/keeper/persist.go).
const durableFiles = 5

// durableCommitRE matches -v's end-of-job line about the durable tier.
var durableCommitRE = regexp.MustCompile(`(?m)^gorun: durable tier: (\S+), a base every (\d+) steps, committed version step (\d+)$`)

// checkDurableDir checks the directory a job of world ranks with a base
// every `every` steps left: its manifest is job id's, its commit record a
// base step in [minStep, maxStep], every file verifies, and nothing the
// commit record makes useless is left: per rank at most durableFiles base
// files, no version, marker or differential batch before the committed
// step. It returns the committed step.
func checkDurableDir(t *testing.T, dir, id string, world, every int, minStep, maxStep int64) int64 {
	t.Helper()
	m, err := durable.ReadManifest(dir)
	if err != nil {
		t.Fatalf("manifest: %v", err)
	}
	if m.Job != id || m.World != world || m.Every != every || len(m.Regions) != world || len(m.Command) != 64 {
		t.Errorf("manifest %+v, want job %s, world %d, a base every %d", m, id, world, every)
	}
	c, err := durable.ReadCommitted(dir)
	if err != nil {
		t.Fatalf("commit record: %v", err)
	}
	if c%int64(every) != 0 || c < minStep || c > maxStep {
		t.Errorf("committed step %d, want a multiple of %d from %d to %d", c, every, minStep, maxStep)
	}
	problems, err := durable.Verify(context.Background(), dir)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	for _, p := range problems {
		t.Errorf("Verify: %s [%d, %d): %v", p.Path, p.Off, p.End, p.Err)
	}
	l, err := durable.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Ranks) != world {
		t.Fatalf("%d ranks in the directory, want %d", len(l.Ranks), world)
	}
	for _, r := range l.Ranks {
		if len(r.Bases) > durableFiles {
			t.Errorf("rank %d has %d base files, want at most %d", r.Rank, len(r.Bases), durableFiles)
		}
		committed := false
		for _, b := range r.Bases {
			switch b.State {
			case durable.StateCommitted:
				committed = b.Step == c
			case durable.StateComplete:
				if b.Step < c {
					t.Errorf("rank %d keeps version %d from before the commit record %d (%s)", r.Rank, b.Step, c, b.Path)
				}
			case durable.StateCorrupt:
				t.Errorf("rank %d: base file %s is corrupt: %v", r.Rank, b.Path, b.Err)
			}
		}
		if !committed {
			t.Errorf("rank %d holds no committed version of step %d: %+v", r.Rank, c, r.Bases)
		}
		for _, s := range r.Markers {
			if s < c {
				t.Errorf("rank %d keeps the marker of step %d, before the commit record %d", r.Rank, s, c)
			}
		}
		for _, b := range r.Batches {
			if b.Last <= c {
				t.Errorf("rank %d keeps the differential batch %d-%d, before the commit record %d", r.Rank, b.First, b.Last, c)
			}
		}
	}
	t.Logf("durable directory: committed step %d, footprint %d bytes", c, l.Usage.Total)
	return c
}

// durableTableRanks returns -v's per-rank rows of the durable tier:
// saves, skipped, failed by rank.
func durableTableRanks(t *testing.T, stderr string) map[int][3]int {
	t.Helper()
	loc := durableCommitRE.FindAllStringIndex(stderr, -1)
	if loc == nil {
		t.Fatalf("no durable tier report in stderr:\n%s", stderr)
	}
	rows := map[int][3]int{}
	lines := strings.Split(stderr[loc[len(loc)-1][1]:], "\n")[1:]
	if len(lines) > 0 && strings.Contains(lines[0], "saves") {
		lines = lines[1:]
	}
	row := regexp.MustCompile(`^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s`)
	for _, l := range lines {
		m := row.FindStringSubmatch(l)
		if m == nil {
			break
		}
		var v [4]int
		for i := range v {
			v[i], _ = strconv.Atoi(m[i+1])
		}
		rows[v[0]] = [3]int{v[1], v[2], v[3]}
	}
	return rows
}

// TestDurableBases: dptrain with a base every 4 steps on 2 hosts ends as
// without a durable tier, with a commit record at its last base step (or
// the one before, whose saves had to finish before the job ended), every
// file verifying, and nothing older than the record kept.
func TestDurableBases(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	wantP, wantO := referenceHashes(t, hosts)
	dir := t.TempDir()
	j := dptrainJob(t, hosts, []string{"-v", "--ckpt-dir", dir, "--ckpt-every", "4"}, "--protect")
	res := j.wait(90 * time.Second)
	if res.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	checkJobCleanedUp(t, j)
	checkHashes(t, res, wantP, wantO)
	c := checkDurableDir(t, dir, j.jobID(), 4, 4, 12, 16)
	m := durableCommitRE.FindStringSubmatch(res.stderr)
	if m == nil || m[1] != dir || m[2] != "4" || m[3] != strconv.FormatInt(c, 10) {
		t.Errorf("-v says %q, want the directory %s and the commit record %d", m, dir, c)
	}
	for r, v := range durableTableRanks(t, res.stderr) {
		if v[0] < int(c/4) || v[2] != 0 {
			t.Errorf("rank %d: %d saves, %d skipped, %d failed; want at least %d saves and no failure", r, v[0], v[1], v[2], c/4)
		}
	}
}

// TestDurableHostLoss: a host killed mid-run under --spares 1: the job
// ends as one without the failure, and the durable tier goes on after the
// recovery epoch: the spare opens the lost ranks' stores (the shared
// directory), saves their bases, and the commit record moves past the
// failure.
func TestDurableHostLoss(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	wantP, wantO := hsReference(t, c)
	dir := t.TempDir()
	const every, killAfter = 4, 14
	r := c.start(t, []string{"--ckpt-dir", dir, "--ckpt-every", strconv.Itoa(every), "--max-restarts", "2"}, "--protect")
	r.waitStep(t, killAfter)
	if err := c.hosts.KillAll(1); err != nil { // ranks 2 and 3
		t.Fatal(err)
	}
	res := r.finish(t, 0)
	defer func() {
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		}
	}()
	checkHashes(t, res, wantP, wantO)
	if sp := ofKind[events.Splice](readEvents(t, r.events)); len(sp) != 1 || sp[0].With != c.hosts.Names[2] {
		t.Fatalf("splices %+v, want one onto the spare %s", sp, c.hosts.Names[2])
	}
	// A base after the failure committed: every rank, the spare's ones
	// too, saved it.
	got := checkDurableDir(t, dir, r.jobID(), 4, every, killAfter+every, hsSteps-1)
	rows := durableTableRanks(t, res.stderr)
	for _, rk := range []int{2, 3} {
		if rows[rk][0] == 0 {
			t.Errorf("rank %d, on the spare, saved no base (rows %v); committed %d", rk, rows, got)
		}
	}
}

// TestDurableDiskFull: the checkpoint directory's file system fills up
// mid-run, for good (a small tmpfs, filled by another writer once the
// first base is committed: fillFrozen): training goes on and ends as
// without a durable tier, the launcher says the durable tier is falling
// behind, the saves that failed are counted, no save after the fill is
// committed, and no torn version is left: every file verifies and the
// commit record's version is intact.
func TestDurableDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	hosts := testcluster.NetnsHosts(t, 2)
	args := []string{"--steps", "60", "--device-ms", "20", "--log-every", "1"}
	wantP, wantO := func() (string, string) {
		j := dptrainJob(t, hosts, nil, args...)
		res := j.wait(90 * time.Second)
		if res.code != 0 {
			t.Fatalf("reference run: exit %d\nstderr:\n%s", res.code, res.stderr)
		}
		return dptrainHashes(t, res)
	}()
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"bases", nil},
		{"diff", []string{"--protect-mode", "diff", "--diff-codec", "raw", "--diff-batch", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			diskFull(t, hosts, args, tc.flags, wantP, wantO, tc.flags != nil)
		})
	}
}

// diskFull is TestDurableDiskFull's run with flags (diff: the
// differential log on disk loses steps too, which gorun says).
func diskFull(t *testing.T, hosts *testcluster.Hosts, args, flags []string, wantP, wantO string, diff bool) {
	// Room for every rank's base files (4 ranks × 5 × 600 KiB) and the
	// small files, not much more.
	dir := mountTmpfs(t, 16<<20)
	j := dptrainJob(t, hosts, append([]string{"-v", "--ckpt-dir", dir, "--ckpt-every", "4"}, flags...), append([]string{"--protect"}, args...)...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := durable.ReadCommitted(dir); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no commit record after 60 s\nstderr:\n%s", j.stderr.String())
		}
		select {
		case <-j.done:
			t.Fatalf("gorun ended before the first commit\nstdout:\n%s\nstderr:\n%s", j.res.stdout, j.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	filledAt := fillFrozen(t, hosts, j, dir)
	res := j.wait(120 * time.Second)
	if res.code != 0 {
		t.Fatalf("exit %d with the disk full\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	defer func() {
		if t.Failed() {
			t.Logf("stderr:\n%s", res.stderr)
		}
	}()
	checkJobCleanedUp(t, j)
	checkHashes(t, res, wantP, wantO)
	if !strings.Contains(res.stderr, "gorun: the durable tier is falling behind: committed version step ") {
		t.Errorf("gorun did not say the durable tier falls behind")
	}
	failed := 0
	for _, v := range durableTableRanks(t, res.stderr) {
		failed += v[2]
	}
	if failed == 0 {
		t.Errorf("no failed save counted with the disk full")
	}
	if lost := "gorun: the differential log on disk lost "; diff && !strings.Contains(res.stderr, lost) {
		t.Errorf("gorun did not say the differential log on disk lost steps")
	} else if !diff && strings.Contains(res.stderr, lost) {
		t.Errorf("a differential log without diff mode")
	}
	// No save after the fill reached the disk whole: the commit record is
	// the one at the fill, and it stays intact.
	for _, name := range []string{"fill", "pins"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	checkDurableDir(t, dir, j.jobID(), 4, 4, filledAt, filledAt)
}

// fillFrozen fills dir's file system for the rest of job j's run and
// returns the step of the commit record at the fill. Every process of the
// job is stopped meanwhile (the agents and ranks of hosts, and gorun), so
// that nothing is written or removed in dir while it pins every file
// there (a hard link under dir/pins) and then fills the rest (fillUp):
// what the job removes later (the markers and differential batches a
// reclaim frees, a pointer replaced, a temporary file a failed write
// leaves) frees no space, and every write of the job that needs space
// fails from then on, whenever it comes. (A fill alone is not enough: a
// fill that landed between a commit and the agents' reclaim of what it
// made useless, or while a batch was being written, left the job space
// to free after it; the next saves' pointers and markers took it, the
// next commit's reclaim freed the room for the saves after, and in diff
// mode the commits went on to the end of the job with no save failed.)
func fillFrozen(t *testing.T, hosts *testcluster.Hosts, j *job, dir string) int64 {
	t.Helper()
	thaw := func() {
		if err := j.cmd.Process.Signal(syscall.SIGCONT); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("continuing gorun: %v", err)
		}
		for h := range hosts.Names {
			if err := hosts.ContAll(h); err != nil {
				t.Errorf("continuing host %d: %v", h, err)
			}
		}
	}
	defer thaw()
	if err := testcluster.StopProcess(j.cmd.Process); err != nil {
		t.Fatal(err)
	}
	for h := range hosts.Names {
		if err := hosts.StopAll(h); err != nil {
			t.Fatal(err)
		}
	}
	c, err := durable.ReadCommitted(dir)
	if err != nil {
		t.Fatalf("the commit record at the fill: %v", err)
	}
	pins := filepath.Join(dir, "pins")
	if err := os.Mkdir(pins, 0o700); err != nil {
		t.Fatal(err)
	}
	n := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case p == pins:
			return filepath.SkipDir
		case !d.Type().IsRegular():
			return nil
		}
		n++
		return os.Link(p, filepath.Join(pins, strconv.Itoa(n)))
	})
	if err != nil {
		t.Fatalf("pinning the files in %s: %v", dir, err)
	}
	filled := fillUp(t, dir)
	t.Logf("commit record at step %d; %d files pinned; file system filled with %d bytes", c, n, filled)
	return c
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory, unmounted
// at the end of the test.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillUp writes a file in dir until its file system is full, and returns
// its size.
func fillUp(t *testing.T, dir string) int64 {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := io.Copy(f, zeros{})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling %s: %d bytes, %v; want ENOSPC", dir, n, err)
	}
	return n
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
