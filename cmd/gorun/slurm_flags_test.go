package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/topology"
)

func TestSlurmSpares(t *testing.T) {
	hosts := []topology.Host{{Name: "n0", Slots: 2}, {Name: "n1", Slots: 2}, {Name: "n2", Slots: 2}, {Name: "n3", Slots: 4}}
	for _, tc := range []struct {
		name       string
		np, spares int
		wantNP     int
		spare      string // the hosts' spare marks, "s" for a spare
		err        string
	}{
		{"all nodes", 0, 0, 10, "....", ""},
		{"spares from the end", 0, 1, 6, "...s", ""},
		{"np leaves nodes spare", 4, 0, 4, "..ss", ""},
		{"np with enough spares", 4, 2, 4, "..ss", ""},
		{"np odd", 3, 1, 3, "..ss", ""},
		{"too few spares", 6, 2, 0, "", "--spares 2: -np 6 needs 3 of the allocation's 4 nodes, which leaves 1 spare"},
		{"every node a spare", 0, 4, 0, "", "--spares 4: the allocation has 4 nodes"},
		{"np past the slots", 20, 0, 20, "....", ""},
		{"np past the slots with spares", 11, 1, 0, "", "-np 11: more ranks than the allocation's 10 slots on 4 nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, np, err := slurmSpares(hosts, tc.np, tc.spares)
			if tc.err != "" {
				var ue *usageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want a usage error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			marks := ""
			for _, h := range got {
				marks += map[bool]string{true: "s", false: "."}[h.Spare]
			}
			if np != tc.wantNP || marks != tc.spare {
				t.Errorf("np %d, spares %q; want %d, %q", np, marks, tc.wantNP, tc.spare)
			}
		})
	}
}

func TestNodeAddrs(t *testing.T) {
	out := "NodeName=gr0 Arch=x86_64 CoresPerSocket=2 NodeAddr=10.77.1.2 NodeHostName=gr0 Version=22.05.8\n" +
		"NodeName=gr1 Arch=x86_64 NodeAddr=gr1 NodeHostName=gr1\n"
	got := nodeAddrs(out)
	if len(got) != 2 || got["gr0"] != "10.77.1.2" || got["gr1"] != "gr1" {
		t.Errorf("nodeAddrs = %v", got)
	}
}

func TestLauncherKind(t *testing.T) {
	noSrun, withSrun := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(withSrun, "srun"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	in := func(env map[string]string) func(string) string { return func(k string) string { return env[k] } }
	slurmEnv := in(map[string]string{"SLURM_JOB_ID": "7"})
	for _, tc := range []struct {
		name string
		o    runOptions
		env  func(string) string
		path string
		want launcher.LauncherKind
	}{
		{"in slurm", runOptions{launcher: "auto"}, slurmEnv, withSrun, launcher.LauncherSlurm},
		{"forced", runOptions{launcher: "slurm"}, in(nil), noSrun, launcher.LauncherSlurm},
		{"forced ssh", runOptions{launcher: "ssh"}, slurmEnv, withSrun, launcher.LauncherSSH},
		{"outside slurm", runOptions{launcher: "auto"}, in(nil), withSrun, launcher.LauncherSSH},
		{"no srun", runOptions{launcher: "auto"}, slurmEnv, noSrun, launcher.LauncherSSH},
		{"hostfile", runOptions{launcher: "auto", hostfile: "h"}, slurmEnv, withSrun, launcher.LauncherSSH},
		{"host list", runOptions{launcher: "auto", hostList: "a,b"}, slurmEnv, withSrun, launcher.LauncherSSH},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", tc.path)
			if got := tc.o.launcherKind(tc.env); got != tc.want {
				t.Errorf("launcherKind = %q, want %q", got, tc.want)
			}
		})
	}
}
