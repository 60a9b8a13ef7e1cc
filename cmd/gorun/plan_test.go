package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/plan"
	"github.com/gorun/gorun/launcher"
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
	if !strings.Contains(out, "measured in "+dir+", one host alone (an upper bound") {
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
		{"bits as a size", append(planBase, "--state", "10Gb"), `--state "10Gb": "Gb" is bits`},
		{"unit in the wrong case", append(planBase, "--net-bw", "10gb/s"), "units are case-sensitive: GB"},
		{"bandwidth without /s", append(planBase, "--net-bw", "10GB"), "--net-bw"},
		{"bad duration", append(planBase, "--mttf", "soon"), "--mttf"},
		{"bad redundancy", append(planBase, "--redundancy", "ec:2"), `--redundancy "ec:2"`},
		{"ec wider than hosts", append(planBase, "--redundancy", "ec:16+4"), "--redundancy ec:16+4 over 16 hosts"},
		// what gorun run refuses (topology.PlanEC): hosts not in whole
		// groups, a group's ranks not a multiple of K
		{"ec hosts not whole groups", append(planBase, "--hosts", "6", "--redundancy", "ec:2+2"), "--redundancy ec:2+2 over 6 hosts"},
		{"ec ranks not a multiple of K", append(planBase, "--hosts", "5", "--ranks-per-host", "1", "--redundancy", "ec:3+2"), "not a multiple of K = 3"},
		{"concurrency 9", append(planBase, "--ckpt-concurrency", "9"), "--ckpt-concurrency must be 1 to 8, not 9"},
		// errors of the models name the flag, not a Go field
		{"too many hosts", append(planBase, "--hosts", "2000000"), "--hosts must be 1 to 1048576"},
		{"too many ranks per host", append(planBase, "--ranks-per-host", "100000"), "--ranks-per-host must be 1 to"},
		{"too many spares", append(planBase, "--spares", "2000000"), "--spares must be 0 to 1048576"},
		{"mttf 1ns", append(planBase, "--mttf", "1ns"), "--mttf 1e-09 s over 16 hosts"},
		{"runs unbounded", append(planBase, "--runs", "20000000"), "--runs must be 1 to 1000000"},
		{"step longer than the job", append(planBase, "--step", "40d", "--job-length", "1d"), "--step 3.456e+06 s is longer than the job"},
		{"durable total and per host", append(planBase, "--durable-bw-total", "2GB/s"), "--durable-bw and --durable-bw-total: give one of them"},
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

// The contradictions and the checks that need no measuring are made
// before the network is measured (which can take a minute).
func TestPlanChecksBeforeMeasuring(t *testing.T) {
	hf := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(hf, []byte("a\nb\nc\nd\n"), 0o644)
	base := []string{"--hostfile", hf, "--mttf", "365d", "--job-length", "7d", "--step", "1s", "--state", "1GB"}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"durable both", []string{"--durable-bw", "1GB/s", "--durable-dir", t.TempDir()}, "--durable-bw and --durable-dir"},
		{"bad durable unit", []string{"--durable-bw", "1XB/s"}, "--durable-bw"},
		{"ec not whole groups", []string{"--redundancy", "ec:3+2"}, "--redundancy ec:3+2"},
		{"step longer than the job", []string{"--step", "8d"}, "--step"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb strings.Builder
			deps := planDeps{now: time.Now, fs: plan.OSFS{}, stdout: &out,
				memBW: func() (float64, error) { t.Error("memory measured"); return 1e9, nil },
				net: func(context.Context, []string) ([]byte, error) {
					t.Error("network measured")
					return nil, errors.New("no")
				}}
			code := runPlan(context.Background(), append(slices.Clone(base), c.args...), deps, &errb)
			if code != exitUsage || !strings.Contains(errb.String(), c.want) {
				t.Errorf("exit %d, stderr %q; want 2 naming %q", code, errb.String(), c.want)
			}
		})
	}
}

// The plan's bound on checkpoints in flight is gorun run's.
func TestPlanConcurrencyBound(t *testing.T) {
	if plan.MaxConcurrency != launcher.MaxCkptConcurrency {
		t.Errorf("plan.MaxConcurrency = %d, gorun run's --ckpt-concurrency takes 1 to %d", plan.MaxConcurrency, launcher.MaxCkptConcurrency)
	}
}

