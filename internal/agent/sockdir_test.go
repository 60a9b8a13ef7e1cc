package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
)

// shmTmpDir returns a fresh directory in /dev/shm, removed at the test's
// end; the test is skipped where /dev/shm is not a tmpfs.
func shmTmpDir(t *testing.T) string {
	t.Helper()
	if !isTmpfs("/dev/shm", nil) {
		t.Skip("/dev/shm is not a tmpfs here")
	}
	dir, err := os.MkdirTemp("/dev/shm", "agenttest-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fsType is a statfs that says every directory is on a file system of
// type typ.
func fsType(typ int64) statfsFunc {
	return func(_ string, st *syscall.Statfs_t) error {
		st.Type = typ
		return nil
	}
}

// TestSockDir: on a tmpfs the socket directory is made 0700 and held,
// named for its job; the sweep of its parent removes a socket directory
// nobody holds and leaves the held one (and a job directory of the same
// job, not its to judge); its removal leaves nothing.
func TestSockDir(t *testing.T) {
	shm := shmTmpDir(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d := makeSockDir(shm, "joba", nil, log)
	if d == nil {
		t.Fatal("no socket directory on a tmpfs")
	}
	if !d.held() {
		t.Error("the socket directory is not held")
	}
	if job, ok := sockDirJob(filepath.Base(d.path)); !ok || job != "joba" || filepath.Dir(d.path) != shm {
		t.Errorf("socket directory %s: job %q %v", d.path, job, ok)
	}
	if st, err := os.Stat(d.path); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("socket directory mode: %v (%v)", st.Mode(), err)
	}
	orphan := filepath.Join(shm, "gorun-joba-1.sock")
	jobDir := filepath.Join(shm, "gorun-joba-2.agent")
	for _, p := range []string{orphan, jobDir} {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	sweepSockDirsLog(shm, "", log)
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the unheld socket directory is still there (%v)", err)
	}
	for _, p := range []string{d.path, jobDir} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v (must be left)", p, err)
		}
	}
	if err := os.Remove(jobDir); err != nil {
		t.Fatal(err)
	}
	if err := d.remove(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(shm); len(left) != 0 {
		t.Errorf("left after the removal: %v", left)
	}
}

// TestSockDirFallback: where the directory is not a tmpfs, or statfs
// fails, or it cannot be made there, there is no socket directory (the
// sockets go in the job directory), and nothing is made.
func TestSockDirFallback(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	statfsErr := func(string, *syscall.Statfs_t) error { return syscall.EACCES }
	for _, tc := range []struct {
		name   string
		parent func(t *testing.T) string
		statfs statfsFunc
	}{
		{"ext4", func(t *testing.T) string { return t.TempDir() }, fsType(0xef53)},
		{"statfs fails", func(t *testing.T) string { return t.TempDir() }, statfsErr},
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none") }, fsType(tmpfsMagic)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := tc.parent(t)
			if d := makeSockDir(parent, "joba", &jobDirSys{statfs: tc.statfs}, log); d != nil {
				t.Errorf("socket directory %s made", d.path)
				d.remove()
			}
			if left, _ := os.ReadDir(parent); len(left) != 0 {
				t.Errorf("made: %v", left)
			}
		})
	}
	// And the agent's sockets are then in its job directory.
	a := &agent{dir: "/tmp/gorun-j-1.agent"}
	if got, want := a.rankSocket(3), "/tmp/gorun-j-1.agent/rank-3.sock"; got != want {
		t.Errorf("rank socket %s, want %s", got, want)
	}
	a.sockDir = &heldJobDir{path: "/dev/shm/gorun-j-2.sock"}
	if got, want := a.rankSocket(3), "/dev/shm/gorun-j-2.sock/rank-3.sock"; got != want {
		t.Errorf("rank socket %s, want %s", got, want)
	}
}

