package chaos

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/gordump"
	"github.com/gorun/gorun/internal/jobstatus"
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

// A job's leftovers are leaks, with two exceptions where nobody of the
// job is left to remove them and README's Leftovers gives them to gorun
// clean: every agent of the job was SIGKILLed (Resume and CkptFlip's
// killed job; every host of a job lost), which leaves everything; every
// host with ranks was SIGKILLed while spares lived on, which leaves the
// slot files (the spares never claimed them; an ending agent sweeps its
// own job's job and Open MPI directories, not slot files) unless a
// spare took ranks (its agent then claims them). There the
// built gorun clean is run: what it removes of the job must be among
// those leftovers (what it removes of other, ended jobs is logged), and
// the run has no leak only if nothing of the job is left afterwards.

// leakCheck is what checkLeaks needs besides the job.
type leakCheck struct {
	hosts    *testcluster.Hosts
	registry string // the jobs' XDG_RUNTIME_DIR
	gorun    string // the built gorun, for gorun clean
	log      *slog.Logger
	// crashed are the job's hosts (indices into j.Hosts) whose agent was
	// SIGKILLed.
	crashed []int
}

// checkLeaks looks for what job j left behind once gorun exited: processes
// in its hosts, its /dev/shm and /tmp entries, its registry entry, the
// MPICH segment files its ranks left (mpichLeaks, judged before gorun
// clean runs: that it removes them too must not hide a broken agent end
// sweep). It removes what it finds (so that the next run starts clean)
// and returns the leaks and what gorun clean removed of the job (see
// above).
func checkLeaks(j *Job, lc leakCheck) (leaks, cleaned []string) {
	leaks = append(launcherGoroutines(j), procLeaks(j, lc)...)
	everyAgent, withRanks := orphaned(j.Hosts, j.Config.Hosts, lc.crashed, j.records())
	mleaks, mpichLeft := mpichLeaks(j, shmDir, everyAgent)
	leaks = append(leaks, mleaks...)
	fleaks, cleaned := checkJobLeaks(j, lc, everyAgent, withRanks, mpichLeft)
	return append(leaks, fleaks...), cleaned
}

// mpichFiles returns the names of the MPICH segment files in dir, a
// /dev/shm (agent.MPICHShmName), in use or not.
func mpichFiles(dir string) map[string]bool {
	ents, _ := os.ReadDir(dir)
	out := map[string]bool{}
	for _, e := range ents {
		if agent.MPICHShmName(e.Name()) {
			out[e.Name()] = true
		}
	}
	return out
}

// mpichLeaks looks for the MPICH segment files (a rank killed in
// MPI_Init leaves one: internal/agent/mpichshm.go) that appeared in dir,
// /dev/shm, while job j ran (only those not in j.mpichBefore are judged:
// the suite's jobs run one at a time, so a new one is this job's, or
// another program's on the machine) and that no process uses, as the
// agents' sweep judges them, once its grace period is over. Any agent of
// the job that ended normally sweeps them (at its end, whatever job made
// them): left, they are leaks, removed here. When every agent of the job
// was SIGKILLed (toClean), nobody was left to: they are returned as
// left, gorun clean's to remove.
func mpichLeaks(j *Job, dir string, toClean bool) (leaks, left []string) {
	notBefore := func(n string) bool { return !j.mpichBefore[n] }
	for deadline := time.Now().Add(fileGrace); ; {
		var err error
		left, err = agent.UnusedMPICHFiles(dir, notBefore)
		if err != nil {
			return []string{"judging the MPICH shared-memory files in " + dir + ": " + err.Error()}, nil
		}
		// toClean: no agent is left whose end sweep could still come.
		if len(left) == 0 || toClean || time.Now().After(deadline) {
			break
		}
		time.Sleep(pollEvery) // polling /dev/shm to a deadline: nothing to wait on
	}
	for i, n := range left {
		left[i] = filepath.Join(dir, n)
	}
	if toClean {
		return nil, left
	}
	for _, p := range left {
		leaks = append(leaks, "left behind, used by no process: "+p)
		os.Remove(p)
	}
	return leaks, nil
}

// shmDir is the machine's /dev/shm, which the namespace hosts share.
const shmDir = "/dev/shm"

