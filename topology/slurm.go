package topology

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ParseSlurmCounts expands a Slurm per-node count list, as in
// SLURM_TASKS_PER_NODE or SLURM_JOB_CPUS_PER_NODE: comma-separated items,
// each "N" (one node) or "N(xM)" (M nodes of N each), so "2(x3),1" is
// [2 2 2 1]. Every count is 1 to 2^20 and the list names at most as many
// nodes as a node list may; errors wrap ErrBadValue or ErrTooLarge.
func ParseSlurmCounts(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("topology: slurm counts: %w", errorf(ErrBadValue, "empty list"))
	}
	var out []int
	for item := range strings.SplitSeq(s, ",") {
		n, reps, err := parseSlurmCount(item)
		if err != nil {
			return nil, fmt.Errorf("topology: slurm counts %s: %w", shorten(s), err)
		}
		if reps > maxHosts-len(out) {
			return nil, fmt.Errorf("topology: slurm counts %s: %w", shorten(s), errorf(ErrTooLarge, "more than %d nodes", maxHosts))
		}
		for range reps {
			out = append(out, n)
		}
	}
	return out, nil
}

// parseSlurmCount parses one "N" or "N(xM)" item.
func parseSlurmCount(item string) (n, reps int, err error) {
	count, rest, repeated := strings.Cut(item, "(x")
	reps = 1
	if repeated {
		r, ok := strings.CutSuffix(rest, ")")
		if !ok {
			return 0, 0, errorf(ErrBadValue, "item %s: want N or N(xM)", shorten(item))
		}
		if reps, err = slurmNumber(r, maxHosts); err != nil {
			return 0, 0, errorf(ErrBadValue, "item %s: repeat count: %v", shorten(item), err)
		}
	}
	if n, err = slurmNumber(count, maxSlots); err != nil {
		return 0, 0, errorf(ErrBadValue, "item %s: %v", shorten(item), err)
	}
	return n, reps, nil
}

// slurmNumber parses decimal digits only, 1 to limit.
func slurmNumber(s string, limit int) (int, error) {
	if s == "" || len(s) > maxDigits || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%s is not a number", shorten(s))
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 || v > limit {
		return 0, fmt.Errorf("%s is not between 1 and %d", s, limit)
	}
	return v, nil
}

// SlurmCountsString is the compressed form of counts that
// ParseSlurmCounts reads: runs of equal counts as "N(xM)".
func SlurmCountsString(counts []int) string {
	var b strings.Builder
	for i := 0; i < len(counts); {
		j := i
		for j < len(counts) && counts[j] == counts[i] {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(counts[i]))
		if j-i > 1 {
			fmt.Fprintf(&b, "(x%d)", j-i)
		}
		i = j
	}
	return b.String()
}

// SlurmHosts returns the hosts of the Slurm allocation that getenv (as
// os.Getenv) describes, in node-list order, with Source "slurm". Names
// come from SLURM_JOB_NODELIST (or SLURM_NODELIST). Slots are, in this
// order of preference: SLURM_TASKS_PER_NODE when the allocation asked for
// tasks (SLURM_NTASKS or SLURM_NPROCS is set) and getenv is not a step's
// task (inSlurmStep: those are the step's counts); one per GPU
// (SLURM_GPUS_ON_NODE unless 0, divided by gpusPerRank when above 1), as on a host
// without a hostfile; SLURM_JOB_CPUS_PER_NODE divided by
// SLURM_CPUS_PER_TASK (at least 1 each); SLURM_CPUS_ON_NODE for every
// node. A per-node list must name as many nodes as the node list. An
// allocation without a node list is an error wrapping ErrNoHosts; a
// heterogeneous job's (SLURM_HET_SIZE), errors.ErrUnsupported.
func SlurmHosts(getenv func(string) string, gpusPerRank int) ([]Host, error) {
	if getenv("SLURM_HET_SIZE") != "" {
		return nil, fmt.Errorf("topology: slurm: %w: a heterogeneous job (SLURM_HET_SIZE is set); give a --hostfile, or allocate one component", errors.ErrUnsupported)
	}
	list := getenv("SLURM_JOB_NODELIST")
	if list == "" {
		list = getenv("SLURM_NODELIST")
	}
	if list == "" {
		return nil, fmt.Errorf("topology: slurm: %w", errorf(ErrNoHosts, "SLURM_JOB_NODELIST is not set"))
	}
	names, err := ExpandNodeList(list)
	if err != nil {
		return nil, fmt.Errorf("topology: slurm: SLURM_JOB_NODELIST: %w", err)
	}
	slots, err := slurmSlots(getenv, len(names), gpusPerRank)
	if err != nil {
		return nil, err
	}
	hosts := make([]Host, len(names))
	for i, name := range names {
		hosts[i] = Host{Name: name, Slots: slots[i], Source: "slurm"}
	}
	return hosts, nil
}

