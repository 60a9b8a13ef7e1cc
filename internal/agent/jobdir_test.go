package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"golang.org/x/sys/unix"
)

// The jobdirholder helper's parent directory and job.
const (
	jobDirParentVar = "AGENTTEST_JOBDIR_PARENT"
	jobDirJobVar    = "AGENTTEST_JOBDIR_JOB"
)

// jobDirHolder is an agent as far as its job directory goes: it makes
// and holds one, prints its path, and keeps it until it is killed (or
// its stdin ends).
func jobDirHolder() int {
	d, err := makeJobDir(os.Getenv(jobDirParentVar), os.Getenv(jobDirJobVar), nil)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println(d.path)
	_, _ = io.Copy(io.Discard, os.Stdin)
	runtime.KeepAlive(d) // its file's finalizer would drop the lock
	return 0
}

// startHolder starts a jobdirholder child and returns it with the
// directory it holds.
func startHolder(t *testing.T, parent, job string) (*exec.Cmd, string) {
	t.Helper()
	cmd, path, _ := startHelper(t, nil, "jobdirholder", jobDirParentVar+"="+parent, jobDirJobVar+"="+job)
	if !filepath.IsAbs(path) {
		t.Fatalf("the holder printed %q", path)
	}
	return cmd, path
}

// startHelper starts this test binary as the agenttestHelper helper,
// with env added to its environment and under the command prefix (nil:
// none; unshare ... for another namespace), and returns it with the
// first line it printed and end, which closes its stdin (the helpers
// end then) and reaps it. The test's cleanup calls end too.
func startHelper(t *testing.T, prefix []string, helper string, env ...string) (cmd *exec.Cmd, line string, end func()) {
	t.Helper()
	argv := append(slices.Clone(prefix), os.Args[0])
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), agenttestHelper+"="+helper), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	end = sync.OnceFunc(func() {
		stdin.Close()
		_ = cmd.Wait() // its exit status is the test's to judge, if any
	})
	t.Cleanup(end)
	line, err = bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the %s helper printed %q (%v)", helper, line, err)
	}
	return cmd, strings.TrimSpace(line), end
}

func TestJobDirJob(t *testing.T) {
	for _, tc := range []struct {
		name, job string
	}{
		{"gorun-abc-123.agent", "abc"},
		{"gorun-a-b-1-0.agent", "a-b-1"},
		{"gorun-e2e-bin-4294967295.agent", "e2e-bin"},
		{"gorun-abc-123", ""},              // another program's (os.MkdirTemp's own pattern)
		{"gorun-e2e-bin-123", ""},          // gorun's tests' binaries
		{"gorun-abc-h0-g0", ""},            // an Open MPI directory
		{"gorun-abc-12x.agent", ""},        // not a number
		{"gorun-abc-.agent", ""},           // no number
		{"gorun-abc.agent", ""},            // no job
		{"gorun--123.agent", ""},           // empty job
		{"gorun---123.agent", ""},          // a job starting with '-'
		{"gorun-ABC-123.agent", ""},        // not a job id
		{"gorun-a.b-123.agent", ""},        // not a job id
		{"gorun-abc-123.agent.x", ""},      // another suffix
		{"gorun-abc-+123.agent", ""},       // a sign
		{"gorun-abc-4294967296.agent", ""}, // beyond os.MkdirTemp's numbers
		{"other-abc-123.agent", ""},
		{"gorun-" + strings.Repeat("a", 65) + "-1.agent", ""},
	} {
		job, ok := jobDirJob(tc.name)
		if job != tc.job || ok != (tc.job != "") {
			t.Errorf("jobDirJob(%q) = %q, %v; want %q", tc.name, job, ok, tc.job)
		}
	}
}

