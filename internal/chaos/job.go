package chaos

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/testcluster"
)

// Limits of one job.
const (
	// jobLimit bounds a job from start to exit; past it the launcher is
	// sent SIGQUIT (its goroutine dump) and then killed.
	jobLimit = 3 * time.Minute
	// outliveLimit is how long the launcher may outlive the last process
	// of its job (agents and ranks) before it counts as hung: its give-up
	// deadline (--kill-grace + --heartbeat-timeout: a host whose
	// processes all died is noticed by the missed heartbeats, its ranks
	// given the kill grace), and 4 s for its exit (the events file, the
	// registry entry) on this busy machine. The check sees a launcher
	// that does not exit; it cannot see a goroutine or descriptor the
	// launcher leaks while it still exits (launcher/run_test.go's
	// TestRunGoroutines checks that in-process).
	outliveLimit = killGrace + heartbeatTimeout + 4*time.Second
	// pollEvery is how often the events file and /proc are read while
	// waiting.
	pollEvery = 50 * time.Millisecond
)

// ErrJobEnded: the job ended before what was awaited happened.
var ErrJobEnded = errors.New("chaos: the job ended first")

// Job is one gorun run on the cluster.
type Job struct {
	Config Config
	Hosts  []string // the namespace hosts of the job, work hosts first
	Events string   // the --events file
	// Goroutines is the file gorun writes its goroutine dump to at its
	// exit (GORUN_DEBUG_GOROUTINES; see launcherGoroutines).
	Goroutines string
	// Flips is the file the job's agents write what they flipped to
	// (GORUN_DEBUG_FLIP_REPLICAS; see replflip.go).
	Flips   string
	CkptDir string   // --ckpt-dir, "" without
	Args    []string // gorun's command line, binary included

	cluster *testcluster.Hosts // the hosts' cluster: Hosts are its first ones
	cmd     *exec.Cmd
	stdout  *pipeOut
	stderr  *gortest.SyncBuffer
	start   time.Time
	done    chan struct{}
	code    int
	elapsed time.Duration
	// hung is set when the launcher outlived its job's processes by
	// outliveLimit or ran past jobLimit: it was sent SIGQUIT.
	hung string
	// killed: the harness SIGKILLed the launcher (Resume, CkptFlip).
	killed bool
	// lastSeen is when a process of the job was last seen in its hosts.
	lastSeen time.Time

	id string // the job id, once read
	// mpichBefore are the MPICH segment files in /dev/shm when the job
	// started (mpichFiles): not its own (see mpichLeaks).
	mpichBefore map[string]bool
}

// startJob starts gorun for c on the cluster's first c.Hosts+c.Spares
// hosts in dir (its hostfile, events file and durable directory), with
// registry as XDG_RUNTIME_DIR.
// With resume, it is the same job started again with --resume (the
// whole job died): the same hostfile and durable directory, a new events
// file. env is added to gorun's environment (GPUFault's fake GPUs).
func startJob(ctx context.Context, c Config, b Binaries, cluster *testcluster.Hosts, dir, registry string, resume bool, env ...string) (*Job, error) {
	hosts := cluster.Names[:c.Hosts+c.Spares]
	j := &Job{Config: c, Hosts: hosts, Events: filepath.Join(dir, "events.jsonl"), cluster: cluster,
		stderr: &gortest.SyncBuffer{}, done: make(chan struct{}), mpichBefore: mpichFiles(shmDir)}
	j.Goroutines = filepath.Join(dir, "goroutines.txt")
	j.Flips = filepath.Join(dir, "replica-flips.txt")
	if resume {
		j.Events = filepath.Join(dir, "events-resume.jsonl")
		j.Goroutines = filepath.Join(dir, "goroutines-resume.txt")
	}
	var hf strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&hf, "%s slots=%d\n", h, c.RanksPerHost)
	}
	hostfile := filepath.Join(dir, "hostfile")
	if err := os.WriteFile(hostfile, []byte(hf.String()), 0o644); err != nil {
		return nil, fmt.Errorf("chaos: writing the hostfile: %w", err)
	}
	if c.Durable {
		j.CkptDir = filepath.Join(dir, "ckpt")
		if err := os.Mkdir(j.CkptDir, 0o755); err != nil && !(resume && errors.Is(err, fs.ErrExist)) {
			return nil, fmt.Errorf("chaos: making the durable directory: %w", err)
		}
	}
	j.Args = append([]string{b.Gorun}, c.GorunFlags(hostfile, cluster.BridgeAddr, j.Events, j.CkptDir)...)
	if resume {
		j.Args = append(j.Args, "--resume")
	}
	j.Args = append(append(j.Args, "--"), c.Program(b)...)
	out, err := newPipeOut()
	if err != nil {
		return nil, err
	}
	j.stdout = out
	j.cmd = exec.Command(j.Args[0], j.Args[1:]...)
	j.cmd.Stdout, j.cmd.Stderr = out.w, j.stderr
	j.cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+registry, "GORUN_DEBUG_GOROUTINES="+j.Goroutines, flipEnv+"="+j.Flips)
	j.cmd.Env = append(j.cmd.Env, env...)
	j.start = time.Now()
	if err := j.cmd.Start(); err != nil {
		out.started()
		out.finish(0)
		return nil, fmt.Errorf("chaos: starting gorun: %w", err)
	}
	out.started()
	j.lastSeen = j.start
	go j.watch(ctx)
	return j, nil
}

