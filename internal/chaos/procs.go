package chaos

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// proc is a process found in /proc.
type proc struct {
	pid  int
	argv []string
	env  []byte
}

func (p proc) String() string { return fmt.Sprintf("pid %d %q", p.pid, p.argv) }

// nsInode returns the inode of the named network namespace
// (/run/netns/NAME), 0 if it is missing.
func nsInode(name string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/run/netns", name), &st); err != nil {
		return 0
	}
	return st.Ino
}

// nsProcs returns the processes in each of the named network namespaces,
// by name, from one scan of /proc (a process's /proc/PID/ns/net is its
// namespace's inode). Processes that end meanwhile are skipped.
func nsProcs(names []string) map[string][]proc {
	byIno := map[uint64]string{}
	for _, n := range names {
		if ino := nsInode(n); ino != 0 {
			byIno[ino] = n
		}
	}
	out := map[string][]proc{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns/net"), &st) != nil {
			continue
		}
		name, ok := byIno[st.Ino]
		if !ok {
			continue
		}
		p, ok := readProc(pid)
		if !ok {
			continue
		}
		out[name] = append(out[name], p)
	}
	return out
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
