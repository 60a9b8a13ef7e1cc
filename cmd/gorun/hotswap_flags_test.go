package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadHotSwapInput: bad hot-swap flags exit 2 before anything starts,
// naming the flag and the numbers, and leave no --events file behind.
func TestBadHotSwapInput(t *testing.T) {
	dir := t.TempDir()
	two := filepath.Join(dir, "two.hosts")
	if err := os.WriteFile(two, []byte("localhost slots=2\n127.0.0.1 slots=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	marked := filepath.Join(dir, "marked.hosts")
	if err := os.WriteFile(marked, []byte("localhost slots=2 spare\n127.0.0.1 slots=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	events := filepath.Join(dir, "events.jsonl")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"spares for every host", []string{"--hostfile", two, "--spares", "2", "true"}, "--spares 2: the job has 2 hosts; want 0 to 1"},
		{"spares negative", []string{"--hostfile", two, "--spares", "-1", "true"}, "--spares must be 0 or more, not -1"},
		{"spares leave too few slots", []string{"--hostfile", two, "--spares", "1", "-np", "3", "true"}, "--spares 1: the 1 spare hosts leave 2 slots for -np 3 ranks"},
		{"spares with the hostfile's", []string{"--hostfile", marked, "--spares", "1", "true"}, "--spares 1: with the hostfile's spares, all 2 hosts are spares; at least one must run ranks"},
		{"unknown on-no-spare", []string{"--on-no-spare", "never", "true"}, "--on-no-spare never: want free-slots or abort"},
		{"unknown recovery", []string{"--recovery", "sideways", "true"}, "--recovery sideways: want restart or in-place"},
		{"suspect timeout zero", []string{"--suspect-timeout", "0", "true"}, "--suspect-timeout must be positive"},
		{"suspect timeout not a number", []string{"--suspect-timeout", "soon", "true"}, `"soon" is not a number of seconds`},
		{"hang timeout negative", []string{"--hang-timeout", "-1", "true"}, "-1 seconds is out of range"},
		{"events in a missing directory", []string{"--events", filepath.Join(dir, "nope", "ev"), "true"}, "--events: open " + filepath.Join(dir, "nope", "ev")},
		// The file is opened last, and removed when the launcher refuses
		// the configuration.
		{"events with a bad layout", []string{"--events", events, "-np", "4", "--tp", "3", "true"}, "--tp 3 --pp 1"},
		{"events with bad spares", []string{"--events", events, "--hostfile", two, "--spares", "1", "-np", "3", "true"}, "--spares 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runJob(t, "", nil, tt.args...)
			if res.code != 2 {
				t.Errorf("exit %d, want 2\nstderr:\n%s", res.code, res.stderr)
			}
			if !strings.Contains(res.stderr, tt.want) {
				t.Errorf("stderr does not say %q:\n%s", tt.want, res.stderr)
			}
			if _, err := os.Stat(events); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("--events file left behind by bad input (stat: %v)", err)
			}
		})
	}
}

// TestSparesAreNotGivenRanks: without -np, the ranks fill the slots of
// the hosts that are not spares (--spares and the hostfile's keyword).
func TestSparesAreNotGivenRanks(t *testing.T) {
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hf, []byte("localhost slots=2\n127.0.0.1 slots=3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseRun([]string{"--hostfile", hf, "--spares", "1", "--on-no-spare", "abort", "--recovery", "in-place",
		"--suspect-timeout", "2.5", "--hang-timeout", "30", "true"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := o.config(os.Stdout, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NP != 2 || cfg.Spares != 1 {
		t.Errorf("NP %d Spares %d, want 2 and 1 (the spare's 3 slots are not the ranks')", cfg.NP, cfg.Spares)
	}
	if cfg.OnNoSpare.String() != "abort" || cfg.Recovery.String() != "in-place" {
		t.Errorf("OnNoSpare %v Recovery %v, want abort and in-place", cfg.OnNoSpare, cfg.Recovery)
	}
	if cfg.SuspectTimeout.Seconds() != 2.5 || cfg.HangTimeout.Seconds() != 30 {
		t.Errorf("SuspectTimeout %v HangTimeout %v, want 2.5s and 30s", cfg.SuspectTimeout, cfg.HangTimeout)
	}
}
