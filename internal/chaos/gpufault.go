package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/gorun/gorun/internal/events"
)

// The GPUFault kind: the job of a run drawn for it runs on package gpu's
// fake backend (GORUN_FAKE_GPUS, a file in the run's directory): every
// host has one GPU per slot, and a "hosts" section per host holding the
// drawn fault on the drawn GPU, held back by a trigger file of that host
// (the fake's "when_file"). The fault is injected by creating the faulted
// host's trigger file after the drawn committed step; the other hosts'
// never exist. The failure-free reference runs without GPUs: the
// workloads compute on the CPU, so the binding must not change their
// hash either.

// gpuXIDs are the XIDs GPUFault draws, with their class in gpu/doc.go's
// table ("transient 8, 11, 13, 31, 43, 45; permanent 46, 48, ..., 79,
// ..."): the oracle's own copy, so that a product table that classifies
// them otherwise is caught, not followed.
var gpuXIDs = map[uint64]string{
	13: "transient", 31: "transient", 43: "transient",
	48: "permanent", 74: "permanent", 79: "permanent", 119: "permanent",
}

// drawGPUFault draws f's GPU (one per slot: a rank's) and its XID: a
// transient one one time in three, else a permanent one.
func drawGPUFault(r *rand.Rand, c Config, f *Fault) {
	f.GPU = r.IntN(c.RanksPerHost)
	if r.IntN(3) == 0 {
		f.XID = pick[uint64](r, 13, 31, 43)
	} else {
		f.XID = pick[uint64](r, 79, 48, 74, 119)
	}
}

// gpuPermanent reports whether f is a GPUFault whose XID is permanent.
func gpuPermanent(f Fault) bool { return f.Kind == GPUFault && gpuXIDs[f.XID] == "permanent" }

// gpuTrigger is host's trigger file in the run's directory dir.
func gpuTrigger(dir, host string) string { return filepath.Join(dir, "gpu-fault-"+host) }

// gpuFakeEnv writes the fake GPU file of a GPUFault run into dir, for
// hosts (the job's, spares included), and returns the environment that
// selects it; nil for the other kinds.
func gpuFakeEnv(dir string, c Config, f Fault, hosts []string) ([]string, error) {
	if f.Kind != GPUFault {
		return nil, nil
	}
	type event struct {
		Device   int    `json:"device"`
		XID      uint64 `json:"xid"`
		WhenFile string `json:"when_file"`
	}
	type section struct {
		Events []event `json:"events"`
	}
	type device struct {
		UUID     string `json:"uuid"`
		PCIBusID string `json:"pci_bus_id"`
	}
	file := struct {
		Devices []device           `json:"devices"`
		Hosts   map[string]section `json:"hosts"`
	}{Hosts: map[string]section{}}
	for i := range c.RanksPerHost {
		file.Devices = append(file.Devices, device{UUID: fmt.Sprintf("GPU-c4a05000-0000-4000-8000-%012x", i), PCIBusID: fmt.Sprintf("0000:%02x:00.0", i+1)})
	}
	for _, h := range hosts {
		file.Hosts[h] = section{Events: []event{{Device: f.GPU, XID: f.XID, WhenFile: gpuTrigger(dir, h)}}}
	}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("chaos: the fake GPU file: %w", err)
	}
	path := filepath.Join(dir, "gpus.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return nil, fmt.Errorf("chaos: writing the fake GPU file: %w", err)
	}
	return []string{"GORUN_FAKE_GPUS=" + path}, nil
}

// injectGPUFault creates the trigger file of f's host of j: the fake on
// that host reports the XID from then on.
func injectGPUFault(j *Job, f Fault) (string, error) {
	host := j.Hosts[f.Host]
	path := gpuTrigger(filepath.Dir(j.Events), host)
	note := fmt.Sprintf("XID %d (%s) on GPU %d of host %s: created %s", f.XID, gpuXIDs[f.XID], f.GPU, host, path)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return note, fmt.Errorf("chaos: creating the GPU fault's trigger: %w", err)
	}
	return note, nil
}

// withinGPUFault is [Within] for a GPUFault: a transient fault is
// reported only; a permanent one is a host loss when a spare can take the
// host's ranks and their state survives the move (then what a host-kill of
// it promises), and leaves the host in place otherwise (the fake's fault
// breaks no rank): within the promise either way.
func withinGPUFault(f Fault, lost []int, p Plan, c Config, durable bool) (bool, string) {
	if !gpuPermanent(f) {
		return true, `README, GPUs: "Transient and unknown events are reported only"`
	}
	switch gpuReplace(f, p, c, durable) {
	case replaceNo:
		return true, `README, GPUs: a permanent fault replaces the host, but "when nothing can take them, or moving them would lose their state ..., the host stays and its ranks' own failures decide" (the fake's fault fails no rank)`
	case replaceEither:
		return true, `README, GPUs: a permanent fault replaces the host, rolling back to --ckpt-dir, or the host stays (no version committed when it was injected; one may be by its detection)`
	}
	_, why := Within(Fault{Kind: HostKill, Host: f.Host, Host2: -1, Rank: -1, After: f.After}, lost, p, c, durable)
	return true, `README, GPUs: "A permanent fault ... replaces the host as a lost one is"; as a host loss: ` + why
}