// --durable-bw-total is the storage's aggregate, shared by every host:
// T_w is a host's state over its share.
func TestPlanDurableTotal(t *testing.T) {
	args := slices.Clone(planBase)
	i := slices.Index(args, "--durable-bw")
	args = slices.Delete(args, i, i+2)
	code, out, errs := runPlanTest(t, append(args, "--durable-bw-total", "2GB/s", "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got planOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	// 16 hosts of 4 ranks of 2 GiB: 8 GiB per host over 2 GB/s / 16
	if want := float64(8<<30) / (2e9 / 16); got.Result.WriteTime != want {
		t.Errorf("T_w = %v, want %v", got.Result.WriteTime, want)
	}
	for _, in := range got.Inputs {
		if in.Name == "durable-bw" && !strings.Contains(in.Source, "--durable-bw-total 2 GB/s shared by 16 hosts") {
			t.Errorf("durable-bw's source %q does not say it is the total's share", in.Source)
		}
	}
}

// Bits per second are bits: 100Gb/s and 100Gbit/s are 12.5 GB/s.
func TestPlanBits(t *testing.T) {
	for _, bw := range []string{"100Gb/s", "100Gbit/s"} {
		code, out, errs := runPlanTest(t, append(slices.Clone(planBase), "--net-bw", bw)...)
		if code != 0 || !strings.Contains(lineOf(out, "  net-bw "), "12.5 GB/s") {
			t.Errorf("--net-bw %s: exit %d, %s, net-bw line %q, want 12.5 GB/s", bw, code, errs, lineOf(out, "  net-bw "))
		}
	}
}

// Without --interval the costs are computed at f*; at a given interval
// where T_w > N·K·t the report warns of the stall; an interval longer
// than the job is refused (review finding 7).
func TestPlanInterval(t *testing.T) {
	shared := []string{"--hosts", "1000", "--mttf", "5y", "--job-length", "30d", "--step", "20s", "--state", "10GiB",
		"--net-bw", "25GB/s", "--mem-bw", "20GB/s", "--durable-bw-total", "2GB/s", "--runs", "10"}
	shared[3] = "43800h"
	code, out, errs := runPlanTest(t, append(slices.Clone(shared), "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got planOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	// at f* the stall is within the accepted overhead, q − 1 = 0.03
	if r := got.Result; r.Interval != r.IntervalFStar || r.StallFraction > 0.03 {
		t.Errorf("without --interval: K = %d, f* = %d, stall %v; want K = f*, a stall within 0.03", r.Interval, r.IntervalFStar, r.StallFraction)
	}
	code, out, errs = runPlanTest(t, append(slices.Clone(shared), "--interval", "100")...)
	if code != 0 || !strings.Contains(out, "warning: at 100 steps T_w > N·K·t: checkpointing stalls training by 168% of its time") {
		t.Errorf("--interval 100: exit %d %s, no stall warning:\n%s", code, errs, out)
	}
	code, _, errs = runPlanTest(t, append(slices.Clone(shared), "--interval", "200000")...)
	if code != exitUsage || !strings.Contains(errs, "--interval 200000: 200000 steps of 20s are longer than the job") {
		t.Errorf("--interval longer than the job: exit %d, %q", code, errs)
	}
}

// Host replacement's E[C] and η with spares running out are in the
// report (review finding 6).
func TestPlanBlendedRows(t *testing.T) {
	code, out, errs := runPlanTest(t, append(slices.Clone(planBase), "--spares", "0")...)
	if code != 0 || !strings.Contains(out, "E[C], those at checkpoint-restart's") || !strings.Contains(out, "efficiency η, the same") {
		t.Errorf("exit %d %s; no blended rows:\n%s", code, errs, out)
	}
}

// A failure log as clusters write them: a header, RFC 3339 timestamps,
// extra columns; --trace-start sets where the timestamps count from.
func TestPlanTraceLog(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "xid.csv")
	os.WriteFile(trace, []byte("time,host,xid\n2026-01-05T10:00:00Z,n1,79\n2026-01-06T10:00:00Z,n3,48\n"), 0o644)
	args := []string{"--hosts", "8", "--trace", trace, "--trace-start", "2026-01-05T00:00:00Z", "--job-length", "48h",
		"--step", "10s", "--state", "1GiB", "--mem-bw", "10GB/s", "--json", "--runs", "10"}
	code, out, errs := runPlanTest(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got planOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	// 2 failures over 48h on 8 hosts: MTTF_sys 24h
	if got.Result.MTTFSys != 24*3600 || got.Result.MonteCarlo.Failures != 2 {
		t.Errorf("MTTF_sys %v s, failures %v: want 24h, 2", got.Result.MTTFSys, got.Result.MonteCarlo.Failures)
	}
	code, _, errs = runPlanTest(t, "--hosts", "8", "--trace", trace, "--trace-start", "2026-01-06T00:00:00Z", "--step", "10s", "--state", "1GiB")
	if code != exitUsage || !strings.Contains(errs, "line 2: 2026-01-05T10:00:00Z is before the trace's start") {
		t.Errorf("a failure before --trace-start: exit %d, %q", code, errs)
	}
}

// The README's example of gorun plan is the command's real output.
func TestPlanREADMEExample(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "## Planning a job\n")
	if !ok {
		t.Fatal("README has no section Planning a job")
	}
	blocks := strings.Split(sec, "```\n")
	if len(blocks) < 4 {
		t.Fatal("the section lacks the command and its output")
	}
	cmdline := strings.ReplaceAll(blocks[1], "\\\n", " ")
	args := strings.Fields(cmdline)
	if len(args) < 2 || args[0] != "gorun" || args[1] != "plan" {
		t.Fatalf("the first block is not a gorun plan command: %q", blocks[1])
	}
	code, out, errs := runPlanTest(t, args[2:]...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if out != blocks[3] {
		t.Errorf("README's output differs from the command's; the command prints:\n%s", out)
	}
}
