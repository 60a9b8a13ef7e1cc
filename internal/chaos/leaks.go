package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// Grace periods of the leak check: what a job's processes and files may
// take to go after gorun exited (an agent cut off by a partition notices
// the lost control connection and kills its ranks; SIGKILLed processes
// take a moment to be reaped).
const (
	procGrace = 15 * time.Second
	fileGrace = 5 * time.Second
)

// KnownAgentDirLeak names the leftover counted apart: the job directory
// of a host whose agent was SIGKILLed (another helper's fix sweeps them;
// until it merges they are known, not zero).
const KnownAgentDirLeak = "known leak: agent job dir"

// checkLeaks looks for what job j left behind once gorun exited: processes
// in its hosts, its /dev/shm and /tmp entries, its registry entry. It
// removes what it finds (so that the next run starts clean) and returns
// the leaks, and apart the known ones (the crashed hosts' job
// directories, crashed).
func checkLeaks(j *Job, hosts *testcluster.Hosts, index func(int) int, registry string, crashed []string) (leaks, known []string) {
	// Processes: poll until none is left or the grace period ends.
	var left map[string][]proc
	for deadline := time.Now().Add(procGrace); ; {
		left = nsProcs(j.Hosts)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(pollEvery) // polling /proc to a deadline: nothing to wait on
	}
	for i, name := range j.Hosts {
		ps := left[name]
		if len(ps) == 0 {
			continue
		}
		leaks = append(leaks, fmt.Sprintf("%d processes left in host %s more than %v after gorun exited: %v", len(ps), name, procGrace, ps))
		if err := hosts.KillAll(index(i)); err != nil {
			leaks = append(leaks, fmt.Sprintf("killing them: %v", err))
		}
	}
	id := j.ID()
	if id == "" {
		if j.code == 2 {
			return leaks, known // refused before it had a job id: nothing to leave
		}
		return append(leaks, "no job id in the events file: its files could not be checked"), known
	}
	var files []string
	for deadline := time.Now().Add(fileGrace); ; {
		files = jobFiles(id, registry)
		if len(files) == len(intersect(files, crashed)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(pollEvery)
	}
	for _, f := range files {
		if slices.Contains(crashed, f) {
			known = append(known, KnownAgentDirLeak+": "+f)
		} else {
			leaks = append(leaks, "left behind: "+f)
		}
		os.RemoveAll(f)
	}
	return leaks, known
}

// jobFiles lists job id's files: slot files and Open MPI directories in
// /dev/shm, job directories in the temporary directory, its registry
// entry.
func jobFiles(id, registry string) []string {
	var out []string
	for _, pat := range []string{
		filepath.Join("/dev/shm", "gorun-"+id+".*"),
		filepath.Join("/dev/shm", "gorun-"+id+"-*"),
		filepath.Join(os.TempDir(), "gorun-"+id+"-*"),
		filepath.Join(registry, "gorun", id+".json"),
	} {
		m, _ := filepath.Glob(pat)
		out = append(out, m...)
	}
	return out
}

func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
