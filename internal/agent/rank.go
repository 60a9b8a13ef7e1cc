package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/gorun/gorun/internal/wire"
	"golang.org/x/sys/unix"
)

// errWorkDir marks a start that failed on the working directory.
var errWorkDir = errors.New("working directory")

// rankProc is one rank's process. Its fields after place are owned by the
// agent's loop, except stopped, which readers of the exit status share.
type rankProc struct {
	place wire.Placement
	gen   uint64 // restart generation
	// prog is spec.Prog as lookProg resolved it for the whole launch, or
	// "": start then has exec.Command search PATH itself.
	prog  string
	pmi   *os.File     // the rank's end of its PMI connection (fd 3 in the rank), until started
	abort atomic.Int32 // 1 + the exit code the rank gave PMI abort (MPI_Abort), or 0
	// pmiState: pmiNone, pmiOpen (init without finalize) or pmiDone.
	pmiState atomic.Int32
	pmiMsg   atomic.Pointer[string] // what the rank's PMI abort said
	// killedBy, when set, is why the agent killed the rank as a failure
	// (its PMI barrier failed, its protected state is corrupt, ...).
	killedBy atomic.Pointer[string]
	pid      int // also the process group id
	stopped  atomic.Bool
	ended    bool // the loop has seen the exit
	// movedAway: an in-place epoch placed the rank elsewhere and the
	// agent killed it (owned by the loop).
	movedAway bool

	mu     sync.Mutex // guards reaped, and signals against reaping
	reaped bool       // the rank's process has been reaped: its pid is free

	state    *os.ProcessState
	startErr error
	stdin    *os.File // write end of the rank's stdin, if it reads the launcher's
}

// start starts the rank and the goroutines that forward its output and
// report its end on exits. When the program cannot be started, the end is
// reported all the same (as a shell would: 127 not found, 126 not runnable).
// Reports are dropped once done is closed (the agent has stopped listening).
// The goroutines are g's (nil: uncounted).
//
// With stdin set, the rank reads its standard input from a pipe whose write
// end is returned in p.stdin; otherwise from /dev/null.
func (p *rankProc) start(spec *wire.JobSpec, env []string, stdin bool, out *batcher, exits chan<- *rankProc, done <-chan struct{}, g *group) error {
	if spec.Dir != "" {
		// Checked here: with SysProcAttr set, os/exec would report a
		// missing directory as a missing program.
		if st, err := os.Stat(spec.Dir); err != nil || !st.IsDir() {
			if err == nil {
				err = syscall.ENOTDIR
			}
			return p.failStart(fmt.Errorf("%w %s: %w", errWorkDir, spec.Dir, err), exits, done, g)
		}
	}
	var parentEnds, childEnds []*os.File // closed on failure; the child's always, after the start
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		if r, w, err = childPipe(true); err == nil {
			parentEnds, childEnds = append(parentEnds, r), append(childEnds, w)
		}
		return r, w, err
	}
	outR, outW, err := pipe()
	if err != nil {
		return p.failStart(err, exits, done, g)
	}
	errR, errW, err := pipe()
	if err != nil {
		closeAll(parentEnds)
		closeAll(childEnds)
		return p.failStart(err, exits, done, g)
	}
	cmd := rankCommand(p.prog, spec)
	cmd.Dir = spec.Dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = outW, errW
	if stdin {
		inW, inR, err := childPipe(false)
		if err != nil {
			closeAll(parentEnds)
			closeAll(childEnds)
			return p.failStart(err, exits, done, g)
		}
		cmd.Stdin = inR
		childEnds, parentEnds = append(childEnds, inR), append(parentEnds, inW)
		p.stdin = inW
	}
	if p.pmi != nil {
		cmd.ExtraFiles = []*os.File{p.pmi} // descriptor wire.PMIFD
		childEnds = append(childEnds, p.pmi)
		p.pmi = nil
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	closeAll(childEnds)
	if err != nil {
		closeAll(parentEnds)
		p.stdin = nil
		return p.failStart(err, exits, done, g)
	}
	p.pid = cmd.Process.Pid
	ro := newRankOutput()
	outS := out.openStream(p.place.Rank, wire.Stdout, p.gen, ro)
	errS := out.openStream(p.place.Rank, wire.Stderr, p.gen, ro)
	var pumps sync.WaitGroup
	pumps.Add(2)
	g.Go("rank output pump", func() { defer pumps.Done(); outS.pump(outR) })
	g.Go("rank output pump", func() { defer pumps.Done(); errS.pump(errR) })
	g.Go("rank waiter", func() {
		// Wait for the rank to end without reaping it, and kill what it
		// left in its process group while its pid, and so the group id,
		// cannot have been reused: a group id signalled later could name
		// an unrelated group.
		waitEnd(p.pid)
		p.mu.Lock()
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		p.reaped = true
		_ = cmd.Wait() // returns at once: the rank has exited, and there are no I/O goroutines
		p.mu.Unlock()
		p.state = cmd.ProcessState
		// The exit is reported once the rank's output is read to its end
		// and sent, so that the launcher shows it before the exit (the
		// pumps give up a pipe that something else holds open
		// drainTimeout after the end); but never later than that output
		// can go: at once if flow control holds it back (the pumps then go
		// on without this goroutine).
		ro.rankEnded(outR, errR)
		drained := make(chan struct{})
		g.Go("rank output drain", func() { pumps.Wait(); close(drained) })
		select {
		case <-drained:
		case <-ro.settled():
		}
		out.Flush()
		select {
		case exits <- p:
		case <-done:
		}
	})
	return nil
}