// procLeaks returns the processes left in job j's hosts once the grace
// period is over, as leaks, and kills them.
func procLeaks(j *Job, lc leakCheck) (leaks []string) {
	// Processes: poll until none is left or the grace period ends.
	var left map[string][]proc
	for deadline := time.Now().Add(procGrace); ; {
		var err error
		left, err = nsProcs(lc.hosts, j.Hosts)
		if err != nil {
			leaks = append(leaks, "looking for processes left: "+err.Error())
		}
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
		if err := lc.hosts.KillAll(i); err != nil {
			leaks = append(leaks, fmt.Sprintf("killing the processes left in host %s: %v", name, err))
		}
	}
	return leaks
}

// checkJobLeaks is checkLeaks for the job's files, once its processes
// are gone: everyAgent and withRanks are orphaned's, mpichLeft the MPICH
// files left for gorun clean (mpichLeaks).
func checkJobLeaks(j *Job, lc leakCheck, everyAgent, withRanks bool, mpichLeft []string) (leaks, cleaned []string) {
	id := j.ID()
	if id == "" {
		for _, p := range mpichLeft { // no gorun clean to run
			leaks = append(leaks, "left behind, used by no process: "+p)
			os.Remove(p)
		}
		if j.code == 2 {
			return leaks, nil // refused before it had a job id: nothing to leave
		}
		return append(leaks, "no job id in the events file: its files could not be checked"), nil
	}
	slotPrefix := filepath.Join("/dev/shm", "gorun-"+id+".")
	registryEntry := filepath.Join(lc.registry, "gorun", id+".json")
	// cleanable says whether leftover f is gorun clean's to remove.
	cleanable := func(f string) bool {
		return f != registryEntry && (everyAgent || withRanks && strings.HasPrefix(f, slotPrefix))
	}
	if j.killed {
		// A launcher that died by SIGKILL cannot remove its registry
		// entry: "the entry of a launcher that died without (SIGKILL) ...
		// is removed by the next List" (internal/jobstatus/registry.go).
		// That List is what is checked here.
		if _, err := jobstatus.List(filepath.Join(lc.registry, "gorun")); err != nil {
			leaks = append(leaks, fmt.Sprintf("listing the registry: %v", err))
		}
	}
	var files []string
	for deadline := time.Now().Add(fileGrace); ; {
		files = jobFiles(id, lc.registry)
		if !slices.ContainsFunc(files, func(f string) bool { return !cleanable(f) }) || time.Now().After(deadline) {
			break
		}
		time.Sleep(pollEvery)
	}
	var toClean []string
	for _, f := range files {
		if cleanable(f) {
			toClean = append(toClean, f)
			continue
		}
		leaks = append(leaks, "left behind: "+f)
		os.RemoveAll(f)
	}
	if len(toClean) == 0 && len(mpichLeft) == 0 {
		return leaks, nil
	}
	cleaned, others, err := gorunClean(lc.gorun, id)
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	mpichOurs, mleaks, others := cleanedMPICH(others, mpichLeft, j.mpichBefore)
	leaks = append(leaks, mleaks...)
	for _, p := range mpichLeft {
		if _, err := os.Lstat(p); err == nil {
			leaks = append(leaks, "left after gorun clean: "+p)
			os.Remove(p)
		}
	}
	if len(others) > 0 {
		lc.log.Warn("gorun clean also removed other ended jobs' leftovers", "job", id, "removed", others)
	}
	for _, f := range jobFiles(id, lc.registry) {
		if f == registryEntry {
			continue // looked at above
		}
		leaks = append(leaks, "left after gorun clean: "+f)
		os.RemoveAll(f)
	}
	// What gorun clean removed of the job is what was left of it: every
	// directory it names is one found. (A leftover it does not name may
	// have been swept meanwhile by another agent's start on this shared
	// machine: that nothing of the job is left is checked above.)
	for _, c := range cleaned {
		if strings.Contains(c, "protected state of job ") {
			if !slices.ContainsFunc(toClean, func(f string) bool { return strings.HasPrefix(f, slotPrefix) }) {
				leaks = append(leaks, "gorun clean removed slot files of the job that were not left: "+c)
			}
			continue
		}
		if !slices.ContainsFunc(toClean, func(f string) bool { return strings.HasSuffix(c, " "+f) }) {
			leaks = append(leaks, "gorun clean removed what was not a leftover of the job: "+c)
		}
	}
	return leaks, append(cleaned, mpichOurs...)
}

