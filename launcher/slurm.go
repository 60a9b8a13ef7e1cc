package launcher

// Agents under Slurm (--launcher slurm): one srun starts the agent of
// every remote host as one task per node of a step that overlaps the
// job's others. srun broadcasts one stdin to every task, so credentials
// cannot be written to one host's stdin: each agent prints an ephemeral
// public key on its stdout (srun's --label prefixes the line with the
// task's id, which srun sets, not the agent), the launcher seals the
// credentials of that task's host to it (jobkey.SealHostCredentials) and
// writes "INDEX SEALED" on the shared stdin, which then stays open as every
// agent's launcher-alive stream. Which task is which host is Slurm's
// doing, not the agents': the step's arbitrary distribution puts task i on
// the i-th node of its --nodelist, and a key line claiming another node
// than its task's is refused. An agent opens only its own line.

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/jobkey"
)

// Lines an agent started by srun prints on its stdout.
const (
	// SlurmKeyLine starts "gorun-agent-key NODE PUBKEY STEP": the agent
	// on Slurm node NODE (SLURMD_NODENAME) takes its credentials sealed to
	// PUBKEY (X25519, base64), if NODE is its srun task's node; STEP is
	// its step, JOBID.STEPID.
	SlurmKeyLine = "gorun-agent-key"
	// SlurmDoneLine starts "gorun-agent-done CODE", the agent's last line:
	// it has stopped its ranks, removed the job's files and exits with CODE.
	SlurmDoneLine = "gorun-agent-done"
)

// srunProbeTimeout bounds srun --version and srun --help.
const srunProbeTimeout = 15 * time.Second

// srunMin is the oldest Slurm whose srun has --overlap (20.11).
var srunMin = [2]int{20, 11}

// srunOptions are the options of the srun gorun starts agents with.
type srunOptions struct {
	path    string
	version string
	// has are the long options its --help lists (without "--").
	has map[string]bool
}

var (
	srunVersionRE = regexp.MustCompile(`(\d+)\.(\d+)`)
	srunOptionRE  = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
)

// probeSrun finds srun and asks it, once, its version and options. A
// Slurm without --overlap (before 20.11) is a ConfigError.
func probeSrun(ctx context.Context) (*srunOptions, error) {
	path, err := exec.LookPath("srun")
	if err != nil {
		return nil, &ConfigError{Msg: "--launcher slurm: srun is not on PATH", Err: err}
	}
	run := func(arg string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, srunProbeTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, path, arg).CombinedOutput()
		if err != nil {
			return "", &ConfigError{Msg: fmt.Sprintf("--launcher slurm: %s %s: %v: %s", path, arg, err, strings.TrimSpace(string(out))), Err: err}
		}
		return string(out), nil
	}
	version, err := run("--version")
	if err != nil {
		return nil, err
	}
	help, err := run("--help")
	if err != nil {
		return nil, err
	}
	return parseSrunProbe(path, version, help)
}

// parseSrunProbe reads srun --version's and --help's output.
func parseSrunProbe(path, version, help string) (*srunOptions, error) {
	o := &srunOptions{path: path, version: strings.TrimSpace(version), has: map[string]bool{}}
	for _, m := range srunOptionRE.FindAllStringSubmatch(help, -1) {
		o.has[m[1]] = true
	}
	v := srunVersionRE.FindStringSubmatch(version)
	if v == nil {
		return nil, &ConfigError{Msg: fmt.Sprintf("--launcher slurm: cannot read the Slurm version from %q", o.version)}
	}
	major, _ := strconv.Atoi(v[1])
	minor, _ := strconv.Atoi(v[2])
	if major < srunMin[0] || major == srunMin[0] && minor < srunMin[1] || !o.has["overlap"] {
		return nil, &ConfigError{Msg: fmt.Sprintf("--launcher slurm: %s is too old: gorun needs srun --overlap (Slurm %d.%d or newer); use --launcher ssh", o.version, srunMin[0], srunMin[1])}
	}
	return o, nil
}