// childPipe makes a pipe for a rank: the rank's end (child) is a plain
// blocking descriptor, as a process expects its standard descriptors,
// which only the rank uses: it is not registered with the poller (os.Pipe
// would register it, make it non-blocking, and os/exec make it blocking
// again: four system calls per end for nothing). The agent's end (mine),
// the read end if mineReads, is non-blocking and served by the poller.
// Both are close-on-exec: os/exec gives the rank its own copy.
func childPipe(mineReads bool) (mine, child *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	m, c := p[0], p[1]
	if !mineReads {
		m, c = c, m
	}
	if err := unix.SetNonblock(m, true); err != nil {
		unix.Close(m)
		unix.Close(c)
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	// Named as os.Pipe names its ends.
	name := [2]string{"|0", "|1"}
	if !mineReads {
		name[0], name[1] = name[1], name[0]
	}
	return os.NewFile(uintptr(m), name[0]), os.NewFile(uintptr(c), name[1]), nil
}

// waitEnd waits for the process pid, a child of this one, to end, without
// reaping it: its pid stays taken until the caller reaps it. It returns at
// once if pid is not a child that can be waited for.
//
// It holds a thread per running rank, blocked in waitid. A pidfd polled
// through the runtime's poller would hold none; it was measured without
// a clear gain in launch time and left out.
func waitEnd(pid int) {
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
}

// lookProg resolves prog in PATH as exec.Command would, once for all
// the ranks of a launch rather than once per rank (a PATH search is a
// stat per directory until it is found): "" if prog names a path (there
// is nothing to search) or the search fails or finds a relative path
// (exec.ErrDot), where each rank's exec.Command searches again and
// reports the failure as it always did.
func lookProg(prog string) string {
	if filepath.Base(prog) != prog {
		return ""
	}
	lp, err := exec.LookPath(prog)
	if err != nil {
		return ""
	}
	return lp
}

// rankCommand is exec.Command(spec.Prog, spec.Args...), with the program
// at prog when lookProg resolved it: the same Path, Args (argv[0] is
// spec.Prog as given) and Err.
func rankCommand(prog string, spec *wire.JobSpec) *exec.Cmd {
	if prog == "" {
		return exec.Command(spec.Prog, spec.Args...)
	}
	cmd := exec.Command(prog, spec.Args...)
	cmd.Args[0] = spec.Prog
	return cmd
}

func (p *rankProc) failStart(err error, exits chan<- *rankProc, done <-chan struct{}, g *group) error {
	p.startErr = err
	g.Go("rank start failure report", func() {
		select {
		case exits <- p:
		case <-done:
		}
	})
	return err
}

// signal sends sig to the rank's whole process group, while it runs (once
// it has been reaped, its group was killed and its id may be reused).
func (p *rankProc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pid <= 0 || p.reaped {
		return
	}
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return
	}
	if sig != syscall.SIGKILL && sig != syscall.SIGCONT {
		// A stopped process acts on the signal only once continued.
		_ = syscall.Kill(-p.pid, syscall.SIGCONT)
	}
}

// The states of a rank's PMI session.
const (
	pmiNone int32 = iota
	pmiOpen
	pmiDone
)

// setPMIMsg records what the rank's PMI session said at its end.
func (p *rankProc) setPMIMsg(msg string) {
	p.pmiMsg.Store(&msg)
}

// failWith kills the rank as a failure: its end is reported as exit code 1
// with "killed by gorun: " and why, whatever signal ended it.
func (p *rankProc) failWith(why string) {
	p.killedBy.Store(&why)
	p.signal(syscall.SIGKILL)
}

