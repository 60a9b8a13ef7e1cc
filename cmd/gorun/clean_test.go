package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/agent"
)

// TestClean: gorun clean removes an ended job's leftovers (a job
// directory whose holder was killed, the slot files, socket directory
// (/dev/shm being a tmpfs) and Open MPI directory of a job nobody claims, an MPICH segment file nobody has
// open or mapped) and keeps a running job's, lists
// them only with -n, and says nothing when nothing is left.
func TestClean(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep(1) to hold a lock")
	}
	tmp, shm := t.TempDir(), t.TempDir()
	// In /dev/shm where it is a tmpfs: gorun clean looks for socket
	// directories only on one.
	var st syscall.Statfs_t
	onTmpfs := syscall.Statfs("/dev/shm", &st) == nil && st.Type == 0x01021994
	if onTmpfs {
		var err error
		if shm, err = os.MkdirTemp("/dev/shm", "cleantest-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(shm) })
	} else {
		t.Log("/dev/shm is not a tmpfs: no socket directory is tried")
	}
	o := agent.CleanOptions{TempDir: tmp, ShmDir: shm}
	mkdir := func(p string) string {
		t.Helper()
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "f"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lock := func(p string, how int) *os.File {
		t.Helper()
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	// The ended job's agent: its lock went to a process that was then
	// killed.
	deadDir := mkdir(filepath.Join(tmp, "gorun-endedjob-1.agent"))
	f := lock(deadDir, syscall.LOCK_EX)
	holder := exec.Command("sleep", "600")
	holder.ExtraFiles = []*os.File{f}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close() // the holder has it now
	// A running job's agent, holding its directory; another program's
	// directory named alike.
	liveDir := mkdir(filepath.Join(tmp, "gorun-livejob-2.agent"))
	lock(liveDir, syscall.LOCK_EX)
	other := mkdir(filepath.Join(tmp, "gorun-e2e-bin-3"))
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	// Slot files: the ended job's lock file is held by nobody, the
	// running job's is claimed.
	regions := []ckpt.Region{{Name: "optimizer", Size: 64}}
	for _, job := range []string{"endedjob", "livejob"} {
		s, err := ckpt.Create(job, 0, regions, ckpt.Options{Dir: shm})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	if err := os.WriteFile(filepath.Join(shm, "gorun-endedjob.lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	claim, err := ckpt.ClaimJob("livejob", ckpt.Options{Dir: shm})
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Release()
	// Socket directories: the ended job's agent's, nobody holding it,
	// and the running job's, held.
	var deadSock, liveSock string
	if onTmpfs {
		deadSock = mkdir(filepath.Join(shm, "gorun-endedjob-4.sock"))
		liveSock = mkdir(filepath.Join(shm, "gorun-livejob-5.sock"))
		lock(liveSock, syscall.LOCK_EX)
	}
	deadOMPI := mkdir(filepath.Join(shm, "gorun-endedjob-h0-g1"))
	liveOMPI := mkdir(filepath.Join(shm, "gorun-livejob-h0-g0"))
	lock(liveOMPI, syscall.LOCK_SH)
	// MPICH segment files: one a killed rank left, one in use (open).
	mpichFile := func(name string) string {
		t.Helper()
		p := filepath.Join(shm, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
		return p
	}
	deadMPICH, liveMPICH := mpichFile("mpich_shar_tmpAbC123"), mpichFile("mpich_shar_tmpLive00")
	lock(liveMPICH, syscall.LOCK_SH) // open here: in use

	shmFiles := func(job string) []string {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(shm, "gorun-"+job+".*"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	kept := []string{liveDir, other, liveOMPI, liveMPICH}
	dead := []string{deadDir, deadOMPI, deadMPICH}
	if onTmpfs {
		kept, dead = append(kept, liveSock), append(dead, deadSock)
	}
	check := func(what string, args []string, wantOut string, gone bool) {
		t.Helper()
		var out, errb bytes.Buffer
		if code := runClean(args, o, &out, &errb); code != exitOK || out.String() != wantOut || errb.Len() != 0 {
			t.Errorf("%s: gorun clean %q: exit %d\n%s%s\nwant exit 0 and\n%s", what, args, code, out.String(), errb.String(), wantOut)
		}
		for _, p := range dead {
			if _, err := os.Stat(p); (err == nil) == gone {
				t.Errorf("%s: %s: %v (want gone: %v)", what, p, err, gone)
			}
		}
		if n := len(shmFiles("endedjob")); (n == 0) != gone {
			t.Errorf("%s: %d slot files of the ended job left (want gone: %v)", what, n, gone)
		}
		if len(shmFiles("livejob")) == 0 {
			t.Errorf("%s: the running job's slot files were removed", what)
		}
		for _, p := range kept {
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s: %v (must be kept)", what, err)
			}
		}
	}
	list := func(verb string) string {
		sock := ""
		if onTmpfs {
			sock = verb + " socket directory " + deadSock + "\n"
		}
		return verb + " job directory " + deadDir + "\n" + sock +
			verb + " protected state of job endedjob in " + shm + "\n" +
			verb + " Open MPI directory " + deadOMPI + "\n" +
			verb + " MPICH shared-memory file " + deadMPICH + "\n"
	}
	check("dry run", []string{"-n"}, list("would remove"), false)
	check("dry run", []string{"--dry-run"}, list("would remove"), false)
	check("clean", nil, list("removed"), true)
	check("nothing left", nil, "", true)
}

// TestCleanUsage: gorun clean's usage errors exit 2, its help 0, and
// gorun dispatches to it.
func TestCleanUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout (exit 0) or stderr
	}{
		{[]string{"clean", "-h"}, exitOK, "Usage: gorun clean [-n]"},
		{[]string{"clean", "--help"}, exitOK, "Usage: gorun clean [-n]"},
		{[]string{"clean", "--bogus"}, exitUsage, "flag provided but not defined"},
		{[]string{"clean", "job1"}, exitUsage, `unexpected argument "job1"`},
		{[]string{"clean", "-n", "x"}, exitUsage, `unexpected argument "x"`},
	} {
		var out, errb bytes.Buffer
		code := Main(tc.args, nil, &out, &errb)
		got := errb.String()
		if code == exitOK {
			got = out.String()
		}
		if code != tc.code || !strings.Contains(got, tc.out) {
			t.Errorf("gorun %q: exit %d, stdout %q, stderr %q; want exit %d with %q", tc.args, code, out.String(), errb.String(), tc.code, tc.out)
		}
	}
	if !slices.ContainsFunc(strings.Split(runUsage(), "\n"), func(l string) bool { return strings.HasPrefix(l, "gorun clean") }) {
		t.Error("gorun --help does not mention gorun clean")
	}
}
