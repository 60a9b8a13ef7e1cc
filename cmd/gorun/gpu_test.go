package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/testcluster"
)

// fakeGPUs writes a fake GPU configuration (package gpu's JSON) with
// devices GPUs on every host, and sets GORUN_FAKE_GPUS for gorun (the
// launcher, its in-process agent, and the agents it starts).
func fakeGPUs(t *testing.T, json string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gpus.json")
	if err := os.WriteFile(path, []byte(json), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GORUN_FAKE_GPUS", path)
}

func fakeDevices(n int) string {
	var d []string
	for i := range n {
		d = append(d, fmt.Sprintf(`{"uuid":"GPU-0000000%d-0000-0000-0000-000000000000","name":"Fake H100","memory_mib":81920,"pci_bus_id":"0000:%02x:00.0","cpus":[%d]}`, i, 7+i, i%2))
	}
	return "[" + strings.Join(d, ",") + "]"
}

// TestRanksAreBoundToGPUs: on a host with GPUs, every local rank gets its
// own (CUDA_VISIBLE_DEVICES, CUDA numbering in PCI bus order), round-robin
// when ranks outnumber them, or G each with --gpus-per-rank.
func TestRanksAreBoundToGPUs(t *testing.T) {
	fakeGPUs(t, `{"devices":`+fakeDevices(4)+`}`)
	tests := []struct {
		name string
		args []string
		want []string // per rank
	}{
		{"one each", []string{"-np", "4"}, []string{"0", "1", "2", "3"}},
		{"shared round-robin", []string{"-np", "6", "--oversubscribe"}, []string{"0", "1", "2", "3", "0", "1"}},
		{"two each", []string{"-np", "2", "--gpus-per-rank", "2"}, []string{"0,1", "2,3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := runJob(t, "gpu", []string{"GORUNTEST_SLEEP_MS=0"}, append(tc.args, os.Args[0])...)
			if res.code != 0 {
				t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
			}
			for r, want := range tc.want {
				line := fmt.Sprintf("[%d] gpu CUDA_VISIBLE_DEVICES=%q CUDA_DEVICE_ORDER=\"PCI_BUS_ID\"", r, want)
				if !strings.Contains(res.stdout, line) {
					t.Errorf("rank %d: want %s\nstdout:\n%s", r, line, res.stdout)
				}
			}
		})
	}
	t.Run("too many GPUs per rank", func(t *testing.T) {
		res := runJob(t, "gpu", []string{"GORUNTEST_SLEEP_MS=0"}, "-np", "3", "--gpus-per-rank", "2", "--oversubscribe", os.Args[0])
		if res.code == 0 || !strings.Contains(res.stderr, "3 local ranks with 2 GPUs each need 6 GPUs; this host has 4") {
			t.Fatalf("exit %d, want a failure naming the GPUs\nstderr:\n%s", res.code, res.stderr)
		}
		t.Log(res.stderr)
	})
	t.Run("slots default to the GPUs over --gpus-per-rank", func(t *testing.T) {
		res := runJob(t, "gpu", []string{"GORUNTEST_SLEEP_MS=0"}, "--gpus-per-rank", "2", os.Args[0])
		if res.code != 0 || strings.Count(res.stdout, "gpu CUDA_VISIBLE_DEVICES") != 2 {
			t.Fatalf("exit %d; want 2 ranks of 2 GPUs\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
	})
	t.Run("slots default to the GPU count", func(t *testing.T) {
		res := runJob(t, "gpu", []string{"GORUNTEST_SLEEP_MS=0"}, os.Args[0])
		if res.code != 0 || strings.Count(res.stdout, "gpu CUDA_VISIBLE_DEVICES") != 4 {
			t.Fatalf("exit %d; want 4 ranks, one per GPU\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
	})
}

// TestCPUOnlyWithoutDriver: with no GPU (no driver here, no fake), ranks
// get no CUDA_VISIBLE_DEVICES and gorun says nothing about it (one info
// line in verbose mode).
func TestCPUOnlyWithoutDriver(t *testing.T) {
	t.Setenv("GORUN_FAKE_GPUS", "")
	res := runJob(t, "gpu", []string{"GORUNTEST_SLEEP_MS=0"}, "-np", "2", os.Args[0])
	if res.code != 0 || strings.Contains(res.stdout, `CUDA_VISIBLE_DEVICES="0"`) || strings.Contains(strings.ToLower(res.stderr), "gpu") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	res = runJob(t, "gpu", []string{"GORUNTEST_SLEEP_MS=0"}, "-v", "-np", "1", os.Args[0])
	if n := strings.Count(res.stderr, "no GPUs: running CPU-only"); n != 1 {
		t.Errorf("verbose: %d info lines about running CPU-only, want 1\nstderr:\n%s", n, res.stderr)
	}
}

// TestGPUFailureIsReported: the fake fails GPU 1 of one host with XID 79
// (fell off the bus) while the job runs; the launcher reports it,
// classified permanent, naming the host, the GPU and the rank bound to it,
// and the job goes on (replacing the host is hot-swap's decision).
func TestGPUFailureIsReported(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	victim := hosts.Names[1]
	fakeGPUs(t, fmt.Sprintf(`{"devices":%s, "hosts":{%q:{"devices":%s,"events":[{"after":"500ms","device":1,"xid":79}]}}}`,
		fakeDevices(2), victim, fakeDevices(2)))
	res := multiHostJob(t, hosts, 2, "gpu", "-x", "GORUNTEST_SLEEP_MS=3000").wait(60 * time.Second)
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
	// Map by slot: ranks 2 and 3 on the second host; rank 3 has its GPU 1.
	re := regexp.MustCompile(`GPU 1 \(GPU-00000001-[0-9a-f-]+\) on host ` + regexp.QuoteMeta(victim) + `, used by rank 3: permanent failure: XID 79`)
	if !re.MatchString(res.stderr) {
		t.Fatalf("no failure report naming host %s, GPU 1 and rank 3 in:\n%s", victim, res.stderr)
	}
	// (Hot-swap's decision on the fault, and its end-of-job note on the
	// host that ran on with it, quote it too.)
	if n := strings.Count(res.stderr, "permanent failure: XID 79"); n != 1 {
		t.Errorf("%d reports of XID 79, want 1 (only the victim's GPU failed)\n%s", n, res.stderr)
	}
}

// TestGPUFaultAtStep: a GPU fault aimed at a step (the fake's when_file,
// created once rank 0 logged step 12) on the second of two hosts with a
// spare. A permanent one (XID 79) replaces the host: a failure record of
// what "gpu", the host fenced, its ranks spliced onto the spare; with
// --redundancy replicas:0, where moving its ranks would lose their state,
// the host stays (a failure record, decision none, no fence; before the
// fix the job stopped, "unrecoverable") and, never replaced, is named
// when the job ends; a transient one (XID 13) is
// reported and nothing else happens. Every job ends as the run without a
// fault: exit 0, the same dptrain hashes.
func TestGPUFaultAtStep(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	victim, spare := c.hosts.Names[1], c.hosts.Names[2]
	dir := t.TempDir()
	permanent, transient := filepath.Join(dir, "xid79"), filepath.Join(dir, "xid13")
	fakeGPUs(t, fmt.Sprintf(`{"devices":%s, "hosts":{%q:{"events":[
		{"device":1,"xid":79,"when_file":%q},
		{"device":0,"xid":13,"when_file":%q}]}}}`, fakeDevices(2), victim, permanent, transient))
	// The reference has the same GPUs, and its events never fall due.
	wantP, wantO := hsReference(t, c)
	xid79 := regexp.MustCompile(`GPU 1 \(GPU-00000001-[0-9a-f-]+\) on host ` + regexp.QuoteMeta(victim) + `, used by rank 3: permanent failure: XID 79`)
	tests := []struct {
		name, trigger string
		flags         []string
		report        *regexp.Regexp
		failure       string // the failure record's decision, "" for none
	}{
		{"transient", transient, nil, regexp.MustCompile(`GPU 0 \(GPU-00000000-[0-9a-f-]+\) on host ` + regexp.QuoteMeta(victim) + `, used by rank 2: transient failure: XID 13`), ""},
		{"permanent", permanent, nil, xid79, "splice"},
		{"permanent, no copy elsewhere", permanent, []string{"--redundancy", "replicas:0"}, xid79, "none"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := c.start(t, tc.flags, "--protect")
			r.waitStep(t, 12)
			if err := os.WriteFile(tc.trigger, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(tc.trigger) // for the next job
			res := r.finish(t, 0)
			defer func() {
				if t.Failed() {
					t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
				}
			}()
			checkHashes(t, res, wantP, wantO)
			if !tc.report.MatchString(res.stderr) {
				t.Errorf("no report matching %s", tc.report)
			}
			evs := readEvents(t, r.events)
			fails, fences, splices := ofKind[events.Failure](evs), ofKind[events.Fence](evs), ofKind[events.Splice](evs)
			if tc.failure == "" {
				if len(fails)+len(fences)+len(splices)+len(ofKind[events.Restart](evs)) > 0 {
					t.Errorf("a transient fault recovered: failures %+v, fences %+v, splices %+v", fails, fences, splices)
				}
				return
			}
			if len(fails) != 1 || fails[0].Host != victim || !strings.Contains(fails[0].Msg, "XID 79") || fails[0].Decision != tc.failure {
				t.Errorf("failures %+v; want one of host %s naming XID 79, decision %s", fails, victim, tc.failure)
			}
			if tc.failure == "none" {
				if len(fences)+len(splices)+len(ofKind[events.Restart](evs)) > 0 {
					t.Errorf("the host was to stay: fences %+v, splices %+v", fences, splices)
				}
				if end := "host " + victim + " ran to the job's end with GPU 1's permanent fault"; !strings.Contains(res.stderr, end) {
					t.Errorf("stderr does not say %q", end)
				}
				return
			}
			if len(fences) != 1 || fences[0].Host != victim {
				t.Errorf("fences %+v; want host %s's", fences, victim)
			}
			if len(splices) != 1 || splices[0].Lost != victim || splices[0].With != spare || !slices.Equal(splices[0].Ranks, []int{2, 3}) {
				t.Errorf("splices %+v; want ranks 2 and 3 from %s onto the spare %s", splices, victim, spare)
			}
		})
	}
}
