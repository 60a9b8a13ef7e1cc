package chaos

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/gpu"
	"github.com/gorun/gorun/internal/events"
)

// judgeCase is one of TestJudge's cases.
type judgeCase = struct {
	name  string
	run   Run
	class string
	rules []string
}

// gpuJudgeCases are TestJudge's cases of GPUFault: every one but the
// survived ones fails without its rule (Judge would call it survived).
func gpuJudgeCases() []judgeCase {
	const ref = "params aa optimizer bb"
	run := func(xid uint64, spares int, o GPUOutcome) Run {
		return Run{Config: Config{Workload: Dptrain, Hosts: 2, Spares: spares, RanksPerHost: 2},
			Fault:   Fault{Kind: GPUFault, Host: 1, Host2: -1, Rank: -1, GPU: 1, XID: xid},
			RefHash: ref, Hash: ref, Within: true, GPU: &o, FaultToDetect: -1, DetectToResume: -1}
	}
	replaced := GPUOutcome{Reported: true, Class: "permanent", Failure: true, Fenced: true, Spliced: true, Recoveries: 3}
	stays := GPUOutcome{Reported: true, Class: "permanent", Failure: true, Recoveries: 1}
	must := func(replace string, o GPUOutcome) GPUOutcome { o.Replace = replace; return o }
	return []judgeCase{
		{"gpu transient, reported only", run(13, 1, GPUOutcome{Reported: true, Class: "transient"}), Survived, nil},
		{"gpu transient, the host fenced", run(31, 1, GPUOutcome{Reported: true, Class: "transient", Fenced: true, Recoveries: 1}), Failed, []string{"gpu-transient-reported-only"}},
		{"gpu transient classified permanent", run(13, 0, GPUOutcome{Reported: true, Class: "permanent"}), Failed, []string{"gpu-fault-classified"}},
		{"gpu permanent classified unknown", run(79, 0, must(replaceNo, GPUOutcome{Reported: true, Class: "unknown", Failure: true})), Failed, []string{"gpu-fault-classified"}},
		{"gpu permanent, replaced by the spare", run(79, 1, must(replaceYes, replaced)), Survived, nil},
		{"gpu permanent, a spare, the host kept", run(48, 1, must(replaceYes, stays)), Failed, []string{"gpu-permanent-replaces"}},
		{"gpu permanent, fenced, not spliced", run(79, 1, must(replaceYes, GPUOutcome{Reported: true, Class: "permanent", Failure: true, Fenced: true, Recoveries: 2})), Failed, []string{"gpu-permanent-replaces"}},
		{"gpu permanent, no spare, the host stays", run(74, 0, must(replaceNo, stays)), Survived, nil},
		{"gpu permanent, no spare, fenced", run(119, 0, must(replaceNo, replaced)), Failed, []string{"gpu-permanent-replaces"}},
		{"gpu permanent, state would be lost, the host stays", run(74, 1, must(replaceNo, stays)), Survived, nil},
		{"gpu permanent, state would be lost, the job stopped", func() Run {
			r := run(74, 1, must(replaceNo, GPUOutcome{Reported: true, Class: "permanent", Failure: true, Fenced: true, Recoveries: 2}))
			r.Code, r.Hash, r.Reported = 1, "", "unrecoverable: rank 2's optimizer shard has no copy in memory (no replicas) (I3); stopping the job"
			return r
		}(), Failed, []string{"gpu-permanent-replaces", "within-exit-0"}},
		{"gpu permanent, a commit on disk may have come: kept", run(79, 1, must(replaceEither, stays)), Survived, nil},
		{"gpu permanent, a commit on disk may have come: replaced", run(79, 1, must(replaceEither, replaced)), Survived, nil},
		{"gpu permanent, no failure record", run(79, 0, must(replaceNo, GPUOutcome{Reported: true, Class: "permanent"})), Failed, []string{"gpu-permanent-replaces"}},
		{"gpu fault not reported: not landed", func() Run {
			r := run(79, 1, GPUOutcome{})
			r.NotLanded = true
			return r
		}(), NotLanded, nil},
	}
}

