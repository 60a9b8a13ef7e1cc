package jobstatus

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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
	if d := Dir(); d != "/run/user/7/gorun" {
		t.Errorf("Dir = %s with XDG_RUNTIME_DIR", d)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("TMPDIR", "/tmp/x")
	if d, want := Dir(), filepath.Join("/tmp/x", "gorun-"+itoa(os.Getuid())); d != want {
		t.Errorf("Dir = %s, want %s", d, want)
	}
}