// TestCleanSockDirs: gorun clean lists (-n) and removes the socket
// directories in a tmpfs ShmDir that nobody holds, and keeps a held one.
func TestCleanSockDirs(t *testing.T) {
	shm := shmTmpDir(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	held := makeSockDir(shm, "livejob", nil, log)
	if held == nil {
		t.Fatal("no socket directory on a tmpfs")
	}
	defer held.remove()
	ended := filepath.Join(shm, "gorun-endedjob-7.sock")
	if err := os.Mkdir(ended, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ended, "rank-0.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		c, err := Clean(CleanOptions{DryRun: dry, TempDir: t.TempDir(), ShmDir: shm})
		if err != nil {
			t.Fatal(err)
		}
		if len(c.SockDirs) != 1 || c.SockDirs[0] != ended {
			t.Errorf("dry run %v: socket directories %q, want %q", dry, c.SockDirs, ended)
		}
		_, err = os.Stat(ended)
		if gone := errors.Is(err, os.ErrNotExist); gone != !dry {
			t.Errorf("dry run %v: the ended job's socket directory removed: %v (%v)", dry, gone, err)
		}
		if _, err := os.Stat(held.path); err != nil {
			t.Errorf("dry run %v: the held socket directory: %v", dry, err)
		}
	}
}

// TestMakeNamedDirSwapped: a directory another user put under the name
// of the one just made (renaming that away: a parent others may write,
// not sticky) between its creation and its opening is refused: the job
// and socket directories are made only of this user's 0700 directories.
// The swapped one is left where it is (not ours to remove).
func TestMakeNamedDirSwapped(t *testing.T) {
	type swap struct {
		name string
		mode os.FileMode
		uid  int // -1: this user
	}
	swaps := []swap{{"mode 0777", 0o777, -1}, {"mode 0750", 0o750, -1}}
	if os.Geteuid() == 0 {
		swaps = append(swaps, swap{"another user's", 0o700, 65534})
	} else {
		t.Log("not root: another user's directory is not tried")
	}
	// A file system without flock keeps the directory unheld: it is
	// checked all the same.
	noFlock := func(int, int) error { return syscall.ENOSYS }
	for _, suffix := range []string{jobDirSuffix, sockDirSuffix} {
		for _, sw := range swaps {
			for _, flock := range []func(int, int) error{nil, noFlock} {
				t.Run(fmt.Sprintf("%s %s held %v", sw.name, suffix, flock == nil), func(t *testing.T) {
					parent := t.TempDir()
					var swapped string
					made := func(path string) {
						if swapped != "" {
							return
						}
						swapped = path
						if err := os.Rename(path, path+".moved"); err != nil {
							t.Fatal(err)
						}
						if err := os.Mkdir(path, sw.mode); err != nil {
							t.Fatal(err)
						}
						if err := os.Chmod(path, sw.mode); err != nil { // past the umask
							t.Fatal(err)
						}
						if sw.uid >= 0 {
							if err := os.Chown(path, sw.uid, sw.uid); err != nil {
								t.Fatal(err)
							}
						}
					}
					d, err := makeNamedDir(parent, "jobswap", suffix, "directory", &jobDirSys{made: made, flock: flock})
					if err == nil {
						path := d.path
						d.remove()
						t.Fatalf("made %s in the swapped directory; want a refusal", path)
					}
					if !errors.Is(err, errNotOwnDir) || !strings.Contains(err.Error(), swapped) {
						t.Errorf("error %v; want errNotOwnDir naming %s", err, swapped)
					}
					if st, serr := os.Stat(swapped); serr != nil || st.Mode().Perm() != sw.mode {
						t.Errorf("the swapped directory: %v (%v), want it left with mode %v", st, serr, sw.mode)
					}
				})
			}
		}
	}
}

// TestSockDirUnsafeParent: no socket directory is made in a tmpfs
// directory where another user could rename it away: world-writable
// without the sticky bit (a Kubernetes Memory emptyDir), or another
// user's. A sticky world-writable one (/dev/shm's usual 1777) will do.
func TestSockDirUnsafeParent(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name string
		mode os.FileMode
		uid  int // -1: this user
		ok   bool
	}{
		{"0777", 0o777, -1, false},
		{"0770", 0o770, -1, false},
		{"1777", 0o777 | os.ModeSticky, -1, true},
		{"0755 another user's", 0o755, 65534, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.uid >= 0 && os.Geteuid() != 0 {
				t.Skip("not root: cannot give a directory to another user")
			}
			shm := shmTmpDir(t)
			if err := os.Chmod(shm, tc.mode); err != nil {
				t.Fatal(err)
			}
			if tc.uid >= 0 {
				if err := os.Chown(shm, tc.uid, tc.uid); err != nil {
					t.Fatal(err)
				}
			}
			d := makeSockDir(shm, "jobunsafe", nil, log)
			if (d != nil) != tc.ok {
				t.Errorf("socket directory made: %v, want %v", d != nil, tc.ok)
			}
			if d != nil {
				if err := d.remove(); err != nil {
					t.Fatal(err)
				}
			}
			if left, _ := os.ReadDir(shm); len(left) != 0 {
				t.Errorf("left in %s: %v", shm, left)
			}
		})
	}
}

