package main

import (
	"os"
	"strings"
	"testing"

	"github.com/gorun/gorun/launcher"
)

// TestBadProtectModeInput: a bad --protect-mode or diff-mode flag exits 2
// before anything starts, naming the flag and what it wants; so do the
// diff-mode flags without --protect-mode diff, and diff mode with nothing
// to send (--replicas 0).
func TestBadProtectModeInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown mode", []string{"--protect-mode", "delta", "true"}, "--protect-mode delta: want full or diff"},
		{"mode in capitals", []string{"--protect-mode", "DIFF", "true"}, "--protect-mode DIFF: want full or diff"},
		{"empty mode", []string{"--protect-mode", "", "true"}, "--protect-mode : want full or diff"},
		{"fold without diff", []string{"--diff-fold", "8", "true"}, "--diff-fold only applies with --protect-mode diff"},
		{"base-every without diff", []string{"--protect-mode", "full", "--base-every", "50", "true"}, "--base-every only applies with --protect-mode diff"},
		{"codec without diff", []string{"--diff-codec", "raw", "true"}, "--diff-codec only applies with --protect-mode diff"},
		{"diff with no replicas", []string{"--protect-mode", "diff", "--replicas", "0", "true"}, "--protect-mode diff sends each step to the replica holders: it needs --replicas 1 or more, not 0"},
		{"fold zero", []string{"--protect-mode", "diff", "--diff-fold", "0", "true"}, "--diff-fold must be 1 to 4096, not 0"},
		{"fold too deep", []string{"--protect-mode", "diff", "--diff-fold", "4097", "true"}, "--diff-fold must be 1 to 4096, not 4097"},
		{"fold not a number", []string{"--protect-mode", "diff", "--diff-fold", "many", "true"}, `invalid value "many" for flag -diff-fold`},
		{"base-every zero", []string{"--protect-mode", "diff", "--base-every", "0", "true"}, "--base-every must be 1 to 2^31, not 0"},
		{"base-every past 2^31", []string{"--protect-mode", "diff", "--base-every", "2147483649", "true"}, "--base-every must be 1 to 2^31, not 2147483649"},
		{"unknown codec", []string{"--protect-mode", "diff", "--diff-codec", "zstd", "true"}, `--diff-codec: diff codec "zstd": want raw, int8[:B] or topk:K`},
		{"raw with an argument", []string{"--protect-mode", "diff", "--diff-codec", "raw:1", "true"}, `--diff-codec: diff codec "raw:1": raw takes no argument`},
		{"int8 block zero", []string{"--protect-mode", "diff", "--diff-codec", "int8:0", "true"}, `--diff-codec: diff codec "int8:0": want int8:B`},
		{"topk without K", []string{"--protect-mode", "diff", "--diff-codec", "topk", "true"}, `--diff-codec: diff codec "topk": want topk:K with 0 < K ≤ 1`},
		{"topk above 1", []string{"--protect-mode", "diff", "--diff-codec", "topk:2", "true"}, `--diff-codec: diff codec "topk:2": want topk:K`},
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
}

// TestProtectModeFlags: the protect-mode flags reach launcher.Config, the
// diff settings (defaults included) only in diff mode.
func TestProtectModeFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		mode launcher.ProtectMode
		diff launcher.DiffOptions
	}{
		{"default", nil, launcher.ModeFull, launcher.DiffOptions{}},
		{"full", []string{"--protect-mode", "full"}, launcher.ModeFull, launcher.DiffOptions{}},
		{"diff with the defaults", []string{"--protect-mode", "diff"}, launcher.ModeDiff, launcher.DiffOptions{Fold: 8, BaseEvery: 100, Codec: "raw"}},
		{"diff with every setting", []string{"--protect-mode=diff", "--diff-fold", "7", "--base-every", "2147483648", "--diff-codec", "topk:0.01"},
			launcher.ModeDiff, launcher.DiffOptions{Fold: 7, BaseEvery: 1 << 31, Codec: "topk:0.01"}},
		{"diff with the bounds", []string{"--protect-mode", "diff", "--diff-fold", "1", "--base-every", "1", "--diff-codec", "int8"},
			launcher.ModeDiff, launcher.DiffOptions{Fold: 1, BaseEvery: 1, Codec: "int8"}},
		{"diff fold 4096", []string{"--protect-mode", "diff", "--diff-fold", "4096", "--diff-codec", "int8:512", "--replicas", "2"},
			launcher.ModeDiff, launcher.DiffOptions{Fold: 4096, BaseEvery: 100, Codec: "int8:512"}},
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
			if cfg.ProtectMode != tt.mode || cfg.Diff != tt.diff {
				t.Errorf("ProtectMode %q, Diff %+v; want %q, %+v", cfg.ProtectMode, cfg.Diff, tt.mode, tt.diff)
			}
		})
	}
}

// TestProtectModeDiffRuns: a job in diff mode starts and ends as any other
// (every agent took the spec's settings): the launcher on one host with
// the default --replicas, which it cannot meet there.
func TestProtectModeDiffRuns(t *testing.T) {
	res := runJob(t, "", nil, "-np", "2", "--oversubscribe", "--protect-mode", "diff", "--diff-codec", "int8:64", "true")
	if res.code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s", res.code, res.stderr)
	}
}