// TestSweepJobDirs: of the directories in a parent, the sweep removes
// only those named like a job directory of this user that nobody holds;
// a killed agent's is removed once it is dead, not while it lives.
func TestSweepJobDirs(t *testing.T) {
	parent := t.TempDir()
	mk := func(name string) string {
		t.Helper()
		p := filepath.Join(parent, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "f"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Kept: directories held here, names not a job directory's, a file.
	held, err := makeJobDir(parent, "jobheld", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.remove()
	keep := []string{held.path}
	for _, n := range []string{"gorun-joba-123", "gorun-e2e-bin-77", "gorun-joba-1x.agent", "gorun-JOBA-1.agent", "gorun-joba-h0-g0", "other"} {
		keep = append(keep, mk(n))
	}
	notDir := filepath.Join(parent, "gorun-joba-5.agent")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, notDir)
	// A symbolic link named like a job directory, to one nobody holds
	// elsewhere: neither is touched.
	target := filepath.Join(t.TempDir(), "gorun-joba-8.agent")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(parent, "gorun-joba-7.agent")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, link, target)
	// Another user's, nobody holding it.
	if os.Getuid() == 0 {
		other := mk("gorun-joba-9.agent")
		if err := os.Lchown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		keep = append(keep, other)
	} else {
		t.Log("not root: another user's directory is not tried")
	}
	// Swept: an agent's that never locked it (killed right after its
	// mkdir), of two jobs.
	orphanA, orphanB := mk("gorun-joba-1.agent"), mk("gorun-jobb-2.agent")
	// A live agent of job a in another process, killed later.
	holder, dead := startHolder(t, parent, "joba")

	check := func(what string, swept []string, err error, want ...string) {
		t.Helper()
		var names []string
		for _, p := range want {
			names = append(names, filepath.Base(p))
		}
		slices.Sort(swept)
		slices.Sort(names)
		if err != nil || !slices.Equal(swept, names) {
			t.Errorf("%s: swept %q (%v), want %q", what, swept, err, names)
		}
		for _, p := range want {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: %s is still there (%v)", what, p, err)
			}
		}
		for _, p := range keep {
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("%s: %s: %v (must be left)", what, p, err)
			}
		}
	}
	swept, err := sweepJobDirs(parent, "joba")
	check("job a's", swept, err, orphanA)
	if _, err := os.Stat(orphanB); err != nil {
		t.Errorf("job a's sweep took job b's directory: %v", err)
	}
	swept, err = sweepJobDirs(parent, "")
	check("every job's", swept, err, orphanB)
	if _, err := os.Stat(dead); err != nil {
		t.Errorf("the live holder's directory was swept: %v", err)
	}

	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait() // reaped: its files are closed, its lock gone
	swept, err = sweepJobDirs(parent, "joba")
	check("after the holder was killed", swept, err, dead)
}