// TestGPUFaultDraw: a gpu-fault run draws a GPU of the host (one per
// slot) and an XID of gpuXIDs, both classes over the runs; a permanent
// one loses its host, a transient one none.
func TestGPUFaultDraw(t *testing.T) {
	classes := map[string]int{}
	for i := range 60 {
		c, f := Draw(2026, i, []Kind{GPUFault})
		if f.Kind != GPUFault || f.GPU < 0 || f.GPU >= c.RanksPerHost || f.Host < 0 || f.Host >= c.Hosts || f.Rank != -1 {
			t.Fatalf("run %d: %v (%d ranks per host, %d hosts)", i, f, c.RanksPerHost, c.Hosts)
		}
		class, ok := gpuXIDs[f.XID]
		if !ok {
			t.Fatalf("run %d: XID %d not in gpuXIDs", i, f.XID)
		}
		classes[class]++
		if lost := f.Lost(); (class == "permanent") != slices.Equal(lost, []int{f.Host}) || (class == "transient" && lost != nil) {
			t.Errorf("run %d: %v loses %v", i, f, lost)
		}
	}
	if classes["permanent"] == 0 || classes["transient"] == 0 {
		t.Errorf("60 runs drew %v; want both classes", classes)
	}
	// The kinds before it draw as they did: the same stream, and
	// GPUFault's fields stay zero.
	for i := range 20 {
		_, f := Draw(2026, i, []Kind{HostKill})
		if f.GPU != 0 || f.XID != 0 {
			t.Errorf("run %d: host-kill %+v has GPU fields", i, f)
		}
	}
}

// TestWithinGPUFault: a GPU fault is within the promise; a permanent one
// replaces the host when a spare can take its ranks and their state
// survives the move, and keeps it otherwise.
func TestWithinGPUFault(t *testing.T) {
	names := []string{"h0", "h1", "h2", "h3"}
	c := Config{Workload: Dptrain, Hosts: 2, RanksPerHost: 1, TP: 1, PP: 1, Redundancy: "replicas:0",
		Recovery: "restart", Protect: "full", Params: "4096", Steps: 30, Seed: 1}
	spare := c
	spare.Spares = 1
	permanent := Fault{Kind: GPUFault, Host: 1, Host2: -1, Rank: -1, XID: 79}
	transient := permanent
	transient.XID = 13
	durable := spare
	durable.Durable = true
	tests := []struct {
		name      string
		c         Config
		f         Fault
		committed bool
		replace   string
	}{
		{"transient", spare, transient, false, ""},
		{"permanent, no spare: the host stays", c, permanent, false, replaceNo},
		// replicas:0: the host's ranks' state is on it alone.
		{"permanent, a spare, no copy elsewhere: the host stays", spare, permanent, false, replaceNo},
		{"permanent, a spare, a version on disk: rolled back", durable, permanent, true, replaceYes},
		{"permanent, a spare, no version on disk yet", durable, permanent, false, replaceEither},
	}
	for _, tt := range tests {
		p := Precheck(tt.c, names)
		if p.Err != nil {
			t.Fatalf("%s: Precheck: %v", tt.name, p.Err)
		}
		if got, why := Within(tt.f, tt.f.Lost(), p, tt.c, tt.committed); !got || !strings.Contains(why, "README, GPUs") {
			t.Errorf("%s: Within = %v (%s), want within, citing README, GPUs", tt.name, got, why)
		}
		if tt.replace != "" {
			if got := gpuReplace(tt.f, p, tt.c, tt.committed); got != tt.replace {
				t.Errorf("%s: gpuReplace = %q, want %q", tt.name, got, tt.replace)
			}
		}
	}
	replicas := spare
	replicas.Hosts, replicas.Redundancy = 3, "replicas:1"
	if p := Precheck(replicas, names); gpuReplace(permanent, p, replicas, false) != replaceYes {
		t.Errorf("replicas:1 and a spare: the host must be replaced")
	}
}