// slurmMaxNormalStep is Slurm's SLURM_MAX_NORMAL_STEP_ID: the ids above
// it are its own steps' (batch, extern, interactive, pending).
const slurmMaxNormalStep = 0xfffffff0

// inSlurmStep reports whether getenv is a task's of a job step (srun
// --pty bash in an allocation) rather than the allocation's shell or the
// batch script: a numbered step (SLURM_STEP_ID, which the batch step does
// not set in Slurm 22.05), or one whose nodes are not the job's
// (SLURM_STEP_NODELIST). A step's SLURM_NTASKS and SLURM_TASKS_PER_NODE
// are then its own, not the allocation's.
func inSlurmStep(getenv func(string) string) bool {
	if id, err := strconv.ParseUint(getenv("SLURM_STEP_ID"), 10, 32); err == nil && id <= slurmMaxNormalStep {
		return true
	}
	step := getenv("SLURM_STEP_NODELIST")
	if step == "" {
		return false
	}
	job := getenv("SLURM_JOB_NODELIST")
	if job == "" {
		job = getenv("SLURM_NODELIST")
	}
	a, err1 := ExpandNodeList(step)
	b, err2 := ExpandNodeList(job)
	return err1 != nil || err2 != nil || !slices.Equal(a, b)
}

// slurmSlots is SlurmHosts' slots of n nodes.
func slurmSlots(getenv func(string) string, n, gpusPerRank int) ([]int, error) {
	perNode := func(name string, div int) ([]int, error) {
		counts, err := ParseSlurmCounts(getenv(name))
		if err != nil {
			return nil, fmt.Errorf("topology: slurm: %s: %w", name, err)
		}
		if len(counts) != n {
			return nil, fmt.Errorf("topology: slurm: %s: %w", name, errorf(ErrConflict, "%s names %d nodes, the node list %d", SlurmCountsString(counts), len(counts), n))
		}
		for i := range counts {
			counts[i] = max(counts[i]/div, 1)
		}
		return counts, nil
	}
	uniform := func(v, div int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = max(v/div, 1)
		}
		return out
	}
	number := func(name string) (int, bool, error) {
		s := getenv(name)
		if s == "" {
			return 0, false, nil
		}
		v, err := slurmNumber(s, maxSlots)
		if err != nil {
			return 0, false, fmt.Errorf("topology: slurm: %s: %w", name, errorf(ErrBadValue, "%v", err))
		}
		return v, true, nil
	}
	if (getenv("SLURM_NTASKS") != "" || getenv("SLURM_NPROCS") != "") && !inSlurmStep(getenv) {
		return perNode("SLURM_TASKS_PER_NODE", 1)
	}
	gpus, ok, err := number("SLURM_GPUS_ON_NODE")
	if v := getenv("SLURM_GPUS_ON_NODE"); v != "" && strings.Trim(v, "0") == "" {
		gpus, ok, err = 0, false, nil // SLURM_GPUS_ON_NODE=0: no GPUs
	}
	if err != nil {
		return nil, err
	}
	if ok {
		return uniform(gpus, max(gpusPerRank, 1)), nil
	}
	perTask, ok, err := number("SLURM_CPUS_PER_TASK")
	if err != nil {
		return nil, err
	}
	if !ok {
		perTask = 1
	}
	if getenv("SLURM_JOB_CPUS_PER_NODE") != "" {
		return perNode("SLURM_JOB_CPUS_PER_NODE", perTask)
	}
	cpus, ok, err := number("SLURM_CPUS_ON_NODE")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("topology: slurm: %w", errorf(ErrNoSlots, "none of SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE and SLURM_CPUS_ON_NODE is set"))
	}
	return uniform(cpus, perTask), nil
}
