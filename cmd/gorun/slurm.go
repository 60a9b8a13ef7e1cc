package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/topology"
)

// scontrolTimeout bounds scontrol show node.
const scontrolTimeout = 15 * time.Second

// launcherKind resolves --launcher auto: Slurm's srun inside a Slurm
// allocation (SLURM_JOB_ID set, srun on PATH) when no hosts are given,
// else ssh.
func (o *runOptions) launcherKind(getenv func(string) string) launcher.LauncherKind {
	if o.launcher != "auto" {
		return launcher.LauncherKind(o.launcher)
	}
	if o.hostfile == "" && o.hostList == "" && getenv("SLURM_JOB_ID") != "" {
		if _, err := exec.LookPath("srun"); err == nil {
			return launcher.LauncherSlurm
		}
	}
	return launcher.LauncherSSH
}

// slurmHosts are the hosts of the Slurm allocation gorun runs in, with
// their addresses from scontrol (NodeAddr: names in many clusters do not
// resolve).
func slurmHosts(getenv func(string) string, gpusPerRank int) ([]topology.Host, error) {
	hosts, err := topology.SlurmHosts(getenv, gpusPerRank)
	if err != nil {
		return nil, usagef("--launcher slurm without a hostfile: %v", strings.TrimPrefix(err.Error(), "topology: "))
	}
	names := make([]string, len(hosts))
	for i, h := range hosts {
		names[i] = h.Name
	}
	ctx, cancel := context.WithTimeout(context.Background(), scontrolTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "scontrol", "-o", "show", "node", strings.Join(names, ",")).Output()
	if err != nil {
		return nil, fmt.Errorf("reading the allocation's node addresses with scontrol: %w", err)
	}
	addrs := nodeAddrs(string(out))
	for i := range hosts {
		if a := addrs[hosts[i].Name]; a != hosts[i].Name {
			hosts[i].Addr = a
		}
	}
	return hosts, nil
}

// nodeAddrs reads NodeName → NodeAddr from scontrol -o show node.
func nodeAddrs(out string) map[string]string {
	addrs := map[string]string{}
	for line := range strings.Lines(out) {
		var name, addr string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "NodeName="); ok {
				name = v
			} else if v, ok := strings.CutPrefix(f, "NodeAddr="); ok {
				addr = v
			}
		}
		if name != "" && addr != "" {
			addrs[name] = addr
		}
	}
	return addrs
}

// slurmSpares marks the allocation's nodes the ranks do not need as
// spares: -np's ranks take the first nodes (in node-list order) whose
// slots hold them, the rest wait as spares, of which there must be at
// least spares. Without -np (np 0) the ranks fill every node but the last
// spares. It returns the hosts and -np.
func slurmSpares(hosts []topology.Host, np, spares int) ([]topology.Host, int, error) {
	n := len(hosts)
	if spares >= n {
		return nil, 0, usagef("--spares %d: the allocation has %d nodes; want 0 to %d (at least one must run ranks)", spares, n, n-1)
	}
	need := n - spares
	if np > 0 {
		slots := 0
		for need = 0; need < n && slots < np; need++ {
			slots += hosts[need].Slots
		}
		if slots < np {
			if spares > 0 {
				return nil, 0, usagef("-np %d: more ranks than the allocation's %d slots on %d nodes, and --spares %d wants nodes they leave free", np, slots, n, spares)
			}
			need = n // -np past the slots: MapRanks says so, or oversubscribes
		}
		if n-need < spares {
			return nil, 0, usagef("--spares %d: -np %d needs %d of the allocation's %d nodes, which leaves %d spare", spares, np, need, n, n-need)
		}
	}
	out := make([]topology.Host, n)
	copy(out, hosts)
	for i := need; i < n; i++ {
		out[i].Spare = true
	}
	if np == 0 {
		for _, h := range out[:need] {
			np += h.Slots
		}
	}
	return out, np, nil
}

// slurmTaskVars are the variables srun and slurmstepd set for one task of
// a step (its rank in the step, the step's size and layout, srun's own
// options); slurmTaskPrefixes start more of them. They describe the
// agents' step, or the batch step gorun runs in, not the ranks: a rank
// taking SLURM_PROCID or SLURM_NTASKS for its own would be wrong. The
// job's variables (SLURM_JOB_*, SLURM_CLUSTER_NAME, ...) stay.
var (
	slurmTaskVars = []string{"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASK_PID", "SLURM_GTIDS",
		"SLURM_STEPID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_NODELIST", "SLURM_TASKS_PER_NODE",
		"SLURM_DISTRIBUTION", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_LABELIO", "SLURM_UNBUFFEREDIO", "SLURM_OVERLAP",
		"SLURM_NO_KILL", "SLURM_KILL_BAD_EXIT", "SLURM_WAIT", "SLURM_MPI_TYPE", "SLURM_PRIO_PROCESS", "SLURM_UMASK",
		"SLURM_TOPOLOGY_ADDR", "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_STDINMODE", "SLURM_STDOUTMODE", "SLURM_STDERRMODE"}
	slurmTaskPrefixes = []string{"SLURM_STEP_", "SLURM_SRUN_COMM_", "SLURM_CPU_BIND", "SLURM_MEM_BIND", "PMI_", "PMIX_"}
)

// dropSlurmTaskEnv removes slurmTaskVars (and the prefixed ones) from this
// process's environment, which the ranks inherit.
func dropSlurmTaskEnv() {
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		drop := slices.Contains(slurmTaskVars, k)
		for _, p := range slurmTaskPrefixes {
			drop = drop || strings.HasPrefix(k, p)
		}
		if drop {
			os.Unsetenv(k)
		}
	}
}