// watch is the job's owner goroutine: it waits for gorun, and meanwhile
// checks that the launcher neither outlives its job's processes by
// outliveLimit nor runs past jobLimit (then SIGQUIT, and SIGKILL 5 s
// later).
func (j *Job) watch(ctx context.Context) {
	exited := make(chan error, 1)
	go func() { exited <- j.cmd.Wait() }()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var kill <-chan time.Time
	quit := func(why string) {
		if j.hung != "" {
			return
		}
		j.hung = why
		j.cmd.Process.Signal(syscall.SIGQUIT)
		kill = time.After(5 * time.Second)
	}
	for {
		select {
		case err := <-exited:
			j.elapsed = time.Since(j.start)
			j.stdout.finish(procGrace)
			j.code = j.cmd.ProcessState.ExitCode()
			var ee *exec.ExitError
			if errors.As(err, &ee) && j.code < 0 {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					j.code = 128 + int(ws.Signal())
				}
			}
			close(j.done)
			return
		case <-kill:
			j.cmd.Process.Kill()
		case <-ctx.Done():
			quit("the test ended first")
		case <-tick.C:
			if time.Since(j.start) > jobLimit {
				quit(fmt.Sprintf("gorun ran past %v", jobLimit))
				continue
			}
			n := 0
			procs, err := nsProcs(j.cluster, j.Hosts)
			for _, ps := range procs {
				n += len(ps)
			}
			if n > 0 || err != nil { // not known to be gone
				j.lastSeen = time.Now()
			} else if time.Since(j.lastSeen) > outliveLimit {
				quit(fmt.Sprintf("the launcher outlived every process of its job by %v", outliveLimit))
			}
		}
	}
}

// Wait waits for gorun to exit.
func (j *Job) Wait() { <-j.done }

// Exited reports whether gorun has exited.
func (j *Job) Exited() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// since is the time since the job started, in seconds (the events
// file's clock, near enough: gorun starts it at its start).
func (j *Job) since() float64 { return time.Since(j.start).Seconds() }

// records reads the events file so far (a last line cut short is left
// for the next read).
func (j *Job) records() []events.Record {
	f, err := os.Open(j.Events)
	if err != nil {
		return nil
	}
	defer f.Close()
	recs, _ := events.ReadAll(f)
	return recs
}

// ID is the job id, from the events file's launch record ("" before it).
func (j *Job) ID() string {
	if j.id != "" {
		return j.id
	}
	for _, r := range j.records() {
		if l, ok := r.Event.(events.Launch); ok {
			j.id = l.Job
		}
	}
	return j.id
}

// waitFor polls the events file until ok holds for its records, the job
// ends (ErrJobEnded) or limit passes.
func (j *Job) waitFor(limit time.Duration, what string, ok func([]events.Record) bool) error {
	deadline := time.Now().Add(limit)
	for {
		if ok(j.records()) {
			return nil
		}
		if j.Exited() {
			return fmt.Errorf("%w: waiting for %s", ErrJobEnded, what)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: no %s within %v", what, limit)
		}
		select {
		case <-j.done:
		case <-time.After(pollEvery):
		}
	}
}

// waitG waits until G, in a sample record, reaches step.
func (j *Job) waitG(step int) error {
	return j.waitFor(90*time.Second, "G >= "+strconv.Itoa(step), func(recs []events.Record) bool {
		for _, r := range recs {
			if s, ok := r.Event.(events.Sample); ok && s.G >= int64(step) {
				return true
			}
		}
		return false
	})
}

// waitStep waits until the job has committed step (G, for the workloads
// with protected state) or, for the MPICH workload, rank 0 has printed
// it.
func (j *Job) waitStep(step int) error {
	if j.Config.Workload != MPICH {
		return j.waitG(step)
	}
	line := fmt.Sprintf("\n[0] step %d\n", step)
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains("\n"+j.stdout.String(), line) {
		if j.Exited() {
			return fmt.Errorf("%w: waiting for rank 0's step %d", ErrJobEnded, step)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: no step %d of rank 0 within 90s", step)
		}
		select {
		case <-j.done:
		case <-time.After(pollEvery):
		}
	}
	return nil
}

// waitKind waits for n records of kind.
func (j *Job) waitKind(kind string, n int) error {
	return j.waitFor(90*time.Second, fmt.Sprintf("%d %s records", n, kind), func(recs []events.Record) bool {
		return countKind(recs, kind) >= n
	})
}

func countKind(recs []events.Record, kind string) int {
	n := 0
	for _, r := range recs {
		if r.Event.Kind() == kind {
			n++
		}
	}
	return n
}

// hostProcs returns the processes in the job's host i.
func (j *Job) hostProcs(i int) ([]proc, error) {
	ps, err := nsProcs(j.cluster, j.Hosts[i:i+1])
	return ps[j.Hosts[i]], err
}

// rankProc finds rank's trainer process in the job's hosts.
func (j *Job) rankProc(rank int) (proc, error) {
	id := j.ID()
	procs, err := nsProcs(j.cluster, j.Hosts)
	if err != nil {
		return proc{}, err
	}
	for _, ps := range procs {
		for _, p := range ps {
			if p.isTrainer(j.Config.Workload) && p.hasEnv("GORUN_JOB_ID="+id) && p.hasEnv("GORUN_RANK="+strconv.Itoa(rank)) {
				return p, nil
			}
		}
	}
	return proc{}, fmt.Errorf("chaos: no trainer process of rank %d of job %s", rank, id)
}
