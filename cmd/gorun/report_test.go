package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
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