// envOf parses rankProbe's record of its environment.
func envOf(record string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(record, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env
}

// TestRanksTMPDIRHoldsNoSockets: the ranks' TMPDIR is in the agent's job
// directory and never the directory of its sockets: where the agent's
// shm is not a tmpfs (ext4 here) the sockets are in the job directory
// and TMPDIR below it; on a tmpfs they are in the socket directory there
// and TMPDIR is the job directory.
func TestRanksTMPDIRHoldsNoSockets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shm   func(t *testing.T) string
		tmpfs bool
	}{
		{"ext4", func(t *testing.T) string { return t.TempDir() }, false},
		{"tmpfs", shmTmpDir, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shm := tc.shm(t)
			if isTmpfs(shm, nil) != tc.tmpfs {
				t.Skipf("%s: tmpfs %v, want %v", shm, !tc.tmpfs, tc.tmpfs)
			}
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			job := uniqueJob("tmpdirsock" + tc.name)
			j := startSwapJob(t, job, []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}}, 0, swapOpts{with: func(c *Config) {
				c.shmDir, c.slotDir = shm, shm
			}})
			env := envOf(j.waitFile("rank-0-gen-0-epoch-0.env"))
			jobDirs, err := filepath.Glob(filepath.Join(tmp, "gorun-"+job+"-*.agent"))
			if err != nil || len(jobDirs) != 1 {
				t.Fatalf("the agent's job directories: %v (%v), want one", jobDirs, err)
			}
			rankTmp, sockDir := env["TMPDIR"], filepath.Dir(env[wire.EnvSocket])
			if rel, err := filepath.Rel(jobDirs[0], rankTmp); rankTmp == "" || err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				t.Errorf("the ranks' TMPDIR %q is not in the job directory %s", rankTmp, jobDirs[0])
			}
			if env[wire.EnvSocket] == "" || sockDir == filepath.Clean(rankTmp) {
				t.Errorf("GORUN_SOCKET %q is in the ranks' TMPDIR %q", env[wire.EnvSocket], rankTmp)
			}
			wantSockDir := jobDirs[0]
			if tc.tmpfs {
				socks, _ := filepath.Glob(filepath.Join(shm, "gorun-"+job+"-*.sock"))
				if len(socks) != 1 {
					t.Fatalf("socket directories in %s: %v, want one", shm, socks)
				}
				wantSockDir = socks[0]
			}
			if sockDir != wantSockDir {
				t.Errorf("GORUN_SOCKET %s, want it in %s", env[wire.EnvSocket], wantSockDir)
			}
			j.send(&wire.Control{Op: wire.OpKill})
			j.send(&wire.Control{Op: wire.OpExit})
			j.waitExit(t)
		})
	}
}

// TestAgentSweepsSockDirs: on a tmpfs shm an agent sweeps the socket
// directories nobody holds when it starts (every job's) and when it ends
// (its own job's: those of its job's agents killed on the host
// meanwhile), as it does the job directories; it removes its own.
func TestAgentSweepsSockDirs(t *testing.T) {
	shm := shmTmpDir(t)
	t.Setenv("TMPDIR", t.TempDir())
	job := uniqueJob("sockdirsweep")
	mk := func(name string) string {
		t.Helper()
		p := filepath.Join(shm, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "rank-0.sock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	before := mk("gorun-endedjob-1.sock")
	j := startSwapJob(t, job, []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}}, 0, swapOpts{with: func(c *Config) {
		c.shmDir, c.slotDir = shm, shm
	}})
	j.waitFile("rank-0.welcome") // the rank reached its socket
	// The start's sweep runs beside the launch. Once it removed the
	// ended job's directory it has read its list of names: what the
	// test makes from now on is not in it.
	for {
		if _, err := os.Stat(before); errors.Is(err, os.ErrNotExist) {
			break
		}
		select {
		case <-j.ctx.Done():
			t.Fatal("the agent's start did not sweep an ended job's socket directory")
		case <-time.After(5 * time.Millisecond):
		}
	}
	own, err := filepath.Glob(filepath.Join(shm, "gorun-"+job+"-*.sock"))
	if err != nil || len(own) != 1 {
		t.Fatalf("the agent's socket directories: %v (%v), want one", own, err)
	}
	// Killed agents of the job, and of another, on the same /dev/shm.
	sameJob, otherJob := mk("gorun-"+job+"-2.sock"), mk("gorun-otherjob-3.sock")
	j.send(&wire.Control{Op: wire.OpKill})
	j.send(&wire.Control{Op: wire.OpExit})
	j.waitExit(t)
	for _, gone := range []string{own[0], sameJob} {
		if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v)", gone, err)
		}
	}
	if _, err := os.Stat(otherJob); err != nil {
		t.Errorf("the ending agent swept another job's socket directory: %v", err)
	}
}
