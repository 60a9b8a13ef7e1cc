package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"

	"github.com/gorun/gorun/gpu"
	"github.com/gorun/gorun/internal/wire"
	"golang.org/x/sys/unix"
)

// hostGPUs is what the agent knows of its host's GPUs: the devices it may
// hand out (those of the agent's own CUDA_VISIBLE_DEVICES, when an
// allocation set it) and the binding of each local rank.
type hostGPUs struct {
	backend gpu.Backend // nil: CPU-only
	devs    []gpu.Device

	mu    sync.Mutex
	binds map[int]gpu.Binding // by rank

	stop context.CancelFunc // ends the watch
	wg   subgroup           // the watch's forwarder
}

// openGPUs finds the host's GPUs. A host without an NVIDIA driver runs
// CPU-only (one info line); any other failure is logged as a warning, and
// the host runs CPU-only too.
func openGPUs(ctx context.Context, a *agent) *hostGPUs {
	g := &hostGPUs{binds: map[int]gpu.Binding{}}
	b, err := gpu.Open(ctx, gpu.Options{Host: a.cfg.Name, Logger: a.log})
	if errors.Is(err, gpu.ErrNoDriver) {
		a.log.Info("no GPUs: running CPU-only", "why", err)
		return g
	}
	if err != nil {
		a.log.Warn("GPU discovery failed: running CPU-only", "err", err)
		return g
	}
	// The allocation's CUDA_VISIBLE_DEVICES (Slurm's gres, a container
	// runtime) says which GPUs are ours; one that names GPUs the host lacks
	// gets none rather than GPUs that are not ours.
	devs, err := gpu.Restrict(b.Devices(), os.Getenv("CUDA_VISIBLE_DEVICES"))
	if err != nil {
		a.log.Warn("not using the host's GPUs", "err", err)
	}
	if len(devs) == 0 {
		b.Close()
		return g
	}
	g.backend, g.devs = b, devs
	a.log.Info("GPUs", "count", len(devs))
	return g
}

// env returns the variables that bind rank pl to its GPUs, and records the
// binding; nil on a CPU-only host, or when the user set
// CUDA_VISIBLE_DEVICES for the ranks (-x), which then wins.
func (g *hostGPUs) env(spec *wire.JobSpec, pl wire.Placement) ([]string, error) {
	if len(g.devs) == 0 || hasVar(spec.Env, "CUDA_VISIBLE_DEVICES") {
		return nil, nil
	}
	b, err := gpu.Bind(g.devs, pl.LocalRank, pl.LocalSize, spec.GPUsPerRank)
	if err != nil {
		return nil, fmt.Errorf("binding rank %d to GPUs: %w", pl.Rank, err)
	}
	g.mu.Lock()
	g.binds[pl.Rank] = b
	g.mu.Unlock()
	env := []string{"CUDA_VISIBLE_DEVICES=" + b.VisibleDevices}
	// NVML numbers devices in PCI bus order, CUDA by default fastest
	// first: make CUDA count as NVML does, unless the user chose.
	if !hasVar(spec.Env, "CUDA_DEVICE_ORDER") && os.Getenv("CUDA_DEVICE_ORDER") == "" {
		env = append(env, "CUDA_DEVICE_ORDER=PCI_BUS_ID")
	}
	return env, nil
}

// pin sets the CPU affinity of a started rank to the CPUs near its GPUs
// (those the agent itself may use), on every thread it has (a Go or CUDA
// runtime may have started some already; threads started later inherit
// it). The rank has just been exec'd: its first instructions may still
// have run elsewhere.
func (g *hostGPUs) pin(a *agent, rank, pid int) {
	g.mu.Lock()
	b, ok := g.binds[rank]
	g.mu.Unlock()
	if !ok || len(b.CPUs) == 0 {
		return
	}
	var mine, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		return
	}
	n := 0
	for _, c := range b.CPUs {
		if mine.IsSet(c) {
			set.Set(c)
			n++
		}
	}
	if n == 0 {
		return // none of the GPU's CPUs is ours: leave the rank alone
	}
	tids := []int{pid}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
		tids = tids[:0]
		for _, e := range ents {
			if tid, err := strconv.Atoi(e.Name()); err == nil {
				tids = append(tids, tid)
			}
		}
	}
	for _, tid := range tids {
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			a.log.Warn("cannot pin rank to the CPUs of its GPU", "rank", rank, "tid", tid, "err", err)
		}
	}
}

// watch forwards the GPUs' health events to the launcher, each as an
// EventGPU naming the ranks bound to the device, until close.
func (g *hostGPUs) watch(ctx context.Context, a *agent) {
	if g.backend == nil {
		return
	}
	ctx, g.stop = context.WithCancel(ctx)
	g.wg = newSubgroup(&a.tasks, "GPU health watch")
	events, err := g.backend.Watch(ctx)
	if err != nil {
		a.log.Warn("cannot watch GPU health", "err", err)
		return
	}
	g.wg.Go(func() {
		for e := range events {
			var ranks []int
			g.mu.Lock()
			for r, b := range g.binds {
				if slices.Contains(b.Devices, e.Device) {
					ranks = append(ranks, r)
				}
			}
			g.mu.Unlock()
			slices.Sort(ranks)
			a.log.Info("GPU health event", "gpu", e.Device, "class", e.Class, "detail", e.Detail)
			a.event(&wire.Event{Kind: wire.EventGPU, Host: a.cfg.Host, Rank: -1, Msg: e.Detail,
				GPU: &wire.GPUReport{Index: e.Device, UUID: e.UUID, Kind: e.Kind.String(), XID: e.XID, Class: e.Class.String(), Ranks: ranks}})
		}
	})
}

// close ends the watch and releases the backend.
func (g *hostGPUs) close() {
	if g.stop != nil {
		g.stop()
	}
	g.wg.Wait()
	if g.backend != nil {
		g.backend.Close()
	}
}
