package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReportCommand: gorun report's arguments, exit codes and errors.
func TestReportCommand(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join("..", "..", "internal", "report", "testdata", "hostloss.events.jsonl")
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte("{\"t\":0,\"event\":\"launch\",\"schema\":1,\"job\":\"j\",\"np\":1,\"hosts\":[]}\n{\"t\":1,\"event\":\"splice\",\"ranks\":\"x\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noLaunch := filepath.Join(dir, "old.jsonl")
	if err := os.WriteFile(noLaunch, []byte("{\"t\":1,\"event\":\"fence\",\"host\":\"a\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(dir, "dir.jsonl")
	if err := os.Mkdir(unreadable, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "report.html")
	for _, c := range []struct {
		name   string
		args   []string
		code   int
		stdout string // in stdout
		stderr string // in stderr
	}{
		{"help", []string{"-h"}, 0, "Usage: gorun report", ""},
		{"help long", []string{"--help"}, 0, "Usage: gorun report", ""},
		{"no file", nil, 2, "", "want one events file, got 0"},
		{"two files", []string{good, good}, 2, "", "want one events file, got 2"},
		{"unknown flag", []string{good, "--html"}, 2, "", "flag provided but not defined: -html"},
		{"-o without value", []string{good, "-o"}, 2, "", "flag needs an argument: -o"},
		{"-o empty", []string{good, "-o", ""}, 2, "", "-o: want a file name"},
		{"missing file", []string{filepath.Join(dir, "nope.jsonl")}, 1, "", "no such file or directory"},
		{"unreadable file", []string{unreadable}, 1, "", "is a directory"},
		{"malformed line", []string{bad}, 2, "", "bad.jsonl: line 2: splice: field \"ranks\" is string"},
		{"no launch", []string{noLaunch}, 2, "", "no launch record"},
		{"stdout", []string{good}, 0, "<!DOCTYPE html>", ""},
		{"stdout dash", []string{"-o", "-", good}, 0, "<!DOCTYPE html>", ""},
		{"file after", []string{good, "-o", out}, 0, "", ""},
		{"unwritable output", []string{good, "-o", filepath.Join(dir, "nodir", "r.html")}, 1, "", "nodir"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(append([]string{"report"}, c.args...), nil, &stdout, &stderr)
			if code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.stderr) {
				t.Fatalf("exit %d, want %d\nstdout (want %q):\n%.300s\nstderr (want %q):\n%s", code, c.code, c.stdout, stdout.String(), c.stderr, stderr.String())
			}
		})
	}
	b, err := os.ReadFile(out)
	if err != nil || !bytes.HasPrefix(b, []byte("<!DOCTYPE html>")) || !bytes.Contains(b, []byte(`data-marker="failure"`)) {
		t.Fatalf("-o %s: %v, %.200s", out, err, b)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".gorun-report-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestReportInputs: a file cut mid-line (being written, a full disk)
// gives the page of the lines before it with a warning naming the line;
// a newer schema, or none, is refused (exit 2).
func TestReportInputs(t *testing.T) {
	dir := t.TempDir()
	good, err := os.ReadFile(filepath.Join("..", "..", "internal", "report", "testdata", "hostloss.events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(good, []byte("\n"))
	cut := bytes.Join(lines[:30], nil)
	cut = append(cut, lines[30][:len(lines[30])/2]...)
	newer := bytes.Replace(good, []byte(`"schema":1,`), []byte(`"schema":7,`), 1)
	none := bytes.Replace(good, []byte(`"schema":1,`), nil, 1)
	if bytes.Equal(newer, good) || bytes.Equal(none, good) {
		t.Fatal("the fixture has no \"schema\":1")
	}
	for _, c := range []struct {
		name   string
		data   []byte
		code   int
		stderr string
	}{
		{"cut mid-line", cut, 0, "line 31: cut short"},
		{"newer schema", newer, 2, "version 7 is newer"},
		{"no schema", none, 2, "no schema version"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".jsonl")
			if err := os.WriteFile(in, c.data, 0o644); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := Main([]string{"report", in}, nil, &stdout, &stderr)
			if code != c.code || !strings.Contains(stderr.String(), c.stderr) || (code == 0) != bytes.HasPrefix(stdout.Bytes(), []byte("<!DOCTYPE html>")) {
				t.Fatalf("exit %d, want %d; stderr (want %q):\n%s\nstdout %.100q", code, c.code, c.stderr, stderr.String(), stdout.String())
			}
		})
	}
}

// TestReportOutputKinds: -o writes a regular file through a temporary one
// renamed over it, but follows a symbolic link (the link stays, its
// target gets the page) and writes a device in place (as root: a
// character device like /dev/null stays one).
func TestReportOutputKinds(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join("..", "..", "internal", "report", "testdata", "hostloss.events.jsonl")
	run := func(out string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := Main([]string{"report", good, "-o", out}, nil, &stdout, &stderr); code != 0 {
			t.Fatalf("-o %s: exit %d: %s", out, code, stderr.String())
		}
	}
	target := filepath.Join(dir, "target.html")
	if err := os.WriteFile(target, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.html")
	if err := os.Symlink("target.html", link); err != nil {
		t.Fatal(err)
	}
	run(link)
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("-o through a symlink: %v, mode %v: want the link kept", err, fi.Mode())
	}
	if b, err := os.ReadFile(target); err != nil || !bytes.HasPrefix(b, []byte("<!DOCTYPE html>")) {
		t.Errorf("the link's target: %v, %.40q: want the page", err, b)
	}
	if os.Geteuid() != 0 {
		t.Log("not root: no device node to write")
		return
	}
	dev := filepath.Join(dir, "devnull")
	if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Skipf("mknod: %v", err)
	}
	run(dev)
	if fi, err := os.Lstat(dev); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("-o a character device: %v, mode %v: want it kept a device", err, fi.Mode())
	}
}