// srunArgs is the srun command line that starts the agents of hosts (their
// Slurm node names), each with agent's arguments.
func (o *srunOptions) args(job string, nodes []string, agent []string) []string {
	n := strconv.Itoa(len(nodes))
	// The arbitrary distribution places task i on nodes[i] (Slurm 22.05:
	// the --nodelist order, ahead of any SLURM_HOSTFILE, which startSrun
	// removes from srun's environment anyway); srunKey relies on it.
	args := []string{"--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1", "--nodelist=" + strings.Join(nodes, ","), "--distribution=arbitrary"}
	// What keeps the step, and the job, alive when a node dies, and the
	// agents unbound and free of Slurm's MPI plugins; the ones this srun
	// does not know are left out.
	for _, opt := range []string{"overlap", "no-kill", "kill-on-bad-exit=0", "wait=0", "cpu-bind=none", "mpi=none", "input=all", "label"} {
		if name, _, _ := strings.Cut(opt, "="); o.has[name] {
			args = append(args, "--"+opt)
		}
	}
	args = append(args, "--job-name=gorun-"+job)
	return append(args, agent...)
}

// srunStep is the step that runs every remote agent: its stdin, shared,
// and which task is which host. Its fields below mu are guarded by mu.
type srunStep struct {
	opts   *srunOptions
	hosts  []*hostAgent  // the remote hosts, in job order
	exited chan struct{} // closed once srun has exited and been waited for

	mu      sync.Mutex
	stdin   io.WriteCloser
	proc    *exec.Cmd
	byTask  map[int]*hostAgent
	step    string       // JOBID.STEPID, once an agent told it
	gone    map[int]bool // hosts whose end was reported (done line, or given up)
	open    int          // host streams not closed yet
	stopped bool         // stop has begun
	quiet   bool         // srun was interrupted: its own lines are for the debug log
}

// newSrunStep plans the step of j's remote hosts. They take no start slot:
// srun paces its own starts.
func newSrunStep(j *job, o *srunOptions) *srunStep {
	s := &srunStep{opts: o, exited: make(chan struct{}), byTask: map[int]*hostAgent{}, gone: map[int]bool{}}
	for _, h := range j.hosts {
		if !h.local {
			s.hosts = append(s.hosts, h)
			h.released = true
		}
	}
	return s
}

// srunControlURL is the control-plane URL the one srun gives every agent.
// It cannot differ per host, so when the server listens on the wildcard
// (hosts on several networks, or --bind 0.0.0.0) it lists the server at
// each chosen address, comma-separated; an agent's client tries them in
// turn and connects where its host has a route. Otherwise it is the one
// URL.
func (j *job) srunControlURL() string {
	if !j.bind.wildcard() || len(j.bind.addrs) == 0 {
		return j.srv.URL()
	}
	urls := make([]string, len(j.bind.addrs))
	for i, a := range j.bind.addrs {
		urls[i] = j.srv.URLAt(a)
	}
	return strings.Join(urls, ",")
}