// What gorun must do with the host of a permanent GPU fault.
const (
	replaceYes    = "yes"    // replace it: fence it, move its ranks
	replaceNo     = "no"     // keep it: no fence
	replaceEither = "either" // either is right (a commit on disk may come between injection and detection)
)

// gpuReplace says what gorun must do with the host of f, a permanent GPU
// fault, planned as p (README, GPUs): replace it when a spare can take its
// ranks and their state survives the move (from memory: [Plan.SurvivesFromMemory];
// a program without protected state, MPICH, has none to lose; or rolled
// back to the durable tier's committed version), else keep it.
func gpuReplace(f Fault, p Plan, c Config, durable bool) string {
	switch {
	case !p.Replaceable(1):
		return replaceNo
	case c.Workload == MPICH || p.SurvivesFromMemory([]int{f.Host}) || c.Durable && durable:
		return replaceYes
	case c.Durable:
		return replaceEither
	}
	return replaceNo
}

// GPUOutcome is what gorun did of a GPUFault, from its standard error and
// its events file.
type GPUOutcome struct {
	// Reported: a line of gorun's standard error reports the faulted GPU
	// of the faulted host with the XID; Class is the class it gives.
	Reported bool   `json:"reported"`
	Class    string `json:"class,omitempty"`
	// Replace is what gorun must do with the host of a permanent fault
	// (gpuReplace; "" for a transient one).
	Replace string `json:"replace,omitempty"`
	// Failure: a failure record of the host, what "gpu"; Fenced: a fence
	// record of it; Spliced: a splice of its ranks onto another host.
	Failure bool `json:"failure,omitempty"`
	Fenced  bool `json:"fenced,omitempty"`
	Spliced bool `json:"spliced,omitempty"`
	// Recoveries are the failure, fence, splice and restart records of
	// the job, any host's.
	Recoveries int `json:"recoveries,omitempty"`
}

// gpuReportRE matches the launcher's GPU report line (README, GPUs:
// "gorun: GPU 1 (GPU-…) on host node7, used by rank 3: permanent failure:
// XID 79: ...").
var gpuReportRE = regexp.MustCompile(`GPU (\d+) \(GPU-[^)]*\) on host (\S+), used by [^:]*: (\S+) failure: XID (\d+):`)

// gpuOutcome reads what gorun did of f from its standard error and its
// events file's records (of a job on hosts).
func gpuOutcome(f Fault, stderr string, recs []events.Record, hosts []string) *GPUOutcome {
	host := hosts[f.Host]
	var o GPUOutcome
	for _, m := range gpuReportRE.FindAllStringSubmatch(stderr, -1) {
		if m[1] == fmt.Sprint(f.GPU) && m[2] == host && m[4] == fmt.Sprint(f.XID) {
			o.Reported, o.Class = true, m[3]
			break
		}
	}
	for _, rec := range recs {
		switch e := rec.Event.(type) {
		case events.Failure:
			o.Recoveries++
			if e.Host == host && e.What == events.FailGPU {
				o.Failure = true
			}
		case events.Fence:
			o.Recoveries++
			o.Fenced = o.Fenced || e.Host == host
		case events.Splice:
			o.Recoveries++
			o.Spliced = o.Spliced || e.Lost == host
		case events.Restart:
			o.Recoveries++
		}
	}
	return &o
}

// gpuFaultFailures are the GPUFault rules r breaks, landed (its report
// seen), each "rule: what was seen".
func gpuFaultFailures(r Run) []string {
	o := r.GPU
	if r.Fault.Kind != GPUFault || o == nil || !o.Reported {
		return nil
	}
	var out []string
	want := gpuXIDs[r.Fault.XID]
	if o.Class != want {
		out = append(out, fmt.Sprintf("gpu-fault-classified: XID %d reported %s, gpu/doc.go's table says %s", r.Fault.XID, o.Class, want))
	}
	if want != "permanent" {
		if o.Recoveries > 0 {
			out = append(out, fmt.Sprintf("gpu-transient-reported-only: XID %d (transient) and %d failure, fence, splice or restart records", r.Fault.XID, o.Recoveries))
		}
		return out
	}
	var missing []string
	if !o.Failure {
		missing = append(missing, `a failure record (what "gpu") of the host`)
	}
	switch o.Replace {
	case replaceYes:
		if !o.Fenced {
			missing = append(missing, "the host's fence")
		}
		if r.Code == 0 && !o.Spliced {
			missing = append(missing, "a splice of its ranks onto the spare")
		}
	case replaceNo:
		if o.Fenced {
			missing = append(missing, "no fence (the host stays)")
		}
	}
	if len(missing) > 0 {
		out = append(out, fmt.Sprintf("gpu-permanent-replaces: XID %d (permanent) on host %d, replace %q: want %s", r.Fault.XID, r.Fault.Host, o.Replace, strings.Join(missing, ", ")))
	}
	return out
}
