package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/plan"
)

// runPlanTest runs gorun plan with the memory measurement faked (1 GB/s)
// and the real file system.
func runPlanTest(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	deps := planDeps{now: time.Now, fs: plan.OSFS{}, stdout: &out,
		memBW: func() (float64, error) { return 1e9, nil }}
	code = runPlan(context.Background(), args, deps, &errb)
	return code, out.String(), errb.String()
}

var planBase = []string{"--hosts", "16", "--ranks-per-host", "4", "--mttf", "365d", "--job-length", "30d",
	"--step", "20s", "--state", "2GiB", "--net-bw", "10GB/s", "--durable-bw", "2GB/s", "--spares", "2",
	"--runs", "200"}

func TestPlanReport(t *testing.T) {
	code, out, errs := runPlanTest(t, append(planBase, "--redundancy", "ec:2+2")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range [][2]string{{"mem-bw", "1  GB/s  measured"}, {"net-bw", "10  GB/s  given"}, {"restart", "10m0s  default"}} {
		if !strings.Contains(out, "  "+want[0]+" ") || !strings.Contains(strings.Join(strings.Fields(lineOf(out, "  "+want[0]+" ")), "  "), want[1]) {
			t.Errorf("report: input %s is not %q:\n%s", want[0], want[1], out)
		}
	}
	for _, want := range []string{
		"checkpoint-restart", "host replacement", "efficiency η", "lost, p99",
		"PCcheck's f* = ceil(T_w/(N·q·t)) = 1 steps",
		"ec:2+2 over 16 hosts (4 group(s) of 4): any 2 host(s) of each group",
		"Spares: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestPlanJSON(t *testing.T) {
	code, out, errs := runPlanTest(t, append(planBase, "--json", "--seed", "5")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got planOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	r := got.Result
	if r.MonteCarlo.Seed != 5 || r.MonteCarlo.Runs != 200 {
		t.Errorf("monte carlo %+v, want seed 5, 200 runs", r.MonteCarlo)
	}
	// 8 GiB per host over 2 GB/s
	if want := float64(8<<30) / 2e9; r.WriteTime != want {
		t.Errorf("T_w = %v, want %v", r.WriteTime, want)
	}
	if !(r.HostReplace.CostTotal < r.Checkpoint.CostTotal) || !(r.HostReplace.Efficiency > r.Checkpoint.Efficiency) {
		t.Errorf("host replacement %+v should beat checkpoint-restart %+v here", r.HostReplace, r.Checkpoint)
	}
	// same seed, same figures
	_, again, _ := runPlanTest(t, append(planBase, "--json", "--seed", "5")...)
	if again != out {
		t.Errorf("same seed, different output")
	}
}

func TestPlanDurableDirMeasured(t *testing.T) {
	dir := t.TempDir()
	args := append([]string{}, planBase...)
	for i, a := range args { // drop --durable-bw
		if a == "--durable-bw" {
			args = append(args[:i:i], args[i+2:]...)
			break
		}
	}
	code, out, errs := runPlanTest(t, append(args, "--durable-dir", dir, "--measure-size", "1MiB")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "measured in "+dir) {
		t.Errorf("durable-bw not measured:\n%s", out)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in %s: %v", dir, ents)
	}
}

func TestPlanTrace(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "failures.csv")
	os.WriteFile(trace, []byte("# time,host\n1h,n3\n26h,n1\n48h,n7\n"), 0o644)
	args := []string{"--hosts", "8", "--trace", trace, "--step", "10s", "--state", "1GiB", "--mem-bw", "10GB/s", "--json", "--runs", "10"}
	code, out, errs := runPlanTest(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got planOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	// 3 failures over 48h on 8 hosts: one host's MTTF is 128h
	if got.Result.MTTFSys != 16*3600 || got.Result.MonteCarlo.Failures != 3 {
		t.Errorf("MTTF_sys %v s, failures %v: want 16h, 3", got.Result.MTTFSys, got.Result.MonteCarlo.Failures)
	}
}

func TestPlanUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.csv")
	os.WriteFile(bad, []byte("1h\nsoon\n"), 0o644)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no hosts", []string{"--mttf", "1d"}, "--hosts or --hostfile is required"},
		{"no mttf", []string{"--hosts", "4"}, "--mttf or --trace is required"},
		{"both failures", []string{"--hosts", "4", "--mttf", "1d", "--trace", bad}, "--mttf and --trace"},
		{"missing step", []string{"--hosts", "4", "--mttf", "1d", "--job-length", "1d", "--state", "1GB"}, "--step is required"},
		{"negative step", append(planBase, "--step", "-2s"), "--step -2s: must be positive"},
		{"unknown unit", append(planBase, "--state", "2XB"), `--state "2XB": unknown unit "XB"`},
		{"bandwidth without /s", append(planBase, "--net-bw", "10GB"), "--net-bw"},
		{"bad duration", append(planBase, "--mttf", "soon"), "--mttf"},
		{"bad redundancy", append(planBase, "--redundancy", "ec:2"), `--redundancy "ec:2"`},
		{"ec wider than hosts", append(planBase, "--redundancy", "ec:16+4"), "ec:16+4 needs at least 20 hosts"},
		{"zero hosts", append(planBase, "--hosts", "0"), "--hosts must be at least 1"},
		{"negative spares", append(planBase, "--spares", "-1"), "--spares must be at least 0"},
		{"overhead 2", append(planBase, "--ckpt-overhead", "2"), "--ckpt-overhead 2"},
		{"durable both", append(planBase, "--durable-dir", "/tmp"), "--durable-bw and --durable-dir"},
		{"durable not a dir", []string{"--hosts", "4", "--mttf", "1d", "--job-length", "1d", "--step", "1s", "--state", "1GB", "--durable-dir", "/nonexistent"}, "--durable-dir /nonexistent"},
		{"bad trace line", []string{"--hosts", "4", "--trace", bad, "--step", "1s", "--state", "1GB"}, "line 2"},
		{"unknown flag", []string{"--frobnicate"}, "frobnicate"},
		{"rsh without hostfile", append(planBase, "--rsh", "ssh"), "--rsh and --bind apply with --hostfile only"},
		{"measure-size alone", append(planBase, "--measure-size", "1MiB"), "--measure-size applies with --durable-dir or --hostfile"},
		{"hosts and hostfile", append(planBase, "--hostfile", "/nonexistent"), "--hosts and --hostfile"},
		{"bad measure-size", []string{"--hosts", "4", "--mttf", "1d", "--job-length", "1d", "--step", "1s", "--state", "1GB", "--durable-dir", os.TempDir(), "--measure-size", "1XB"}, "--measure-size 1XB"},
		{"argument", append(planBase, "extra"), `unexpected argument "extra"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := runPlanTest(t, c.args...)
			if code != exitUsage || !strings.Contains(errs, c.want) {
				t.Errorf("exit %d, stderr %q; want 2 naming %q", code, errs, c.want)
			}
		})
	}
}

// One host: no replicas by default (gorun's replicas:1 where the hosts
// allow it), and replicas:1 asked for is refused.
func TestPlanOneHost(t *testing.T) {
	args := []string{"--hosts", "1", "--mttf", "365d", "--job-length", "1d", "--step", "1s", "--state", "1GB",
		"--net-bw", "1GB/s", "--durable-bw", "1GB/s", "--runs", "10"}
	code, out, errs := runPlanTest(t, args...)
	if code != 0 || !strings.Contains(out, "replicas:0: no in-memory copy") {
		t.Errorf("exit %d, stderr %q, report:\n%s", code, errs, out)
	}
	code, _, errs = runPlanTest(t, append(args, "--redundancy", "replicas:1")...)
	if code != exitUsage || !strings.Contains(errs, "replicas:1 needs at least 2 hosts") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
}

func TestPlanHelp(t *testing.T) {
	for _, a := range []string{"-h", "--help"} {
		code, out, _ := runPlanTest(t, a)
		if code != 0 || !strings.Contains(out, "Usage: gorun plan") {
			t.Errorf("%s: exit %d, %q", a, code, out)
		}
	}
}

// lineOf returns the first line of s that contains sub.
func lineOf(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
