package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/events"
)

// Limits of one job.
const (
	// jobLimit bounds a job from start to exit; past it the launcher is
	// sent SIGQUIT (its goroutine dump) and then killed.
	jobLimit = 3 * time.Minute
	// outliveLimit is how long the launcher may outlive the last process
	// of its job (agents and ranks) before it counts as hung.
	outliveLimit = 30 * time.Second
	// pollEvery is how often the events file and /proc are read while
	// waiting.
	pollEvery = 50 * time.Millisecond
)

// ErrJobEnded: the job ended before what was awaited happened.
var ErrJobEnded = errors.New("chaos: the job ended first")

// stallWriter is gorun's standard output: a buffer whose Write blocks
// while the output is stalled, as a paused pager's pipe does.
type stallWriter struct {
	mu   sync.Mutex // guards the fields below
	buf  bytes.Buffer
	gate chan struct{} // non-nil while stalled; closed to release
}

func (w *stallWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	g := w.gate
	w.mu.Unlock()
	if g != nil {
		<-g
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// stall blocks writers until release is called.
func (w *stallWriter) stall() (release func()) {
	g := make(chan struct{})
	w.mu.Lock()
	w.gate = g
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.gate = nil
		w.mu.Unlock()
		close(g)
	}
}

func (w *stallWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Job is one gorun run on the cluster.
type Job struct {
	Config  Config
	Hosts   []string // the namespace hosts of the job, work hosts first
	Events  string   // the --events file
	CkptDir string   // --ckpt-dir, "" without
	Args    []string // gorun's command line, binary included

	cmd     *exec.Cmd
	stdout  *stallWriter
	stderr  *lockedBuffer
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
}

// startJob starts gorun for c on hosts in dir (its hostfile, events
// file and durable directory), with registry as XDG_RUNTIME_DIR.
// With resume, it is the same job started again with --resume (the
// whole job died): the same hostfile and durable directory, a new events
// file.
func startJob(ctx context.Context, c Config, b Binaries, hosts []string, bind, dir, registry string, resume bool) (*Job, error) {
	j := &Job{Config: c, Hosts: hosts, Events: filepath.Join(dir, "events.jsonl"),
		stdout: &stallWriter{}, stderr: &lockedBuffer{}, done: make(chan struct{})}
	if resume {
		j.Events = filepath.Join(dir, "events-resume.jsonl")
	}
	var hf strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&hf, "%s slots=%d\n", h, c.RanksPerHost)
	}
	hostfile := filepath.Join(dir, "hostfile")
	if err := os.WriteFile(hostfile, []byte(hf.String()), 0o644); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	if c.Durable {
		j.CkptDir = filepath.Join(dir, "ckpt")
		if err := os.Mkdir(j.CkptDir, 0o755); err != nil && !(resume && errors.Is(err, fs.ErrExist)) {
			return nil, fmt.Errorf("chaos: %w", err)
		}
	}
	j.Args = append([]string{b.Gorun}, c.GorunFlags(hostfile, bind, j.Events, j.CkptDir)...)
	if resume {
		j.Args = append(j.Args, "--resume")
	}
	j.Args = append(append(j.Args, "--"), c.Program(b)...)
	j.cmd = exec.Command(j.Args[0], j.Args[1:]...)
	j.cmd.Stdout, j.cmd.Stderr = j.stdout, j.stderr
	j.cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+registry)
	j.start = time.Now()
	if err := j.cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: starting gorun: %w", err)
	}
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
			for _, ps := range nsProcs(j.Hosts) {
				n += len(ps)
			}
			if n > 0 {
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
func (j *Job) hostProcs(i int) []proc { return nsProcs(j.Hosts[i : i+1])[j.Hosts[i]] }

// rankProc finds rank's trainer process in the job's hosts.
func (j *Job) rankProc(rank int) (proc, error) {
	id := j.ID()
	for _, ps := range nsProcs(j.Hosts) {
		for _, p := range ps {
			if p.isTrainer(j.Config.Workload) && p.hasEnv("GORUN_JOB_ID="+id) && p.hasEnv("GORUN_RANK="+strconv.Itoa(rank)) {
				return p, nil
			}
		}
	}
	return proc{}, fmt.Errorf("chaos: no trainer process of rank %d of job %s", rank, id)
}
