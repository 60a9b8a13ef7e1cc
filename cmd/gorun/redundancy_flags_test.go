package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestBadRedundancyInput: a malformed --redundancy, --redundancy with
// --replicas, and an erasure code the hosts cannot form exit 2 before
// anything starts, saying why.
func TestBadRedundancyInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"ec without M", []string{"--redundancy", "ec:2", "true"}, `--redundancy "ec:2": want ec:K+M, K data and M parity hosts per group (e.g. ec:2+2)`},
		{"ec K 0", []string{"--redundancy", "ec:0+1", "true"}, `--redundancy "ec:0+1": want K >= 1 data and M >= 1 parity hosts, K+M at most 256`},
		{"ec of three numbers", []string{"--redundancy", "ec:2+2+1", "true"}, `--redundancy "ec:2+2+1": want ec:K+M`},
		{"negative replicas", []string{"--redundancy", "replicas:-1", "true"}, `--redundancy "replicas:-1": want replicas:K with K from 0 to 8`},
		{"ec wider than 256", []string{"--redundancy", "ec:200+100", "true"}, `--redundancy "ec:200+100": want K >= 1 data and M >= 1 parity hosts, K+M at most 256`},
		{"unknown kind", []string{"--redundancy", "raid6", "true"}, `--redundancy "raid6": want replicas:K or ec:K+M`},
		{"empty", []string{"--redundancy", "", "true"}, `--redundancy "": want replicas:K or ec:K+M`},
		{"with --replicas", []string{"--redundancy", "ec:2+2", "--replicas", "1", "true"}, "--redundancy ec:2+2 and --replicas 1: give one of them (--replicas K is --redundancy replicas:K)"},
		{"with --replicas, agreeing", []string{"--replicas", "2", "--redundancy", "replicas:2", "true"}, "--redundancy replicas:2 and --replicas 2: give one of them"},
		{"one host for ec:2+2", []string{"--redundancy", "ec:2+2", "-np", "2", "true"}, "--redundancy ec:2+2: only 1 host with ranks; a group needs 2 data + 2 parity hosts"},
		{"three hosts for ec:2+2", []string{"--redundancy", "ec:2+2", "-H", "127.0.0.1,127.0.0.2,127.0.0.3", "true"},
			"--redundancy ec:2+2: only 3 hosts with ranks; a group needs 2 data + 2 parity hosts"},
		{"ec in diff mode, one host", []string{"--redundancy", "ec:2+2", "--protect-mode", "diff", "-np", "2", "true"},
			"--redundancy ec:2+2: only 1 host with ranks; a group needs 2 data + 2 parity hosts"},
		{"ec in diff mode, more than 16 parity hosts", []string{"--redundancy", "ec:2+17", "--protect-mode", "diff", "true"},
			"--redundancy ec:2+17 with --protect-mode diff: at most 16 parity hosts, not 17"},
		{"ranks not a multiple of K", []string{"--redundancy", "ec:2+1", "-H", "127.0.0.1,127.0.0.2,127.0.0.3", "true"},
			"--redundancy ec:2+1: group 0 has 3 ranks on hosts"},
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

// TestRedundancyFlags: --redundancy and --replicas reach launcher.Config
// as Replicas (and whether it was asked for) or ECK and ECM.
func TestRedundancyFlags(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		replicas    int
		replicasSet bool
		k, m        int
	}{
		{"default", nil, 1, false, 0, 0},
		{"--replicas", []string{"--replicas", "2"}, 2, true, 0, 0},
		{"replicas:0", []string{"--redundancy", "replicas:0"}, 0, true, 0, 0},
		{"replicas:3", []string{"--redundancy=replicas:3"}, 3, true, 0, 0},
		{"ec:2+2", []string{"--redundancy", "ec:2+2"}, 0, true, 2, 2},
		{"ec:255+1", []string{"--redundancy", "ec:255+1"}, 0, true, 255, 1},
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
			if cfg.Replicas != tt.replicas || cfg.ReplicasSet != tt.replicasSet || cfg.ECK != tt.k || cfg.ECM != tt.m {
				t.Errorf("Replicas %d (set %v), ECK %d, ECM %d; want %d (%v), %d, %d",
					cfg.Replicas, cfg.ReplicasSet, cfg.ECK, cfg.ECM, tt.replicas, tt.replicasSet, tt.k, tt.m)
			}
		})
	}
}

// TestRedundancyHelp: gorun --help documents --redundancy.
func TestRedundancyHelp(t *testing.T) {
	res := runJob(t, "", nil, "--help")
	if res.code != 0 || !strings.Contains(res.stdout+res.stderr, "--redundancy replicas:K|ec:K+M") {
		t.Errorf("exit %d; --help does not document --redundancy:\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// TestRedundancyVerbose: gorun -v says at the start what the job's
// redundancy survives (four loopback addresses are four hosts of this
// one, their agents in gorun's process).
func TestRedundancyVerbose(t *testing.T) {
	hosts := "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4"
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--redundancy", "ec:2+2"}, "gorun: state protection: ec:2+2 over 4 hosts: any 2 of the 4 hosts\n"},
		{[]string{"--replicas", "1"}, "gorun: state protection: replicas:1 over 4 hosts: any 1 host"},
	} {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			res := runJob(t, "", nil, append(tc.flags, "-v", "-H", hosts, "true")...)
			if res.code != 0 {
				t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
			}
			if !strings.Contains(res.stderr, tc.want) {
				t.Errorf("stderr does not say %q:\n%s", tc.want, res.stderr)
			}
		})
	}
}

// TestECDiffAccepted: --protect-mode diff with --redundancy ec:K+M runs
// (it exited 2 before diff mode under EC was built), and gorun warns,
// naming the logs' memory, when --base-every is more than 4 x
// --diff-fold: the differentials after the newest coded base cannot fold.
// It says so once, with -v too.
func TestECDiffAccepted(t *testing.T) {
	for _, tc := range []struct {
		baseEvery string
		verbose   bool
		warnings  int
	}{{"100", false, 1}, {"100", true, 1}, {"8", false, 0}} {
		t.Run(fmt.Sprintf("base-every=%s,v=%v", tc.baseEvery, tc.verbose), func(t *testing.T) {
			args := []string{"--redundancy", "ec:2+2", "--protect-mode", "diff", "--base-every", tc.baseEvery,
				"-H", "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4"}
			if tc.verbose {
				args = append(args, "-v")
			}
			res := runJob(t, "", nil, append(args, "true")...)
			if res.code != 0 {
				t.Fatalf("exit %d, want 0\nstderr:\n%s", res.code, res.stderr)
			}
			const warning = "the differentials after the newest coded base cannot fold, so each of a rank's 2 log holders keeps up to 108 steps of them (base-every 100 + refresh 8)"
			if got := strings.Count(res.stderr, warning); got != tc.warnings {
				t.Fatalf("warned %d times, want %d:\n%s", got, tc.warnings, res.stderr)
			}
		})
	}
}