// startSrun starts the agents of every remote host with one srun.
func (j *job) startSrun() {
	s := j.srun
	nodes := make([]string, len(s.hosts))
	for i, h := range s.hosts {
		nodes[i] = h.name
	}
	agent := []string{j.cfg.AgentPath, "agent", "--slurm", "--job", j.id, "--control", j.srunControlURL()}
	if j.verbose {
		agent = append(agent, "-v")
	}
	cmd := exec.Command(s.opts.path, s.opts.args(j.id, nodes, agent)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_HOSTFILE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// Its own process group, so a Ctrl-C on the terminal reaches only
	// gorun, which decides; SIGTERM if gorun dies (srun then cancels the
	// step).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	failAll := func(err error) {
		for _, h := range s.hosts {
			j.agentExits <- agentExit{host: h.index, err: err}
		}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		failAll(fmt.Errorf("starting srun: %w", err))
		return
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		failAll(fmt.Errorf("starting srun: %w", err))
		return
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		failAll(fmt.Errorf("starting srun: %w", err))
		return
	}
	j.log.Debug("starting agents with srun", "args", cmd.Args)
	if err := cmd.Start(); err != nil {
		failAll(fmt.Errorf("starting agents with %s: %w", s.opts.path, err))
		return
	}
	s.mu.Lock()
	s.stdin, s.proc, s.open = stdin, cmd, len(s.hosts)
	s.mu.Unlock()
	for _, h := range s.hosts {
		j.started(h, &srunStream{j: j, h: h}, func() { j.srunGiveUp(h, errors.New("killed")) })
	}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		j.srunStdout(stdout)
	}()
	go func() {
		defer readers.Done()
		j.srunStderr(stderr)
	}()
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		readers.Wait()
		err := cmd.Wait()
		close(s.exited)
		if err == nil {
			err = errors.New("srun ended")
		} else {
			err = fmt.Errorf("srun ended: %w", err)
		}
		// srun reports no task's end apart: its own end is every agent's
		// that has not said it ended.
		for _, h := range s.hosts {
			if s.markGone(h) {
				j.agentExits <- agentExit{host: h.index, err: err}
			}
		}
	}()
}

// markGone records that h's end is reported, and whether that is news.
func (s *srunStep) markGone(h *hostAgent) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone[h.index] {
		return false
	}
	s.gone[h.index] = true
	return true
}

// srunGiveUp reports h's agent ended without waiting for srun: it was lost
// and fenced, or killed, and one task of a step cannot be ended apart (a
// fenced agent still running learns it from the epoch table and exits).
func (j *job) srunGiveUp(h *hostAgent, err error) {
	if !j.srun.markGone(h) {
		return
	}
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		j.agentExits <- agentExit{host: h.index, err: err}
	}()
}

// labelled splits srun --label's "ID: text" line.
func labelled(line string) (task int, text string, ok bool) {
	id, text, ok := strings.Cut(line, ": ")
	if !ok {
		return 0, "", false
	}
	task, err := strconv.Atoi(strings.TrimSpace(id))
	if err != nil || task < 0 {
		return 0, "", false
	}
	return task, text, true
}

// srunStdout reads the agents' stdout: their keys and their ends.
func (j *job) srunStdout(r io.Reader) {
	s := j.srun
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		task, text, ok := labelled(sc.Text())
		f := strings.Fields(text)
		if !ok || len(f) == 0 {
			continue
		}
		switch {
		case f[0] == SlurmKeyLine && len(f) == 4:
			j.srunKey(task, f[1], f[2], f[3])
		case f[0] == SlurmDoneLine && len(f) == 2:
			s.mu.Lock()
			h := s.byTask[task]
			s.mu.Unlock()
			if h == nil || !s.markGone(h) {
				continue
			}
			var err error
			if f[1] != "0" {
				err = fmt.Errorf("exit status %s", f[1])
			}
			j.agentExits <- agentExit{host: h.index, err: err}
		}
	}
}

// srunKey seals the credentials of the host that srun task task runs on
// to the key its agent printed, and writes them on the step's stdin. The
// step's arbitrary distribution puts task i on s.hosts[i]: the task id is
// srun's (--label), the node name the agent's own claim, so a line whose
// claim is not its task's node (another task lying about its node), a task
// that is not the step's, or a second key of a task gets nothing.
func (j *job) srunKey(task int, node, pub, step string) {
	s := j.srun
	key, err := base64.StdEncoding.DecodeString(pub)
	var h *hostAgent
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		err = fmt.Errorf("bad key: %w", err)
	case task >= len(s.hosts):
		err = fmt.Errorf("not a task of the step (it has %d)", len(s.hosts))
	case s.hosts[task].name != node:
		err = fmt.Errorf("task %d is node %s, not %s", task, s.hosts[task].name, node)
	case s.byTask[task] != nil:
		err = errors.New("the task's key came twice")
	default:
		h = s.hosts[task]
	}
	var sealed string
	if err == nil {
		sealed, err = jobkey.SealHostCredentials(j.secret.HostCredentials(h.index, j.srv.Fingerprint()), j.id, key)
	}
	if err != nil {
		j.out.report("srun task %d, node %s: %v; its agent gets no credentials", task, node, err)
		return
	}
	s.byTask[task] = h
	if s.step == "" {
		s.step = step
	}
	if s.stdin == nil {
		return
	}
	if _, err := fmt.Fprintf(s.stdin, "%d %s\n", h.index, sealed); err != nil {
		j.log.Debug("writing credentials to srun", "host", h.name, "err", err)
	}
}