// cleanedMPICH sorts gorun clean's lines about MPICH files among others
// (the lines not about the job's gorun-<id> files): one naming a file
// left for it (left, paths) is the job's (ours); one naming a file there before
// the job (before, names) stays in others (another program's); any
// other is a leak: a file of the job's ranks that the agents' end sweep
// should have removed (mpichLeaks judged the files before gorun clean
// ran, so only one it did not see yet, or that a broken sweep keeps,
// gets here).
func cleanedMPICH(lines, left []string, before map[string]bool) (ours, leaks, others []string) {
	const what = "MPICH shared-memory file "
	for _, l := range lines {
		_, p, ok := strings.Cut(l, what)
		switch {
		case !ok, before[filepath.Base(p)]:
			others = append(others, l)
		case slices.Contains(left, p):
			ours = append(ours, l)
		default:
			leaks = append(leaks, "removed by gorun clean, not by the agents' sweep: "+p)
		}
	}
	return ours, leaks, others
}

// launcherGoroutines returns the goroutines of gorun's that job j's
// launcher left running at its exit, each with its stack: those of its
// goroutine dump (j.Goroutines, written by gorun under
// GORUN_DEBUG_GOROUTINES once the job and everything it owns is closed)
// that gordump.Leftover names. A launcher the harness SIGKILLed
// (j.killed) or sent SIGQUIT (j.hung) writes none; every other must.
func launcherGoroutines(j *Job) []string {
	dump, err := os.ReadFile(j.Goroutines)
	if err != nil {
		if j.killed || j.hung != "" {
			return nil
		}
		return []string{fmt.Sprintf("the launcher (exit %d) wrote no goroutine dump: %v", j.code, err)}
	}
	left, err := gordump.Leftover(dump)
	if err != nil {
		return []string{fmt.Sprintf("the launcher's goroutine dump %s: %v", j.Goroutines, err)}
	}
	var out []string
	for _, g := range left {
		out = append(out, "a goroutine of the launcher's left at its exit:\n"+g.Stack)
	}
	return out
}

// orphaned says which of a job's leftovers nobody of the job is left to
// remove: everything when every agent of its hosts was SIGKILLed (the
// indices crashed); the slot files when every host with ranks (the first
// workHosts) was, and no live host took ranks from them (no splice
// record, recs, to a host whose agent lived: that agent claims the job,
// and its release must remove the slot files).
func orphaned(hosts []string, workHosts int, crashed []int, recs []events.Record) (everyAgent, slots bool) {
	everyAgent, slots = true, true
	for h := range hosts {
		killed := slices.Contains(crashed, h)
		everyAgent = everyAgent && killed
		slots = slots && (killed || h >= workHosts)
	}
	for _, rec := range recs {
		if e, ok := rec.Event.(events.Splice); ok {
			if h := slices.Index(hosts, e.With); h >= 0 && !slices.Contains(crashed, h) {
				slots = false
			}
		}
	}
	return everyAgent, slots
}

// gorunClean runs the built gorun clean on this host (the namespace hosts
// share its /tmp and /dev/shm) and returns the lines of what it removed
// of job id, and apart those of other jobs.
func gorunClean(gorun, id string) (ours, others []string, err error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(gorun, "clean")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, nil, fmt.Errorf("gorun clean: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		switch {
		case l == "":
		case strings.Contains(l, "gorun-"+id+"-") || strings.Contains(l, "gorun-"+id+".") || strings.Contains(l, "protected state of job "+id+" "):
			ours = append(ours, l)
		default:
			others = append(others, l)
		}
	}
	return ours, others, nil
}

// jobFiles lists job id's files: slot files (gorun-<id>.*), socket
// directories (gorun-<id>-<n>.sock) and Open MPI directories
// (gorun-<id>-h<host>-g<gen>) in /dev/shm, job directories in the
// temporary directory, its registry entry.
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