// TestGPUFakeFile: the fake GPU file a gpu-fault run writes opens on
// every host of the job (package gpu checks it), one GPU per slot, and
// only the faulted host's GPU reports the XID once its trigger exists.
func TestGPUFakeFile(t *testing.T) {
	dir := t.TempDir()
	c := Config{Hosts: 2, Spares: 1, RanksPerHost: 2}
	f := Fault{Kind: GPUFault, Host: 1, Host2: -1, Rank: -1, GPU: 1, XID: 79, After: 3}
	hosts := []string{"h0", "h1", "h2"}
	env, err := gpuFakeEnv(dir, c, f, hosts)
	if err != nil || len(env) != 1 || !strings.HasPrefix(env[0], "GORUN_FAKE_GPUS="+dir) {
		t.Fatalf("gpuFakeEnv = %q, %v", env, err)
	}
	path := strings.TrimPrefix(env[0], "GORUN_FAKE_GPUS=")
	if env, err := gpuFakeEnv(t.TempDir(), c, Fault{Kind: HostKill}, hosts); env != nil || err != nil {
		t.Errorf("host-kill: gpuFakeEnv = %q, %v; want nothing", env, err)
	}
	watch := map[string]<-chan gpu.Event{}
	for _, h := range hosts {
		b, err := gpu.Open(t.Context(), gpu.Options{Fake: path, Host: h})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		if n := len(b.Devices()); n != 2 {
			t.Fatalf("host %s: %d GPUs, want 2", h, n)
		}
		if watch[h], err = b.Watch(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	j := &Job{Hosts: hosts, Events: filepath.Join(dir, "events.jsonl")}
	note, err := injectGPUFault(j, f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gpuTrigger(dir, "h1")); err != nil || !strings.Contains(note, "host h1") {
		t.Fatalf("after injectGPUFault (%s): %v", note, err)
	}
	if e := <-watch["h1"]; e.Device != 1 || e.XID != 79 || e.Class != gpu.Permanent {
		t.Errorf("h1 reported %+v; want XID 79 on GPU 1", e)
	}
	for _, h := range []string{"h0", "h2"} {
		select {
		case e := <-watch[h]:
			t.Errorf("host %s, not faulted, reported %+v", h, e)
		default:
		}
	}
}

// TestGPUOutcome reads the report line and the records of the faulted
// host, not another's.
func TestGPUOutcome(t *testing.T) {
	f := Fault{Kind: GPUFault, Host: 1, Host2: -1, Rank: -1, GPU: 1, XID: 79}
	hosts := []string{"h0", "h1", "h2"}
	stderr := "gorun: GPU 1 (GPU-c4a05000-0000-4000-8000-000000000001) on host h0, used by rank 1: transient failure: XID 79: GPU has fallen off the bus\n" +
		"gorun: GPU 1 (GPU-c4a05000-0000-4000-8000-000000000001) on host h1, used by rank 3: permanent failure: XID 79: GPU has fallen off the bus\n"
	recs := []events.Record{
		{T: 3, Event: events.Failure{Host: "h1", Rank: -1, What: events.FailGPU}},
		{T: 3, Event: events.Fence{Host: "h1"}},
		{T: 4, Event: events.Splice{Lost: "h1", With: "h2", Ranks: []int{2, 3}}},
	}
	o := gpuOutcome(f, stderr, recs, hosts)
	want := GPUOutcome{Reported: true, Class: "permanent", Failure: true, Fenced: true, Spliced: true, Recoveries: 3}
	if *o != want {
		t.Errorf("gpuOutcome = %+v, want %+v", *o, want)
	}
	if o := gpuOutcome(f, stderr[:strings.Index(stderr, "\n")+1], recs[:0], hosts); o.Reported {
		t.Errorf("another host's report read as the fault's: %+v", *o)
	}
}