// exitEvent describes the rank's end.
func (p *rankProc) exitEvent(host int) *wire.Event {
	e := &wire.Event{Kind: wire.EventExited, Host: host, Rank: p.place.Rank, Pid: p.pid, Stopped: p.stopped.Load(), Gen: p.gen}
	defer func() {
		msg := ""
		if m := p.pmiMsg.Load(); m != nil {
			msg = *m
		}
		switch {
		case p.abort.Load() > 0:
			// A rank that called MPI_Abort was killed by the agent, as
			// mpiexec does: its status is the code it asked for.
			c := p.abort.Load() - 1
			e.Code, e.Signal, e.Abort = int(c), 0, true
			e.Msg = abortWhy(int(c), msg)
		case p.killedBy.Load() != nil:
			e.Code, e.Signal = 1, 0
			e.Msg = "killed by gorun: " + *p.killedBy.Load()
		case p.pmiState.Load() == pmiOpen && e.Code == 0 && e.Signal == 0 && !e.Stopped:
			// Its peers may be waiting for it in a PMI barrier: as
			// Hydra, a bad termination, which fails the job.
			e.Code = 1
			e.Msg = "exited with code 0 without calling MPI_Finalize"
		}
	}()
	switch {
	case p.startErr != nil:
		switch {
		case errors.Is(p.startErr, errWorkDir):
			e.Code = 1
		case errors.Is(p.startErr, fs.ErrPermission):
			e.Code = 126
		default:
			e.Code = 127
		}
		e.Msg = "cannot start: " + p.startErr.Error()
	case p.state == nil:
		e.Code = 1
		e.Msg = "no exit status"
	default:
		ws, _ := p.state.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			e.Code, e.Signal = -1, int(ws.Signal())
			e.Msg = "killed by signal " + ws.Signal().String()
		} else {
			e.Code = p.state.ExitCode()
		}
	}
	return e
}

// baseEnv is the environment common to every rank of this host: the
// agent's own, without any rank contract inherited from an enclosing job,
// and the job's -x variables.
func baseEnv(inherited, extra []string) []string {
	drop := make(map[string]bool, len(wire.ContractNames)+len(wire.StaleNames))
	for _, n := range append(slices.Clone(wire.ContractNames), wire.StaleNames...) {
		drop[n] = true
	}
	var env []string
	for _, kv := range inherited {
		k, _, _ := strings.Cut(kv, "=")
		if drop[k] || strings.HasPrefix(k, "GORUN_") || slices.ContainsFunc(wire.StalePrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
			continue
		}
		env = append(env, kv)
	}
	return mergeEnv(env, extra)
}

// mergeEnv returns env with the entries of each of overs, in turn,
// replacing those of the same name: mergeEnv(env, a, b) is
// mergeEnv(mergeEnv(env, a), b), in one pass.
func mergeEnv(env []string, overs ...[]string) []string {
	all := slices.Concat(append([][]string{env}, overs...)...)
	idx := make(map[string]int, len(all))
	out := make([]string, 0, len(all))
	for _, kv := range all {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// envBase is an environment that many are merged from: the base every
// rank of a launch shares, indexed once, so that each rank's merge costs
// only its own variables rather than the whole environment again.
type envBase struct {
	env []string       // mergeEnv(env): no name twice
	idx map[string]int // a name's index in env
}

func newEnvBase(env []string) *envBase {
	b := &envBase{env: mergeEnv(env)}
	b.idx = make(map[string]int, len(b.env))
	for i, kv := range b.env {
		k, _, _ := strings.Cut(kv, "=")
		b.idx[k] = i
	}
	return b
}

// merge is mergeEnv(env, overs...) for the env b was made from.
func (b *envBase) merge(overs ...[]string) []string {
	n := 0
	for _, o := range overs {
		n += len(o)
	}
	out := make([]string, len(b.env), len(b.env)+n)
	copy(out, b.env)
	added := make(map[string]int, n) // names not in b.env: their index in out
	for _, o := range overs {
		for _, kv := range o {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := b.idx[k]; ok {
				out[i] = kv
			} else if i, ok := added[k]; ok {
				out[i] = kv
			} else {
				added[k] = len(out)
				out = append(out, kv)
			}
		}
	}
	return out
}

func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, name+"=") {
			return true
		}
	}
	return false
}

// layoutEnv is the parallel layout's part of the contract: the sizes of
// spec's layout for a world of world ranks (the launcher checked that they
// divide it).
func layoutEnv(spec *wire.JobSpec, world int) []string {
	tp, pp := max(spec.TP, 1), max(spec.PP, 1)
	if world%(tp*pp) != 0 {
		return nil
	}
	return []string{
		wire.EnvTPSize + "=" + strconv.Itoa(tp),
		wire.EnvPPSize + "=" + strconv.Itoa(pp),
		wire.EnvDPSize + "=" + strconv.Itoa(world/(tp*pp)),
	}
}

