package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// shmTestDir returns a fresh directory for segment files: in /dev/shm
// (tmpfs, as MPICH's) when there is one, else the test's own. It skips
// the test where the file system grants no leases.
func shmTestDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "agenttest-mpich-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	p := filepath.Join(dir, "probe")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(p)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := setLease(fd, unix.F_WRLCK); err != nil {
		t.Skipf("%s grants no write lease (%v): the sweep judges nothing there", dir, err)
	}
	return dir
}

// makeShmFile writes an MPICH-like segment file name in dir, modified
// age ago, and returns its path.
func makeShmFile(t *testing.T, dir, name string, age time.Duration) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	setAge(t, p, age)
	return p
}

// setAge sets p's times to age ago (negative: in the future).
func setAge(t *testing.T, p string, age time.Duration) {
	t.Helper()
	old := time.Now().Add(-age)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
}

// The mpichuser helper's segment path and mode.
const (
	mpichPathVar = "AGENTTEST_MPICH_PATH"
	mpichModeVar = "AGENTTEST_MPICH_MODE"
)

// mpichUser does what MPICH's first rank on a host does in MPI_Init
// (MPL_shm_seg_create_attach_templ): it creates the segment file
// (mpichPathVar) exclusively and writes its last byte to size it; then,
// in mode "map", maps it and closes the descriptor (a rank after its
// attach), in mode "open" keeps the descriptor only. It prints the path
// and keeps the file until killed (or its stdin ends), never unlinking
// it: a rank killed before its peers attached.
func mpichUser() int {
	const size = 1 << 16
	path := os.Getenv(mpichPathVar)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if _, err := f.WriteAt([]byte{0}, size-1); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	var mem []byte
	if os.Getenv(mpichModeVar) == "map" {
		mem, err = syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		f.Close()
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
	}
	fmt.Println(path)
	_, _ = io.Copy(io.Discard, os.Stdin)
	// The mapping and the descriptor live until here (no write: that
	// would make the file young).
	runtime.KeepAlive(mem)
	runtime.KeepAlive(f)
	return 0
}

// startMPICHUser starts an mpichuser child (under prefix, see
// startHelper) that makes path in mode, and makes the file old enough
// to be judged: only its use keeps it. end ends it (startHelper).
func startMPICHUser(t *testing.T, prefix []string, path, mode string) (cmd *exec.Cmd, end func()) {
	t.Helper()
	cmd, line, end := startHelper(t, prefix, "mpichuser", mpichPathVar+"="+path, mpichModeVar+"="+mode)
	if line != path {
		t.Fatalf("the mpichuser helper printed %q, want %s", line, path)
	}
	setAge(t, path, time.Minute)
	return cmd, end
}

// TestSweepMPICHFiles: the shm sweep, judged with the kernel's leases,
// keeps an MPICH segment file this process has open, one a child
// process has open, one a child has only mapped (descriptor closed), one
// too young, another user's, a link and names that are not MPICH's; it
// removes the old unused one, and with dry only lists it.
func TestSweepMPICHFiles(t *testing.T) {
	old := time.Minute
	for _, dry := range []bool{false, true} {
		t.Run(fmt.Sprintf("dry=%v", dry), func(t *testing.T) {
			dir := shmTestDir(t)
			open := makeShmFile(t, dir, "mpich_shar_tmpOpen01", old)
			f, err := os.Open(open)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			childOpen := filepath.Join(dir, "mpich_shar_tmpChOpen")
			startMPICHUser(t, nil, childOpen, "open")
			childMapped := filepath.Join(dir, "mpich_shar_tmpChMaps")
			startMPICHUser(t, nil, childMapped, "map")
			unused := makeShmFile(t, dir, "mpich_shar_tmpGone01", old)
			young := makeShmFile(t, dir, "mpich_shar_tmpYoung1", 0)
			keep := []string{open, childOpen, childMapped, young}
			for _, name := range []string{"mpich_shar_tmpX", "mpich_shar_tmp1234567", "mpich_shar_tmp12345_", "other_tmp123456", "gorun-job.0"} {
				keep = append(keep, makeShmFile(t, dir, name, old))
			}
			link := filepath.Join(dir, "mpich_shar_tmpLink01")
			if err := os.Symlink(unused, link); err != nil {
				t.Fatal(err)
			}
			keep = append(keep, link)
			if os.Getuid() == 0 {
				theirs := makeShmFile(t, dir, "mpich_shar_tmpTheir1", old)
				if err := os.Chown(theirs, 65534, 65534); err != nil {
					t.Fatal(err)
				}
				keep = append(keep, theirs)
			} else {
				t.Log("not root: another user's file is tried in TestSweepMPICHOtherUser only")
			}
			s, err := sweepShm(dir, "", dry, hostMPICHSweep())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.MPICHFiles, []string{"mpich_shar_tmpGone01"}) || len(s.OMPIDirs) != 0 {
				t.Errorf("swept %+v, want only mpich_shar_tmpGone01", s)
			}
			if s.young.IsZero() {
				t.Error("the young unused file is not reported as young")
			}
			for _, p := range keep {
				if _, err := os.Lstat(p); err != nil {
					t.Errorf("%s: %v (must be left)", filepath.Base(p), err)
				}
			}
			_, err = os.Lstat(unused)
			if gone := errors.Is(err, os.ErrNotExist); gone == dry {
				t.Errorf("the unused file after the sweep (dry %v): %v", dry, err)
			}
		})
	}
}

