package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestArgv(t *testing.T) {
	l := launcher{args: []string{"-np", "N", "true"}}
	if got, want := l.argv(16), []string{"-np", "16", "true"}; !slices.Equal(got, want) {
		t.Errorf("argv(16) = %v, want %v", got, want)
	}
	if l.args[1] != "N" {
		t.Errorf("argv modified the template: %v", l.args)
	}
}

func TestParseNs(t *testing.T) {
	tests := []struct {
		in   string
		want []int
	}{
		{"1,16,64", []int{1, 16, 64}},
		{" 8 ", []int{8}},
		{"", nil},
		{"1,,2", nil},
		{"0", nil},
		{"x", nil},
	}
	for _, tt := range tests {
		got, err := parseNs(tt.in)
		if !slices.Equal(got, tt.want) || (err == nil) != (tt.want != nil) {
			t.Errorf("parseNs(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestRunOnce(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want outcome
	}{
		{"ok", []string{"-c", "exit 0"}, ok},
		{"fail", []string{"-c", "echo boom >&2; exit 3"}, failed},
		{"hang", []string{"-c", "sleep 30"}, hung},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runOnce("/bin/sh", tt.args, 200*time.Millisecond)
			if r.outcome != tt.want {
				t.Fatalf("outcome = %v (err %v), want %v", r.outcome, r.err, tt.want)
			}
			if tt.want == failed && !strings.Contains(r.err.Error(), "boom") {
				t.Errorf("err = %v, want it to quote stderr", r.err)
			}
		})
	}
	if r := runOnce("/no/such/launcher", nil, time.Second); r.outcome != failed {
		t.Errorf("missing binary: outcome %v, want failed", r.outcome)
	}
}

// TestRunOnceKillsTree checks that a hung launcher's descendants die with it
// even when, like MPI ranks, they sit in a process group of their own.
func TestRunOnceKillsTree(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a shell for a fraction of a second")
	}
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid")
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := `setsid sleep 30 & echo $! > "$1"; sleep 30`
	r := runOnce("/bin/sh", []string{"-c", script, "sh", pidFile}, 300*time.Millisecond)
	if r.outcome != hung {
		t.Fatalf("outcome = %v (err %v), want hung", r.outcome, r.err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The killed sleep is reaped by whoever inherits it; poll until it is
	// gone or a zombie.
	for deadline := time.Now().Add(5 * time.Second); ; {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || bytes.Contains(stat, []byte(") Z ")) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("descendant %d in its own session survived: %s", pid, stat)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