// rankEnv is the full environment of one rank: base plus the contract of
// DESIGN.md §3.
func rankEnv(base []string, spec *wire.JobSpec, t *wire.EpochTable, pl wire.Placement, socket, tmpdir string) []string {
	return mergeEnv(base, rankVars(spec, t, pl, socket, tmpdir, hasVar(base, wire.EnvOMPNumThreads)))
}

// rankVars is the contract of DESIGN.md §3 for one rank, which rankEnv
// merges into its base; ompSet tells that the base sets OMP_NUM_THREADS.
func rankVars(spec *wire.JobSpec, t *wire.EpochTable, pl wire.Placement, socket, tmpdir string, ompSet bool) []string {
	userVars := spec.Env
	itoa := strconv.Itoa
	rank, world := itoa(pl.Rank), itoa(t.World)
	local, localSize, node := itoa(pl.LocalRank), itoa(pl.LocalSize), itoa(pl.NodeRank)
	restarts := "0"
	set := []string{
		wire.EnvJobID + "=" + t.Job,
		wire.EnvRank + "=" + rank,
		wire.EnvWorldSize + "=" + world,
		wire.EnvLocalRank + "=" + local,
		wire.EnvLocalSize + "=" + localSize,
		wire.EnvNodeRank + "=" + node,
		wire.EnvEpoch + "=" + strconv.FormatUint(t.Epoch, 10),
		wire.EnvSocket + "=" + socket,
		wire.EnvRestartCount + "=" + restarts,

		wire.EnvTorchRank + "=" + rank,
		wire.EnvTorchWorldSize + "=" + world,
		wire.EnvTorchLocalRank + "=" + local,
		wire.EnvTorchLocalSize + "=" + localSize,
		wire.EnvTorchGroupRank + "=" + node,
		wire.EnvTorchGroupSize + "=" + itoa(t.NodeCount()),
		wire.EnvTorchRoleName + "=default",
		wire.EnvTorchRoleRank + "=" + rank,
		wire.EnvTorchRoleWorldSize + "=" + world,
		wire.EnvTorchMasterAddr + "=" + t.MasterAddr,
		wire.EnvTorchMasterPort + "=" + itoa(t.MasterPort),
		wire.EnvTorchRestartCount + "=" + restarts,
		wire.EnvTorchMaxRestarts + "=0",
		wire.EnvTorchRunID + "=" + t.Job,

		wire.EnvOMPIRank + "=" + rank,
		wire.EnvOMPISize + "=" + world,
		wire.EnvOMPILocalRank + "=" + local,
		wire.EnvOMPILocalSize + "=" + localSize,
		wire.EnvOMPINodeRank + "=" + node,
		wire.EnvPMIRank + "=" + rank,
		wire.EnvPMISize + "=" + world,
		wire.EnvMPILocalRankID + "=" + local,
		wire.EnvMPILocalNRanks + "=" + localSize,
	}
	if !spec.NoPMI {
		set = append(set, wire.EnvPMIFD+"="+strconv.Itoa(wire.PMIFD))
	}
	set = append(set, layoutEnv(spec, t.World)...)
	if pl.LocalSize > 1 && !ompSet {
		set = append(set, wire.EnvOMPNumThreads+"=1")
	}
	if !hasVar(userVars, wire.EnvTmpdir) {
		set = append(set, wire.EnvTmpdir+"="+tmpdir)
	}
	return set
}

// glooEnv returns env with GLOO_SOCKET_IFNAME set to the interface holding
// addr (ifname's answer), the address this host registered and the other
// hosts reach it at, unless env sets it already (the user's choice wins)
// or addr is a loopback address or unknown (gloo's default serves a
// single host). Without it gloo listens on, and gives its peers, the
// address the host name resolves to: a loopback address in network
// namespaces and where /etc/hosts maps the name to 127.0.1.1.
func glooEnv(env []string, addr string, ifname func(net.IP) (string, error)) []string {
	ip := net.ParseIP(addr)
	if hasVar(env, wire.EnvGlooIfname) || ip == nil || ip.IsLoopback() || ip.IsUnspecified() {
		return env
	}
	name, err := ifname(ip)
	if err != nil || name == "" {
		return env
	}
	return mergeEnv(env, []string{wire.EnvGlooIfname + "=" + name})
}

// ifaceOf returns the name of the network interface holding ip.
func ifaceOf(ip net.IP) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("network interfaces: %w", err)
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return ifc.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no interface holds %s", ip)
}