// TestSweepMPICHOtherUser: files that are not the sweep's user's are not
// judged, unused and old as they are (as non-root: the sweep is given
// another uid).
func TestSweepMPICHOtherUser(t *testing.T) {
	dir := shmTestDir(t)
	p := makeShmFile(t, dir, "mpich_shar_tmpOther", time.Minute)
	m := hostMPICHSweep()
	m.uid = os.Getuid() + 1
	s, err := sweepShm(dir, "", false, m)
	if err != nil || len(s.MPICHFiles) != 0 {
		t.Errorf("swept %+v, %v; want nothing", s, err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("the file: %v (must be left)", err)
	}
}

// mpichSweeper sweeps the directory mpichPathVar names as an agent
// does and prints what it removed, comma-separated (or "error: ...").
func mpichSweeper() int {
	s, err := sweepShm(os.Getenv(mpichPathVar), "", false, hostMPICHSweep())
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("swept:" + strings.Join(s.MPICHFiles, ","))
	return 0
}

// TestSweepMPICHOtherPIDNamespace: a segment mapped (descriptor closed)
// by a process in another PID namespace than the sweeper's is kept,
// both ways round: the user in a namespace of its own, and the sweeper
// in one (an agent in a container sharing the host's /dev/shm) that
// does not list the user at all (judged by /proc, it was removed under
// the live process). Once the user ended, it is removed.
func TestSweepMPICHOtherPIDNamespace(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("not root: unshare --pid needs CAP_SYS_ADMIN")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skipf("no unshare (util-linux): %v", err)
	}
	inNS := []string{unshare, "--pid", "--fork", "--mount-proc"}
	t.Run("user inside", func(t *testing.T) {
		dir := shmTestDir(t)
		path := filepath.Join(dir, "mpich_shar_tmpPidNs1")
		_, end := startMPICHUser(t, inNS, path, "map")
		sweepKeeps(t, path, "with its user alive in another PID namespace")
		// Its stdin's end ends it; unshare --fork returns once it has
		// reaped it, and the namespace with it.
		end()
		sweepRemoves(t, path, "after its user ended")
	})
	t.Run("sweeper inside", func(t *testing.T) {
		dir := shmTestDir(t)
		path := filepath.Join(dir, "mpich_shar_tmpPidNs2")
		_, end := startMPICHUser(t, nil, path, "map")
		sweep := func() string {
			_, line, _ := startHelper(t, inNS, "mpichsweeper", mpichPathVar+"="+dir)
			return line
		}
		if got := sweep(); got != "swept:" {
			t.Errorf("with its user alive outside the sweeper's PID namespace: %q, want nothing swept", got)
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("the live segment: %v", err)
		}
		end()
		if got, want := sweep(), "swept:"+filepath.Base(path); got != want {
			t.Errorf("after its user ended: %q, want %q", got, want)
		}
	})
}

// TestSweepMPICHCreatorKilled: the segment of another process that has
// it only mapped (MPICH's creator after its attach) is kept; once that
// process is killed, the sweep removes it.
func TestSweepMPICHCreatorKilled(t *testing.T) {
	dir := shmTestDir(t)
	path := filepath.Join(dir, "mpich_shar_tmpKilled")
	cmd, _ := startMPICHUser(t, nil, path, "map")
	sweepKeeps(t, path, "with its creator alive")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // reaped: its mapping is gone
	sweepRemoves(t, path, "after its creator was killed")
}

// sweepKeeps sweeps path's directory as an agent does and fails the
// test (saying when: ctx) unless nothing was removed.
func sweepKeeps(t *testing.T, path, ctx string) {
	t.Helper()
	s, err := sweepShm(filepath.Dir(path), "", false, hostMPICHSweep())
	if err != nil || len(s.MPICHFiles) != 0 {
		t.Errorf("%s: swept %+v, %v; want nothing", ctx, s, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s: the live segment: %v", ctx, err)
	}
}

// sweepRemoves sweeps path's directory as an agent does and fails the
// test (saying when: ctx) unless path, and only it, was removed.
func sweepRemoves(t *testing.T, path, ctx string) {
	t.Helper()
	s, err := sweepShm(filepath.Dir(path), "", false, hostMPICHSweep())
	if err != nil || !slices.Equal(s.MPICHFiles, []string{filepath.Base(path)}) {
		t.Errorf("%s: swept %+v, %v; want %s", ctx, s, err, filepath.Base(path))
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: the dead segment is still there: %v", ctx, err)
	}
}

// TestSweepMPICHLeasesOff: where the kernel refuses leases as such
// (ENOLCK: fs.leases-enable=0; EINVAL: a file system without them), no
// file is removed, the sweep says so with errLeasesOff, and it stops at
// the first refusal.
func TestSweepMPICHLeasesOff(t *testing.T) {
	for _, refusal := range []error{unix.ENOLCK, unix.EINVAL} {
		t.Run(refusal.Error(), func(t *testing.T) {
			dir := shmTestDir(t)
			a := makeShmFile(t, dir, "mpich_shar_tmpAAAAAA", time.Minute)
			b := makeShmFile(t, dir, "mpich_shar_tmpBBBBBB", time.Minute)
			calls := 0
			m := mpichSweep{uid: os.Getuid(), lease: func(fd, typ int) error {
				calls++
				return refusal
			}}
			s, err := sweepShm(dir, "", false, m)
			if !errors.Is(err, errLeasesOff) || !errors.Is(err, refusal) || len(s.MPICHFiles) != 0 {
				t.Errorf("swept %+v, %v; want nothing and errLeasesOff", s, err)
			}
			if calls != 1 {
				t.Errorf("%d leases asked for, want 1 (the first refusal stops the sweep)", calls)
			}
			for _, p := range []string{a, b} {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%v (must be left)", err)
				}
			}
		})
	}
}