// TestMakeJobDirRace: a sweeper that meets a directory between its
// creation and its agent's lock never removes it under the agent:
// makeJobDir either holds it, and the sweeper leaves it, or gives it up
// and makes another.
func TestMakeJobDirRace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sweep func(t *testing.T, path string) (finish func()) // in the window
		again bool                                            // makeJobDir must make another
	}{
		{"swept before the lock", func(t *testing.T, path string) func() {
			if swept, err := sweepJobDirs(filepath.Dir(path), ""); err != nil || len(swept) != 1 {
				t.Errorf("the sweep in the window: %q, %v; want the new directory", swept, err)
			}
			return nil
		}, true},
		{"sweeper locked it first", func(t *testing.T, path string) func() {
			f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				t.Fatal(err)
			}
			// The sweeper goes on once makeJobDir returned.
			return func() {
				if !sameFile(f, path) {
					t.Error("the sweeper's directory was replaced")
				}
				if err := os.RemoveAll(path); err != nil {
					t.Error(err)
				}
				f.Close()
			}
		}, true},
		{"sweeper opened it, the agent locked first", func(t *testing.T, path string) func() {
			f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
			if err != nil {
				t.Fatal(err)
			}
			return func() {
				defer f.Close()
				if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
					t.Errorf("the sweeper's lock: %v, want EWOULDBLOCK", err)
				}
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			var first string
			var finish func()
			d, err := makeJobDir(parent, "jobrace", &jobDirSys{opened: func(path string) {
				if first == "" {
					first = path
					finish = tc.sweep(t, path)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer d.remove()
			if finish != nil {
				finish()
			}
			if again := d.path != first; again != tc.again {
				t.Errorf("makeJobDir returned %s, the first directory %s; want another: %v", d.path, first, tc.again)
			}
			// The agent's directory is there, held: it can be used, and
			// no sweep takes it.
			if err := os.Mkdir(filepath.Join(d.path, "tmp"), 0o700); err != nil {
				t.Errorf("the agent's directory: %v", err)
			}
			if swept, err := sweepJobDirs(parent, ""); err != nil || len(swept) != 0 {
				t.Errorf("a sweep after makeJobDir: swept %q, %v", swept, err)
			}
			if err := d.remove(); err != nil {
				t.Fatal(err)
			}
			if left, _ := os.ReadDir(parent); len(left) != 0 {
				t.Errorf("left in the parent: %v", left)
			}
		})
	}
}

// TestAgentSweepsJobDirs: an agent sweeps the job directories nobody
// holds when it starts (every job's) and when it ends (its own job's:
// those of its job's agents killed on the host meanwhile). MPICH's
// segment files in its /dev/shm that no process uses (a rank killed in
// MPI_Init left them) go at its start and at its end, whatever their
// job; one a process has open stays.
func TestAgentSweepsJobDirs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	job := uniqueJob("jobdirsweep")
	mk := func(name string) string {
		t.Helper()
		p := filepath.Join(tmp, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		return p
	}
	before := mk("gorun-endedjob-1.agent")
	// A private /dev/shm: an agent starting elsewhere meanwhile would
	// sweep the machine's.
	shm := t.TempDir()
	mpichBefore := makeShmFile(t, shm, "mpich_shar_tmpBefore", time.Minute)
	j := startSwapJob(t, job, []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Spare: true}}, 1, swapOpts{with: func(c *Config) { c.shmDir = shm }})
	j.until("the spare's first epoch", func(e *wire.Event) bool { return e.Kind == wire.EventEpoch })
	// The start's sweep runs beside the launch. Once it removed the
	// ended job's directory it has read its list of names: what the
	// test makes from now on is not in it.
	for {
		if _, err := os.Stat(before); errors.Is(err, os.ErrNotExist) {
			break
		}
		select {
		case <-j.ctx.Done():
			t.Fatal("the agent's start did not sweep an ended job's directory")
		case <-time.After(5 * time.Millisecond):
		}
	}
	// The shm sweep comes before the job directories' (sweepSlots).
	if _, err := os.Stat(mpichBefore); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent's start left an unused MPICH file: %v", err)
	}
	own, err := filepath.Glob(filepath.Join(tmp, "gorun-"+job+"-*.agent"))
	if err != nil || len(own) != 1 {
		t.Fatalf("the agent's job directories: %v (%v), want one", own, err)
	}
	// Killed agents of the job, and of another, on the same /tmp.
	sameJob, otherJob := mk("gorun-"+job+"-2.agent"), mk("gorun-otherjob-3.agent")
	// And the Open MPI directory of one in /dev/shm.
	sameJobShm, otherJobShm := filepath.Join(shm, "gorun-"+job+"-h5-g0"), filepath.Join(shm, "gorun-otherjob-h0-g0")
	for _, d := range []string{sameJobShm, otherJobShm} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// A killed rank's MPICH segment, and a live one (open here).
	mpichLeft := makeShmFile(t, shm, "mpich_shar_tmpKilled", time.Minute)
	mpichLive := makeShmFile(t, shm, "mpich_shar_tmpLive00", time.Minute)
	live, err := os.Open(mpichLive)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	j.send(&wire.Control{Op: wire.OpKill})
	j.send(&wire.Control{Op: wire.OpExit})
	j.waitExit(t)
	for _, gone := range []string{own[0], sameJob, sameJobShm, mpichLeft} {
		if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v)", gone, err)
		}
	}
	for _, kept := range []string{otherJob, otherJobShm, mpichLive} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("the ending agent swept what it must keep: %v", err)
		}
	}
}

