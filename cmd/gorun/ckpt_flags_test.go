package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/launcher"
)

// TestBadCkptInput: a bad durable-tier flag, or a --ckpt-dir that is
// missing, not a directory or holds another job's checkpoints, exits 2
// before anything starts, naming the flag (and the directory) and what
// is wrong; the other job's directory is left as it was.
func TestBadCkptInput(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	m := &durable.Manifest{Job: "earlierjob", World: 1, Regions: [][]durable.Region{{{Name: "optimizer", Size: 4096}}}, Protect: "full", Every: 10, Command: "x"}
	if err := durable.CreateManifest(other, m); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"every without a directory", []string{"--ckpt-every", "10", "true"}, "--ckpt-every needs --ckpt-dir"},
		{"concurrency without a directory", []string{"--ckpt-concurrency", "2", "true"}, "--ckpt-concurrency needs --ckpt-dir"},
		{"overhead without a directory", []string{"--ckpt-overhead", "0.1", "true"}, "--ckpt-overhead needs --ckpt-dir"},
		{"batch without a directory", []string{"--protect-mode", "diff", "--diff-batch", "5", "true"}, "--diff-batch needs --ckpt-dir"},
		{"resume without a directory", []string{"--resume", "true"}, "--resume needs --ckpt-dir"},
		{"empty directory name", []string{"--ckpt-dir", "", "true"}, "--ckpt-dir is empty"},
		{"every zero", []string{"--ckpt-dir", dir, "--ckpt-every", "0", "true"}, "--ckpt-every must be 1 to 2^31, not 0"},
		{"every past 2^31", []string{"--ckpt-dir", dir, "--ckpt-every", "2147483649", "true"}, "--ckpt-every must be 1 to 2^31, not 2147483649"},
		{"every not a number", []string{"--ckpt-dir", dir, "--ckpt-every", "often", "true"}, `invalid value "often" for flag -ckpt-every`},
		{"concurrency zero", []string{"--ckpt-dir", dir, "--ckpt-concurrency", "0", "true"}, "--ckpt-concurrency must be 1 to 8, not 0"},
		{"concurrency 9", []string{"--ckpt-dir", dir, "--ckpt-concurrency", "9", "true"}, "--ckpt-concurrency must be 1 to 8, not 9"},
		{"overhead zero", []string{"--ckpt-dir", dir, "--ckpt-overhead", "0", "true"}, "--ckpt-overhead must be more than 0 and less than 1, not 0"},
		{"overhead one", []string{"--ckpt-dir", dir, "--ckpt-overhead", "1", "true"}, "--ckpt-overhead must be more than 0 and less than 1, not 1"},
		{"overhead NaN", []string{"--ckpt-dir", dir, "--ckpt-overhead", "NaN", "true"}, "--ckpt-overhead must be more than 0 and less than 1, not NaN"},
		{"overhead a percentage", []string{"--ckpt-dir", dir, "--ckpt-overhead", "3%", "true"}, `invalid value "3%" for flag -ckpt-overhead`},
		{"batch in full mode", []string{"--ckpt-dir", dir, "--diff-batch", "5", "true"}, "--diff-batch only applies with --protect-mode diff"},
		{"batch zero", []string{"--protect-mode", "diff", "--ckpt-dir", dir, "--diff-batch", "0", "true"}, "--diff-batch must be 1 to 4096, not 0"},
		{"batch too long", []string{"--protect-mode", "diff", "--ckpt-dir", dir, "--diff-batch", "4097", "true"}, "--diff-batch must be 1 to 4096, not 4097"},
		{"missing directory", []string{"--ckpt-dir", filepath.Join(dir, "none"), "true"},
			"--ckpt-dir " + filepath.Join(dir, "none") + ": " + filepath.Join(dir, "none") + " does not exist"},
		{"not a directory", []string{"--ckpt-dir", file, "true"}, "--ckpt-dir " + file + ": " + file + " is not a directory"},
		{"another job's checkpoints", []string{"--ckpt-dir", other, "true"}, "--ckpt-dir " + other + " holds job earlierjob's checkpoints; use --resume or another --ckpt-dir"},
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
		})
	}
	if l, err := durable.List(other); err != nil || l.Manifest == nil || l.Manifest.Job != "earlierjob" || len(l.Ranks) != 0 || l.HasCommit {
		t.Fatalf("the other job's directory changed: %+v, %v", l, err)
	}
}

// TestCkptFlags: the durable tier's flags reach launcher.Config, with
// their defaults, the differential batch only in diff mode.
func TestCkptFlags(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want launcher.DurableOptions
	}{
		{"none", nil, launcher.DurableOptions{}},
		{"defaults", []string{"--ckpt-dir", dir}, launcher.DurableOptions{Dir: dir, Every: 100, Overhead: 0.03}},
		{"diff defaults", []string{"--protect-mode", "diff", "--ckpt-dir", dir}, launcher.DurableOptions{Dir: dir, Every: 100, Overhead: 0.03, DiffBatch: 5}},
		{"every setting", []string{"--protect-mode=diff", "--ckpt-dir=" + dir, "--ckpt-every", "10", "--ckpt-concurrency", "8", "--ckpt-overhead", "0.5", "--diff-batch", "4096", "--resume"},
			launcher.DurableOptions{Dir: dir, Every: 10, Concurrency: 8, Overhead: 0.5, DiffBatch: 4096, Resume: true}},
		{"the bounds", []string{"--ckpt-dir", dir, "--ckpt-every", "2147483648", "--ckpt-concurrency", "1", "--ckpt-overhead", "1e-9"},
			launcher.DurableOptions{Dir: dir, Every: 1 << 31, Concurrency: 1, Overhead: 1e-9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseRun(append(tt.args, "-np", "1", "true"), nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := o.config(os.Stdout, os.Stderr)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Durable != tt.want {
				t.Errorf("Durable %+v, want %+v", cfg.Durable, tt.want)
			}
		})
	}
}

// TestUsageNamesCkptFlags: gorun --help lists the durable tier's flags.
func TestUsageNamesCkptFlags(t *testing.T) {
	for _, f := range []string{"--ckpt-dir DIR", "--ckpt-every B", "--ckpt-concurrency N", "--ckpt-overhead Q", "--diff-batch N", "--resume"} {
		if !strings.Contains(runUsage(), "\n  "+f) {
			t.Errorf("the usage text does not list %s", f)
		}
	}
}