// TestSweepMPICHAge: a file is judged once it was modified mpichMinAge
// before the sweep's start; until then it is young, and when it becomes
// old enough is at most mpichMinAge after the start, even for a
// modification time in the future (a clock stepped back, touch -d): the
// agent's end sweep waits that long.
func TestSweepMPICHAge(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	for _, tc := range []struct {
		name      string
		mod       time.Time
		swept     bool
		wantYoung time.Time
	}{
		{"old", now.Add(-mpichMinAge), true, time.Time{}},
		{"young", now.Add(-time.Second), false, now.Add(mpichMinAge - time.Second)},
		{"now", now, false, now.Add(mpichMinAge)},
		{"in the future", now.Add(time.Hour), false, now.Add(mpichMinAge)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := shmTestDir(t)
			p := makeShmFile(t, dir, "mpich_shar_tmpAge001", 0)
			if err := os.Chtimes(p, tc.mod, tc.mod); err != nil {
				t.Fatal(err)
			}
			m := hostMPICHSweep()
			m.now = func() time.Time { return now }
			s, err := sweepShm(dir, "", false, m)
			if err != nil {
				t.Fatal(err)
			}
			if swept := len(s.MPICHFiles) == 1; swept != tc.swept {
				t.Errorf("swept %v, want %v", s.MPICHFiles, tc.swept)
			}
			if !s.young.Equal(tc.wantYoung) {
				t.Errorf("young until %v, want %v", s.young, tc.wantYoung)
			}
		})
	}
}

// TestSweepMPICHReplacedUnderLease: a file whose name was given to
// another file between the judgement and the removal (mkstemp picked
// the name again) is not removed: the name is checked again while the
// lease is held.
func TestSweepMPICHReplacedUnderLease(t *testing.T) {
	dir := shmTestDir(t)
	p := makeShmFile(t, dir, "mpich_shar_tmpSwap01", time.Minute)
	next := makeShmFile(t, dir, "next", time.Minute)
	m := hostMPICHSweep()
	m.lease = func(fd, typ int) error {
		if typ == unix.F_WRLCK {
			if err := os.Rename(next, p); err != nil {
				t.Error(err)
			}
		}
		return setLease(fd, typ)
	}
	s, err := sweepShm(dir, "", false, m)
	if err != nil || len(s.MPICHFiles) != 0 {
		t.Errorf("swept %+v, %v; want nothing", s, err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("the new file of the name: %v (must be left)", err)
	}
}

// TestUnusedMPICHFiles: the leak check's view lists the unused old files
// among those it is asked about, removing none.
func TestUnusedMPICHFiles(t *testing.T) {
	dir := shmTestDir(t)
	asked := makeShmFile(t, dir, "mpich_shar_tmpAsked1", time.Minute)
	notAsked := makeShmFile(t, dir, "mpich_shar_tmpNotAsk", time.Minute)
	got, err := UnusedMPICHFiles(dir, func(n string) bool { return n != filepath.Base(notAsked) })
	if err != nil || !slices.Equal(got, []string{filepath.Base(asked)}) {
		t.Errorf("UnusedMPICHFiles: %q, %v; want %s", got, err, filepath.Base(asked))
	}
	for _, p := range []string{asked, notAsked} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%v (must be left)", err)
		}
	}
}

func TestMPICHShmName(t *testing.T) {
	for name, want := range map[string]bool{
		"mpich_shar_tmpaB3xZ9":  true,
		"mpich_shar_tmp000000":  true,
		"mpich_shar_tmp":        false,
		"mpich_shar_tmpabcde":   false,
		"mpich_shar_tmpabcdefg": false,
		"mpich_shar_tmpabc.ef":  false,
		"xmpich_shar_tmpabcdef": false,
		"gorun-j-h0-g0":         false,
	} {
		if got := MPICHShmName(name); got != want {
			t.Errorf("MPICHShmName(%q) = %v, want %v", name, got, want)
		}
	}
}
