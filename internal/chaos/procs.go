package chaos

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/gorun/gorun/internal/testcluster"
)

// proc is a process found in /proc.
type proc struct {
	pid  int
	argv []string
	env  []byte
}

func (p proc) String() string { return fmt.Sprintf("pid %d %q", p.pid, p.argv) }

// nsProcs returns the processes in each of the named hosts of the
// cluster, by name (testcluster's Pids; processes that end meanwhile are
// skipped).
func nsProcs(cluster *testcluster.Hosts, names []string) (map[string][]proc, error) {
	out := map[string][]proc{}
	for _, name := range names {
		i := slices.Index(cluster.Names, name)
		if i < 0 {
			return out, fmt.Errorf("chaos: host %s is not the cluster's", name)
		}
		pids, err := cluster.Pids(i)
		if err != nil {
			return out, fmt.Errorf("chaos: the processes of host %s: %w", name, err)
		}
		for _, pid := range pids {
			if p, ok := readProc(pid); ok {
				out[name] = append(out[name], p)
			}
		}
	}
	return out, nil
}

// readProc reads pid's command line and environment; false when it is
// gone, or a zombie (no command line).
func readProc(pid int) (proc, bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil || len(cmd) == 0 {
		return proc{}, false
	}
	env, _ := os.ReadFile(filepath.Join(dir, "environ"))
	var argv []string
	for _, a := range bytes.Split(bytes.TrimSuffix(cmd, []byte{0}), []byte{0}) {
		argv = append(argv, string(a))
	}
	return proc{pid: pid, argv: argv, env: env}, true
}

// hasEnv reports whether p's environment holds exactly kv ("K=V").
func (p proc) hasEnv(kv string) bool {
	return bytes.HasPrefix(p.env, []byte(kv+"\x00")) || bytes.Contains(p.env, []byte("\x00"+kv+"\x00"))
}

// isAgent reports whether p is a gorun agent.
func (p proc) isAgent() bool {
	return len(p.argv) >= 2 && filepath.Base(p.argv[0]) == "gorun" && p.argv[1] == "agent"
}

// isTrainer reports whether p is the workload's trainer process (not the
// agent, nor a shell).
func (p proc) isTrainer(workload string) bool {
	if len(p.argv) == 0 {
		return false
	}
	switch workload {
	case Pytrain:
		return len(p.argv) >= 2 && filepath.Base(p.argv[1]) == "pytrain.py"
	case MPICH:
		return filepath.Base(p.argv[0]) == "mpisteps"
	default:
		return filepath.Base(p.argv[0]) == "dptrain"
	}
}