// srunNoise are srun's own lines that say nothing to a gorun user.
var srunNoise = []string{"cluster configuration lacks support for cpu binding"}

// srunStderr forwards the agents' stderr (labelled) as startRemote does,
// and srun's own lines as reports.
func (j *job) srunStderr(r io.Reader) {
	s := j.srun
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		if task, text, ok := labelled(line); ok {
			s.mu.Lock()
			h := s.byTask[task]
			s.mu.Unlock()
			if h != nil {
				h.tail.add(text)
				j.out.agentLine(h.name, []byte(text))
				continue
			}
		}
		s.mu.Lock()
		noise := s.quiet
		s.mu.Unlock()
		for _, n := range srunNoise {
			noise = noise || strings.Contains(line, n)
		}
		if noise {
			j.log.Debug("srun", "says", line)
		} else {
			j.out.report("%s", line)
		}
	}
}

// srunStream is one host's end of the step's shared stdin: closing it
// gives the host up; once every host's is closed the step ends (stop).
type srunStream struct {
	j    *job
	h    *hostAgent
	once sync.Once
}

func (w *srunStream) Write(p []byte) (int, error) { return len(p), nil }

func (w *srunStream) Close() error {
	w.once.Do(func() {
		s := w.j.srun
		w.j.srunGiveUp(w.h, errors.New("its stream closed"))
		s.mu.Lock()
		s.open--
		last := s.open == 0
		s.mu.Unlock()
		if last {
			w.j.wg.Add(1)
			go func() {
				defer w.j.wg.Done()
				w.j.stopSrun()
			}()
		}
	})
	return nil
}

// stopSrun ends the step once every host's stream is closed: the agents
// have ended or were given up. Its stdin closes (an agent still there
// stops its ranks and exits). srun still there a second later waits for a
// task that will not end on its own, or a lost node's, which srun reports
// only once Slurm marks the node down: it gets two SIGINTs (its step
// cancel); after the kill grace (from 1 s to a quarter of exitWait) the
// step is cancelled with scancel --signal=KILL (given at most another
// quarter), which reaches the tasks on live nodes, and srun is killed. It
// all takes less than exitWait (1 s and two quarters of it), which is what
// the launcher gives its goroutines after the agents.
func (j *job) stopSrun() {
	s := j.srun
	s.mu.Lock()
	if s.stopped || s.proc == nil {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	stdin, proc, step := s.stdin, s.proc, s.step
	s.mu.Unlock()
	stdin.Close()
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-s.exited:
			return true
		case <-t.C:
			return false
		}
	}
	if wait(time.Second) {
		return
	}
	j.log.Debug("srun still there after its stdin closed; cancelling the step", "step", step)
	s.mu.Lock()
	s.quiet = true // what it says of its interrupt is gorun's doing
	s.mu.Unlock()
	_ = proc.Process.Signal(syscall.SIGINT)
	_ = proc.Process.Signal(syscall.SIGINT)
	if wait(min(max(j.cfg.KillGrace, time.Second), exitWait/4)) {
		return
	}
	if step != "" {
		ctx, cancel := context.WithTimeout(context.Background(), exitWait/4)
		cmd := exec.CommandContext(ctx, "scancel", "--signal=KILL", step)
		cmd.WaitDelay = 100 * time.Millisecond
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			j.log.Debug("scancel of the agents' step", "step", step, "err", err, "out", strings.TrimSpace(string(out)))
		}
	}
	_ = syscall.Kill(-proc.Process.Pid, syscall.SIGKILL)
}
