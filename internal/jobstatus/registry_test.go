package jobstatus

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func entry(job string, pid int) *Entry {
	return &Entry{Job: job, PID: pid, Start: time.Now(), Prog: "train", URL: "nats://127.0.0.1:1", Seed: "SUAsecret"}
}

// TestRegistry: an entry is written 0600 in a 0700 directory, listed,
// found by id or prefix, and its removal removes the directory once empty.
func TestRegistry(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "reg")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A temporary file a crashed launcher left does not stop the next.
	if err := os.WriteFile(filepath.Join(dir, "aaa1.json.tmp"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rm1, err := Register(dir, entry("aaa1", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	rm2, err := Register(dir, entry("aab2", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("registry directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	fi, err = os.Stat(filepath.Join(dir, "aaa1.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("entry: %v, %v; want mode 0600", fi.Mode(), err)
	}
	// What is not an entry is skipped: garbage, an entry under another
	// job's name, other names.
	for name, data := range map[string]string{"zzz.json": "garbage", "ccc.json": `{"job":"ddd","pid":1}`, "notes.txt": "{}", "aaa1.json.tmp": "{}"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	es, err := List(dir)
	if err != nil || len(es) != 2 {
		t.Fatalf("List: %d entries, %v", len(es), err)
	}
	for _, tt := range []struct {
		id, want string
		err      error
	}{
		{"aaa1", "aaa1", nil}, {"aab", "aab2", nil}, {"aa", "", ErrAmbiguous}, {"", "", ErrAmbiguous}, {"b", "", ErrNoJob},
	} {
		e, err := Find(es, tt.id)
		if !errors.Is(err, tt.err) || err == nil && e.Job != tt.want {
			t.Errorf("Find(%q) = %v, %v; want %s, %v", tt.id, e, err, tt.want, tt.err)
		}
	}
	for _, name := range []string{"zzz.json", "ccc.json", "notes.txt", "aaa1.json.tmp"} {
		os.Remove(filepath.Join(dir, name))
	}
	rm1()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the directory went while an entry is left: %v", err)
	}
	rm2()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the empty registry directory stays: %v", err)
	}
	if es, err := List(dir); err != nil || len(es) != 0 {
		t.Fatalf("List of no directory: %v, %v", es, err)
	}
}

// TestRegistryStale: an entry whose launcher is dead (SIGKILLed) is not
// listed, and List removes it, and the directory once empty.
func TestRegistryStale(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "reg")
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := cmd.Process.Pid // reaped: no such process (barring reuse)
	if _, err := Register(dir, entry("dead", dead)); err != nil {
		t.Fatal(err)
	}
	es, err := List(dir)
	if err != nil || len(es) != 0 {
		t.Fatalf("List: %v, %v; want no entry", es, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stale entry's directory stays: %v", err)
	}
}

// TestRegistryUnsafeDir: a directory others can write, or a file in its
// place, is refused by Register and List.
func TestRegistryUnsafeDir(t *testing.T) {
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"world-writable": open, "a file": file} {
		t.Run(name, func(t *testing.T) {
			if _, err := Register(dir, entry("job1", os.Getpid())); !errors.Is(err, ErrBadRegistry) {
				t.Errorf("Register: %v, want ErrBadRegistry", err)
			}
			if _, err := List(dir); !errors.Is(err, ErrBadRegistry) {
				t.Errorf("List: %v, want ErrBadRegistry", err)
			}
		})
	}
	if os.Getuid() == 0 {
		// root: a directory of another user.
		other := filepath.Join(t.TempDir(), "other")
		if err := os.Mkdir(other, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := Register(other, entry("job1", os.Getpid())); !errors.Is(err, ErrBadRegistry) {
			t.Errorf("Register in another user's directory: %v, want ErrBadRegistry", err)
		}
	}
	if _, err := Register(t.TempDir(), entry("Bad/Id", os.Getpid())); err == nil {
		t.Error("Register accepted a bad job id")
	}
}

func TestDir(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/7")
	if d := Dirs(); d[0] != "/run/user/7/gorun" {
		t.Errorf("Dirs = %s with XDG_RUNTIME_DIR", d)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("TMPDIR", "/tmp/x")
	t.Setenv("HOME", "/home/u")
	d := Dirs()
	if want := filepath.Join("/tmp/x", "gorun-"+itoa(os.Getuid())); d[0] != want {
		t.Errorf("Dirs = %s, want %s first", d, want)
	}
	if want := "/home/u/.local/state/gorun"; d[len(d)-1] != want || !slices.Contains(d, "/tmp/gorun-"+itoa(os.Getuid())) {
		t.Errorf("Dirs = %s, want /tmp/gorun-<uid> and %s last", d, want)
	}
}

// TestRegistryDirRemovedMeanwhile: another launcher (or gorun status
// removing a stale entry) may remove the empty directory at any moment
// between Register's Mkdir and its file: Register makes it again. Before
// the fix a removal between Mkdir and checkDir's Lstat failed the
// registration ("lstat …: no such file or directory").
func TestRegistryDirRemovedMeanwhile(t *testing.T) {
	for _, times := range []int{1, 3} {
		t.Run(itoa(times), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "reg")
			n := 0
			testHookMkdir = func() {
				if n < times {
					n++
					if err := os.Remove(dir); err != nil {
						t.Errorf("removing the directory: %v", err)
					}
				}
			}
			defer func() { testHookMkdir = nil }()
			rm, err := Register(dir, entry("job1", os.Getpid()))
			if err != nil {
				t.Fatalf("Register: %v", err)
			}
			if es, err := List(dir); err != nil || len(es) != 1 {
				t.Fatalf("List: %v, %v; want the entry", es, err)
			}
			rm()
		})
	}
}

// TestRegistryStaleProcess: an entry is the launcher's only while its
// PID names the same process (the start time /proc gives, saved in the
// entry) and that process is not a zombie: a reused PID (here pid 1, or
// this process with another start time) or a SIGKILLed launcher not yet
// reaped is stale, unlisted and removed. An entry of another host (a
// TMPDIR or $HOME shared between nodes) is not this host's to judge:
// unlisted, and kept.
func TestRegistryStaleProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "reg")
	write := func(e *Entry) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(e)
		p := filepath.Join(dir, e.Job+".json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	start, err := procStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	zstart, err := procStart(zombie.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// Not reaped: a zombie once it has exited (poll its state).
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", zombie.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && bytes.HasPrefix(b[i+1:], []byte(" Z")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child is not a zombie: %s", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	live := write(&Entry{Job: "live", PID: os.Getpid(), PIDStart: start, Host: host, Start: time.Now()})
	other := write(&Entry{Job: "other", PID: os.Getpid(), PIDStart: start, Host: host + "-elsewhere", Start: time.Now()})
	stale := map[string]string{
		"pid1":    write(&Entry{Job: "pid1", PID: 1, Host: host, Start: time.Now()}),
		"reused":  write(&Entry{Job: "reused", PID: os.Getpid(), PIDStart: start + 1, Host: host, Start: time.Now()}),
		"zombie":  write(&Entry{Job: "zombie", PID: zombie.Process.Pid, PIDStart: zstart, Host: host, Start: time.Now()}),
		"nostart": write(&Entry{Job: "nostart", PID: os.Getpid(), Host: host, Start: time.Now()}),
	}
	es, err := List(dir)
	if err != nil || len(es) != 1 || es[0].Job != "live" {
		var jobs []string
		for _, e := range es {
			jobs = append(jobs, e.Job)
		}
		t.Fatalf("List: %v, %v; want only the live entry", jobs, err)
	}
	for _, p := range []string{live, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
	for name, p := range stale {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale entry %s kept: %v", name, err)
		}
	}
}

// TestRegisterFillsProcess: Register records the launcher's host and
// its process's start time.
func TestRegisterFillsProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "reg")
	rm, err := Register(dir, entry("job1", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer rm()
	es, err := List(dir)
	if err != nil || len(es) != 1 {
		t.Fatalf("List: %v, %v", es, err)
	}
	host, _ := os.Hostname()
	start, _ := procStart(os.Getpid())
	if es[0].Host != host || es[0].PIDStart != start || start == 0 {
		t.Errorf("entry host %q start %d; want %q, %d", es[0].Host, es[0].PIDStart, host, start)
	}
}

// TestDirSquatted: when another user (here: a mode others may write)
// holds os.TempDir()/gorun-<uid>, which anyone can create while none of
// the user's jobs runs, the registry moves to $HOME/.local/state/gorun
// (made by Register) instead of turning gorun status off; before, every
// launch warned and gorun status failed with "unsafe registry directory".
func TestDirSquatted(t *testing.T) {
	tmp, home := t.TempDir(), t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("TMPDIR", tmp)
	t.Setenv("HOME", home)
	squat := filepath.Join(tmp, "gorun-"+itoa(os.Getuid()))
	if err := os.Mkdir(squat, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(squat, 0o777); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(home, ".local", "state", "gorun")
	dir, rm, err := RegisterFirst([]string{squat, want}, entry("job1", os.Getpid()))
	if err != nil || dir != want {
		t.Fatalf("RegisterFirst = %s, %v with %s squatted, want %s", dir, err, squat, want)
	}
	if es, err := ListAll([]string{squat, want}); err != nil || len(es) != 1 {
		t.Fatalf("ListAll: %v, %v", es, err)
	}
	rm()
	if _, err := os.Stat(want); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the empty registry directory stays: %v", err)
	}
}

// TestDirsOtherEnvironment: a job started without XDG_RUNTIME_DIR (cron,
// nohup under su, a batch script) registers in os.TempDir()/gorun-<uid>;
// gorun status run where XDG_RUNTIME_DIR is set finds it, since ListAll
// searches every candidate directory (Dirs). Before, gorun status looked
// only in $XDG_RUNTIME_DIR/gorun (Dir) and said "no running gorun job".
// A job whose XDG_RUNTIME_DIR cannot be made registers in the next
// candidate (RegisterFirst) instead of nowhere.
func TestDirsOtherEnvironment(t *testing.T) {
	tmp, home, xdg := t.TempDir(), t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("HOME", home)
	uid := itoa(os.Getuid())
	tests := []struct {
		name    string
		jobXDG  string // the job's XDG_RUNTIME_DIR
		wantDir string // where it registers
	}{
		{"no XDG_RUNTIME_DIR", "", filepath.Join(tmp, "gorun-"+uid)},
		{"XDG_RUNTIME_DIR cannot be made", "/proc/nouser", filepath.Join(tmp, "gorun-"+uid)},
		{"XDG_RUNTIME_DIR", xdg, filepath.Join(xdg, "gorun")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("XDG_RUNTIME_DIR", tt.jobXDG)
			dir, rm, err := RegisterFirst(Dirs(), entry("job1", os.Getpid()))
			if err != nil {
				t.Fatalf("RegisterFirst: %v", err)
			}
			defer rm()
			if dir != tt.wantDir {
				t.Errorf("registered in %s, want %s", dir, tt.wantDir)
			}
			// gorun status, in environments unlike the job's (one
			// without XDG_RUNTIME_DIR finds $XDG_RUNTIME_DIR/gorun only
			// at systemd's /run/user/<uid>). Other jobs of this user may
			// be listed too (/tmp/gorun-<uid>).
			for _, x := range []string{xdg, ""} {
				if x == "" && tt.jobXDG == xdg {
					continue
				}
				t.Setenv("XDG_RUNTIME_DIR", x)
				es, err := ListAll(Dirs())
				i := slices.IndexFunc(es, func(e *Entry) bool { return e.Job == "job1" })
				if err != nil || i < 0 || es[i].Dir != tt.wantDir {
					t.Errorf("status with XDG_RUNTIME_DIR=%q: ListAll(%v) = %v, %v; want job1 in %s", x, Dirs(), es, err, tt.wantDir)
				}
			}
		})
	}
}

// TestListAllMerges: entries of several directories are merged, oldest
// first, each once; an unsafe candidate (another user's) is skipped, not
// an error.
func TestListAllMerges(t *testing.T) {
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	e1, e2 := entry("job1", os.Getpid()), entry("job2", os.Getpid())
	e2.Start = e1.Start.Add(time.Second)
	for _, x := range []struct {
		dir string
		e   *Entry
	}{{b, e2}, {a, e1}, {b, e1}} {
		rm, err := Register(x.dir, x.e)
		if err != nil {
			t.Fatal(err)
		}
		defer rm()
	}
	es, err := ListAll([]string{open, a, b, filepath.Join(t.TempDir(), "missing")})
	if err != nil || len(es) != 2 || es[0].Job != "job1" || es[0].Dir != a || es[1].Job != "job2" || es[1].Dir != b {
		t.Fatalf("ListAll = %v, %v; want job1 in %s, job2 in %s", es, err, a, b)
	}
	if _, err := ListAll([]string{open}); !errors.Is(err, ErrBadRegistry) {
		t.Errorf("ListAll of an unsafe directory only: %v, want ErrBadRegistry", err)
	}
}