// withoutDACOverride runs f on a thread of its own without the
// capabilities that let root ignore file modes (CAP_DAC_OVERRIDE,
// CAP_DAC_READ_SEARCH, CAP_FOWNER), as a user is; the thread ends with f.
func withoutDACOverride(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		f()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			t.Errorf("capget: %v", err)
			return
		}
		for _, c := range []uint{unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER} {
			data[c/32].Effective &^= 1 << (c % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			t.Errorf("capset: %v", err)
			return
		}
		f()
	}()
	<-done
}

// TestRemoveReadOnlyTree: a job directory holding a directory a rank
// made read-only (its files cannot be unlinked) is still removed, by its
// agent and by a sweep: the tree is made writable and removed again.
// Without it, every later sweep would fail on it.
func TestRemoveReadOnlyTree(t *testing.T) {
	parent := t.TempDir()
	mkTree := func(dir string) {
		t.Helper()
		for _, d := range []string{dir, filepath.Join(dir, "tmp"), filepath.Join(dir, "tmp", "ro"), filepath.Join(dir, "tmp", "ro", "sub")} {
			if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "f"), []byte("x"), 0o400); err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range []string{filepath.Join(dir, "tmp", "ro", "sub"), filepath.Join(dir, "tmp", "ro")} {
			if err := os.Chmod(d, 0o500); err != nil {
				t.Fatal(err)
			}
		}
	}
	plain := filepath.Join(t.TempDir(), "plain")
	mkTree(plain)
	held, err := makeJobDir(parent, "jobro", nil)
	if err != nil {
		t.Fatal(err)
	}
	mkTree(held.path)
	heldPath := held.path
	dead := filepath.Join(parent, "gorun-jobro-1.agent")
	mkTree(dead)
	withoutDACOverride(t, func() {
		// The test sees what a user sees: plain RemoveAll fails.
		if err := os.RemoveAll(plain); !errors.Is(err, os.ErrPermission) {
			t.Errorf("os.RemoveAll of a read-only tree: %v, want a permission error (the test cannot tell)", err)
		}
		if swept, err := sweepJobDirs(parent, "jobro"); err != nil || !slices.Equal(swept, []string{filepath.Base(dead)}) {
			t.Errorf("the sweep: %q, %v; want the dead agent's directory", swept, err)
		}
		if err := held.remove(); err != nil {
			t.Errorf("the agent's removal: %v", err)
		}
	})
	for _, p := range []string{dead, heldPath} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
}

// TestAgentSweepsBeside: the start's sweep is off the launch's critical
// path: the ranks start while it is still at work, and the agent waits
// for it before it exits.
func TestAgentSweepsBeside(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	release := make(chan struct{})
	var swept atomic.Bool
	j := startSwapJob(t, uniqueJob("sweepbeside"), []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}}, 0, swapOpts{with: func(c *Config) {
		c.shmDir = t.TempDir()
		c.sweeping = func() {
			select {
			case <-release:
			case <-t.Context().Done():
			}
			swept.Store(true)
		}
	}})
	j.until("the ranks' start, the sweep still at work", func(e *wire.Event) bool { return e.Kind == wire.EventEpoch })
	j.send(&wire.Control{Op: wire.OpKill})
	j.send(&wire.Control{Op: wire.OpExit})
	close(release)
	j.waitExit(t)
	if !swept.Load() {
		t.Error("the agent exited before its start's sweep ended")
	}
}
