package topology

import (
	"errors"
	"slices"
	"testing"
)

func TestParseSlurmCounts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		err  error
	}{
		{"4", []int{4}, nil},
		{"2(x3)", []int{2, 2, 2}, nil},
		{"40,8", []int{40, 8}, nil},
		{"2(x3),1", []int{2, 2, 2, 1}, nil},
		{"1,2(x2),1", []int{1, 2, 2, 1}, nil},
		{"", nil, ErrBadValue},
		{"0", nil, ErrBadValue},
		{"2(x0)", nil, ErrBadValue},
		{"2(x3", nil, ErrBadValue},
		{"2(3)", nil, ErrBadValue},
		{"-1", nil, ErrBadValue},
		{"2,,3", nil, ErrBadValue},
		{"1048577", nil, ErrBadValue},
		{"1(x1000000),1", nil, ErrTooLarge},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSlurmCounts(tc.in)
			if !errors.Is(err, tc.err) || tc.err == nil && err != nil {
				t.Fatalf("ParseSlurmCounts(%q) error %v, want %v", tc.in, err, tc.err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ParseSlurmCounts(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestSlurmHosts(t *testing.T) {
	for _, tc := range []struct {
		name        string
		env         map[string]string
		gpusPerRank int
		names       []string
		slots       []int
		err         error
	}{
		{"uniform cpus", map[string]string{"SLURM_JOB_NODELIST": "gr[0-2]", "SLURM_JOB_CPUS_PER_NODE": "2(x3)", "SLURM_TASKS_PER_NODE": "1(x3)"},
			0, []string{"gr0", "gr1", "gr2"}, []int{2, 2, 2}, nil},
		{"tasks asked", map[string]string{"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "48", "SLURM_TASKS_PER_NODE": "40,8", "SLURM_JOB_CPUS_PER_NODE": "64(x2)"},
			0, []string{"n1", "n2"}, []int{40, 8}, nil},
		{"nprocs asked", map[string]string{"SLURM_JOB_NODELIST": "a,b,c,d", "SLURM_NPROCS": "7", "SLURM_TASKS_PER_NODE": "2(x3),1"},
			0, []string{"a", "b", "c", "d"}, []int{2, 2, 2, 1}, nil},
		{"cpus per task", map[string]string{"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "16,3", "SLURM_CPUS_PER_TASK": "4"},
			0, []string{"n1", "n2"}, []int{4, 1}, nil},
		{"cpus on node", map[string]string{"SLURM_NODELIST": "rack[1-2]-node[01-02]", "SLURM_CPUS_ON_NODE": "8"},
			0, []string{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}, []int{8, 8, 8, 8}, nil},
		{"gpus", map[string]string{"SLURM_JOB_NODELIST": "g[1-2]", "SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_CPUS_PER_NODE": "64(x2)"},
			2, []string{"g1", "g2"}, []int{4, 4}, nil},
		// Inside a step (srun --pty bash in salloc -N3 --exclusive; Slurm
		// 22.05's variables): the task counts are the step's, not the job's.
		{"in a step", map[string]string{"SLURM_JOB_NODELIST": "h[0-2]", "SLURM_NODELIST": "h[0-2]", "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "h0",
			"SLURM_NTASKS": "1", "SLURM_NPROCS": "1", "SLURM_TASKS_PER_NODE": "1", "SLURM_JOB_CPUS_PER_NODE": "2(x3)", "SLURM_CPUS_ON_NODE": "2"},
			0, []string{"h0", "h1", "h2"}, []int{2, 2, 2}, nil},
		{"in a step of a job with tasks", map[string]string{"SLURM_JOB_NODELIST": "h[0-2]", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "h[0-1]",
			"SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_CPUS_PER_NODE": "2(x3)"},
			0, []string{"h0", "h1", "h2"}, []int{2, 2, 2}, nil},
		{"step on every node", map[string]string{"SLURM_JOB_NODELIST": "h[0-1]", "SLURM_STEP_ID": "1", "SLURM_STEP_NODELIST": "h[0-1]",
			"SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_CPUS_PER_NODE": "4(x2)", "SLURM_CPUS_PER_TASK": "2"},
			0, []string{"h0", "h1"}, []int{2, 2}, nil},
		{"step on fewer nodes, Slurm's own id", map[string]string{"SLURM_JOB_NODELIST": "h[0-1]", "SLURM_STEP_ID": "4294967290", "SLURM_STEP_NODELIST": "h0",
			"SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"},
			0, []string{"h0", "h1"}, []int{4, 4}, nil},
		// The batch step (sbatch's script) has no SLURM_STEP_ID in 22.05;
		// Slurm's own step ids (batch, extern, ...) are not a user's step.
		{"batch step id", map[string]string{"SLURM_JOB_NODELIST": "h[0-1]", "SLURM_STEP_ID": "4294967291", "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "2,1", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"},
			0, []string{"h0", "h1"}, []int{2, 1}, nil},
		// salloc -N1 : -N2 (Slurm 22.05): only the components' variables.
		{"heterogeneous job", map[string]string{"SLURM_JOB_ID": "14", "SLURM_HET_SIZE": "2", "SLURM_JOB_NODELIST_HET_GROUP_0": "h0",
			"SLURM_JOB_NODELIST_HET_GROUP_1": "h[1-2]", "SLURM_JOB_CPUS_PER_NODE_HET_GROUP_0": "1", "SLURM_JOB_CPUS_PER_NODE_HET_GROUP_1": "1(x2)"},
			0, nil, nil, errors.ErrUnsupported},
		{"zero gpus", map[string]string{"SLURM_JOB_NODELIST": "g[1-2]", "SLURM_GPUS_ON_NODE": "0", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"},
			0, []string{"g1", "g2"}, []int{8, 8}, nil},
		{"bad gpus", map[string]string{"SLURM_JOB_NODELIST": "g1", "SLURM_GPUS_ON_NODE": "00x", "SLURM_JOB_CPUS_PER_NODE": "8"}, 0, nil, nil, ErrBadValue},
		{"no node list", map[string]string{"SLURM_CPUS_ON_NODE": "8"}, 0, nil, nil, ErrNoHosts},
		{"bad node list", map[string]string{"SLURM_JOB_NODELIST": "n[2-1]", "SLURM_CPUS_ON_NODE": "8"}, 0, nil, nil, ErrBadNodeList},
		{"no slots", map[string]string{"SLURM_JOB_NODELIST": "n1"}, 0, nil, nil, ErrNoSlots},
		{"count mismatch", map[string]string{"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_CPUS_PER_NODE": "2(x2)"}, 0, nil, nil, ErrConflict},
		{"tasks mismatch", map[string]string{"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "1(x4)"}, 0, nil, nil, ErrConflict},
		{"bad cpus per task", map[string]string{"SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "x"}, 0, nil, nil, ErrBadValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts, err := SlurmHosts(func(k string) string { return tc.env[k] }, tc.gpusPerRank)
			if !errors.Is(err, tc.err) || tc.err == nil && err != nil {
				t.Fatalf("SlurmHosts error %v, want %v", err, tc.err)
			}
			var names []string
			var slots []int
			for _, h := range hosts {
				if h.Source != "slurm" {
					t.Errorf("host %s: source %q", h.Name, h.Source)
				}
				names, slots = append(names, h.Name), append(slots, h.Slots)
			}
			if !slices.Equal(names, tc.names) || !slices.Equal(slots, tc.slots) {
				t.Errorf("SlurmHosts = %v %v, want %v %v", names, slots, tc.names, tc.slots)
			}
		})
	}
}
