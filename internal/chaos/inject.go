package chaos

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/testcluster"
)

// stallFor is how long StdoutStall keeps gorun's output pipe full.
const stallFor = 3 * time.Second

// ErrNotLanded: the fault was injected into nothing (the process had
// exited already).
var ErrNotLanded = errors.New("chaos: the fault landed on nothing")

// injector injects faults into jobs on the cluster's hosts (a job's
// host i is the cluster's host i).
type injector struct {
	hosts *testcluster.Hosts
	// resume starts the job again with --resume (Resume, CkptFlip).
	resume func() (*Job, error)
	// killed checks the leftovers of the job Resume and CkptFlip
	// killed whole, before the resumed job's agents sweep them.
	killed func(*Job) (leaks, cleaned []string)
}

// injected is what inject did.
type injected struct {
	at      float64 // seconds since the job's start when the fault landed
	durable bool    // the durable tier had a committed version then
	note    string  // what was done, for the record
	// linkDown: a partitioned host still down, to bring up again once
	// the run ended; -1 for none.
	linkDown int
	// lost are the hosts the fault lost (indices into the job's hosts):
	// f.Lost(), but only the first of DuringRecovery when the job ended
	// before the second could be killed.
	lost []int
	// crashed are the job's hosts whose agent was SIGKILLed.
	crashed []int
	// notLanded says why the fault, though injected, hit nothing
	// (StdoutStall: the pipe was not full at its release).
	notLanded string
	// resumed is the job started again with --resume after the whole
	// job was killed (Resume, CkptFlip); nil for the other kinds.
	resumed *Job
	// killedLeaks and killedCleaned are the killed job's leftovers
	// (injector.killed).
	killedLeaks, killedCleaned []string
}

// inject waits for G >= f.After, then injects f into j.
func (in *injector) inject(j *Job, f Fault) (injected, error) {
	out := injected{linkDown: -1}
	if err := j.waitStep(f.After); err != nil {
		return out, err
	}
	out.durable = j.CkptDir != "" && committed(j.CkptDir)
	out.at = j.since()
	out.lost = f.Lost()
	if f.Crashes() > 0 {
		out.crashed = f.Lost()
	}
	switch f.Kind {
	case RankKill:
		p, err := j.rankProc(f.Rank)
		if err != nil {
			return out, err
		}
		out.note = fmt.Sprintf("SIGKILL %v", p)
		return out, signal(p.pid, syscall.SIGKILL)
	case RankStop:
		p, err := j.rankProc(f.Rank)
		if err != nil {
			return out, err
		}
		out.note = fmt.Sprintf("SIGSTOP %v", p)
		return out, signal(p.pid, syscall.SIGSTOP)
	case HostKill:
		out.note = "KillAll " + j.Hosts[f.Host]
		return out, in.hosts.KillAll(f.Host)
	case AgentKill:
		ps, err := j.hostProcs(f.Host)
		if err != nil {
			return out, err
		}
		for _, p := range ps {
			if p.isAgent() {
				out.note = fmt.Sprintf("SIGKILL agent %v", p)
				return out, signal(p.pid, syscall.SIGKILL)
			}
		}
		return out, fmt.Errorf("chaos: no agent in host %s", j.Hosts[f.Host])
	case Partition:
		out.note = "link down " + j.Hosts[f.Host]
		out.linkDown = f.Host
		if err := in.hosts.LinkDown(f.Host); err != nil {
			return out, err
		}
		// Up again once gorun fenced it: a partition that heals.
		if err := j.waitKind("fence", 1); err != nil && !errors.Is(err, ErrJobEnded) {
			return out, err
		}
		out.linkDown = -1
		return out, in.hosts.LinkUp(f.Host)
	case TwoHosts:
		// Both die in one pass: killed one after the other, the launcher
		// could stop the job on the first loss and its surviving agents
		// end and sweep while the second host's agent still held the
		// job's files, which then no agent is left to remove.
		out.note = "KillAll " + j.Hosts[f.Host] + " and " + j.Hosts[f.Host2] + " together"
		return out, in.hosts.KillAll(f.Host, f.Host2)
	case DuringRecovery:
		out.note = "KillAll " + j.Hosts[f.Host] + ", then " + j.Hosts[f.Host2] + " once the recovery epoch was published"
		n := countKind(j.records(), "publish")
		if err := in.hosts.KillAll(f.Host); err != nil {
			return out, err
		}
		if err := j.waitKind("publish", n+1); err != nil {
			if errors.Is(err, ErrJobEnded) {
				// One host lost, not two: judged on that one.
				out.note += " (the job ended before it)"
				out.lost, out.crashed = []int{f.Host}, []int{f.Host}
				return out, nil
			}
			return out, err
		}
		return out, in.hosts.KillAll(f.Host2)
	case LauncherTerm:
		out.note = "SIGTERM gorun"
		return out, j.cmd.Process.Signal(syscall.SIGTERM)
	case LauncherUsr1:
		out.note = "SIGUSR1 gorun"
		return out, j.cmd.Process.Signal(syscall.SIGUSR1)
	case StdoutStall:
		release, err := j.stdout.stall()
		if err != nil {
			return out, err
		}
		g0 := lastG(j.records())
		select {
		case <-time.After(stallFor): // the fault's length
		case <-j.done:
		}
		// Landed: gorun blocked in a write to its full standard output
		// (the filler alone fills the pipe: a full pipe shows nothing).
		blocked, berr := writeBlocked(j.cmd.Process.Pid, 1)
		full, err := release()
		out.note = fmt.Sprintf("gorun's stdout pipe (%d bytes) filled and not read for %v; full at release: %v; gorun blocked writing to it: %v; G %d → %d meanwhile", j.stdout.size, stallFor, full, blocked, g0, lastG(j.records()))
		switch {
		case err != nil:
		case berr != nil && j.Exited():
			err = fmt.Errorf("%w: %v", ErrJobEnded, berr)
		case berr != nil:
			err = berr
		case !blocked:
			out.notLanded = "gorun was not blocked writing to its standard output at the stall's release"
		}
		return out, err
	case SlotFlip:
		note, err := flipSlots(j, f.Rank)
		out.note = note
		return out, err
	case GPUFault:
		var err error
		out.note, err = injectGPUFault(j, f)
		return out, err
	case Resume, CkptFlip:
		return in.killAndResume(j, f, out)
	case ReplicaFlip:
		return in.replicaFlip(j, f, out)
	}
	return out, fmt.Errorf("chaos: unknown fault kind %q", f.Kind)
}

// signal sends sig to pid; a process that has already exited is
// ErrNotLanded.
func signal(pid int, sig syscall.Signal) error {
	err := syscall.Kill(pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%w: %v to pid %d: it had exited", ErrNotLanded, sig, pid)
	}
	if err != nil {
		return fmt.Errorf("chaos: %v to pid %d: %w", sig, pid, err)
	}
	return nil
}

// lastG is the newest sample's G, -1 without one.
func lastG(recs []events.Record) int64 {
	g := int64(-1)
	for _, r := range recs {
		if s, ok := r.Event.(events.Sample); ok {
			g = s.G
		}
	}
	return g
}

// flipByte is the byte of a region slot-flip and ckpt-flip flip (the
// last in a shorter region), as keeper.FlipByte is replica-flip's: byte 3,
// the sign and high exponent bits of the little-endian float32 the
// region starts with (the first Adam moment, m[0], in dptrain's
// optimizer region). Byte 0, the lowest mantissa byte, changed m[0] by
// at most some 90 ulps, which Adam's decay could make vanish from the
// final hash: a silent restore then went unseen.
const flipByte = 3

// committed reports whether the durable directory has a commit record.
func committed(dir string) bool {
	_, err := os.Stat(dir + "/COMMITTED")
	return err == nil
}

// flipSlots stops rank's trainer (SIGSTOP: nothing is staged for it any
// more), flips byte flipByte of its optimizer region in every slot the
// header says is committed, checks the header still says the same after
// the flip (so the flip came after the commit's CRC32C), and kills the
// trainer: its restart must restore step G and find the slot corrupt.
func flipSlots(j *Job, rank int) (note string, err error) {
	p, err := j.rankProc(rank)
	if err != nil {
		return "", err
	}
	if err := signal(p.pid, syscall.SIGSTOP); err != nil {
		return "", err
	}
	killed := false
	defer func() {
		// Every way out kills the stopped trainer: a fault half landed
		// (stopped, never killed) is a hang the run did not draw.
		if !killed {
			signal(p.pid, syscall.SIGKILL)
			err = fmt.Errorf("%w (half landed: rank %d stopped, then killed, nothing flipped)", err, rank)
		}
	}()
	s, err := ckpt.Open(j.ID(), rank, nil, ckpt.Options{})
	if err != nil {
		return "", fmt.Errorf("chaos: opening rank %d's slots: %w", rank, err)
	}
	defer s.Close()
	var file ckpt.RegionFile
	for _, f := range s.Files() {
		if f.Name == "optimizer" {
			file = f
		}
	}
	if file.Path == "" || file.Size == 0 {
		return "", fmt.Errorf("chaos: rank %d has no optimizer region", rank)
	}
	before, ok := s.Committed()
	fh, err := os.OpenFile(file.Path, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("chaos: opening rank %d's optimizer slots: %w", rank, err)
	}
	defer fh.Close()
	note = fmt.Sprintf("SIGSTOP %v; ", p)
	for i := range 2 {
		if !ok[i] {
			continue
		}
		off := int64(i)*file.Stride + min(flipByte, file.Size-1)
		var b [1]byte
		if _, err := fh.ReadAt(b[:], off); err != nil {
			return note, fmt.Errorf("chaos: reading slot %d of %s: %w", i, file.Path, err)
		}
		b[0] ^= 0x5a
		if _, err := fh.WriteAt(b[:], off); err != nil {
			return note, fmt.Errorf("chaos: flipping slot %d of %s: %w", i, file.Path, err)
		}
		after, okAfter := s.Committed()
		still := okAfter[i] && after[i] == before[i]
		note += fmt.Sprintf("flipped byte %d of slot %d (committed step %d, still committed after: %v); ", off-int64(i)*file.Stride, i, before[i], still)
	}
	note += "SIGKILL"
	killed = true
	return note, signal(p.pid, syscall.SIGKILL)
}

// killAndResume waits for a committed version on disk, kills the whole
// job (every host's processes frozen, the launcher killed, then every
// process of every host: its agents cannot clean up), checks its leftovers (injector.killed: gorun clean's to
// remove), flips a byte of rank f.Rank's committed base file for
// CkptFlip, and starts the job again with --resume.
func (in *injector) killAndResume(j *Job, f Fault, out injected) (injected, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := durable.ReadCommitted(j.CkptDir); err == nil {
			break
		}
		if j.Exited() {
			return out, fmt.Errorf("%w: waiting for a committed version in %s", ErrJobEnded, j.CkptDir)
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("chaos: no committed version in %s within 60s", j.CkptDir)
		}
		select {
		case <-j.done:
		case <-time.After(pollEvery):
		}
	}
	out.durable, out.at = true, j.since()
	out.note = "StopAll every host, SIGKILL gorun, KillAll every host"
	j.killed = true
	// Every host frozen first: the job dies whole at once, as in a
	// machine's crash (killed after the launcher, agents that notice its
	// loss clean up first, and nothing is left for gorun clean).
	for h := range j.Hosts {
		if err := in.hosts.StopAll(h); err != nil {
			return out, err
		}
	}
	if err := j.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return out, fmt.Errorf("chaos: killing gorun: %w", err)
	}
	for h := range j.Hosts {
		if err := in.hosts.KillAll(h); err != nil {
			return out, err
		}
	}
	j.Wait()
	out.killedLeaks, out.killedCleaned = in.killed(j)
	if f.Kind == CkptFlip {
		note, err := flipBase(j.CkptDir, f.Rank)
		out.note += "; " + note
		if err != nil {
			return out, err
		}
	}
	r, err := in.resume()
	out.resumed = r
	out.note += "; gorun --resume"
	return out, err
}

// flipBase flips byte flipByte of the optimizer region (else the
// largest) in rank's committed base file in dir.
func flipBase(dir string, rank int) (string, error) {
	l, err := durable.List(dir)
	if err != nil {
		return "", fmt.Errorf("chaos: listing %s: %w", dir, err)
	}
	if l.Manifest == nil || rank >= len(l.Manifest.Regions) || !l.HasCommit {
		return "", fmt.Errorf("chaos: %s has no manifest with rank %d, or no commit record", dir, rank)
	}
	var base durable.BaseFile
	for _, rl := range l.Ranks {
		if rl.Rank != rank {
			continue
		}
		for _, b := range rl.Bases {
			if b.State == durable.StateCommitted && b.Step == l.Committed {
				base = b
			}
		}
	}
	if base.Path == "" {
		return "", fmt.Errorf("chaos: rank %d has no base file of the committed step %d", rank, l.Committed)
	}
	st, err := os.Stat(base.Path)
	if err != nil {
		return "", fmt.Errorf("chaos: rank %d's base file: %w", rank, err)
	}
	// The regions' data end the file, each rounded up to 4096 bytes
	// (durable/layout.go): region i starts where the ones after it end.
	regions := l.Manifest.Regions[rank]
	pickI := 0
	for i, r := range regions {
		if r.Name == "optimizer" || (regions[pickI].Name != "optimizer" && r.Size > regions[pickI].Size) {
			pickI = i
		}
	}
	off := st.Size()
	for i := len(regions) - 1; i >= pickI; i-- {
		off -= (regions[i].Size + 4095) &^ 4095
	}
	off += min(flipByte, max(regions[pickI].Size-1, 0))
	fh, err := os.OpenFile(base.Path, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("chaos: opening rank %d's base file: %w", rank, err)
	}
	defer fh.Close()
	var b [1]byte
	if _, err := fh.ReadAt(b[:], off); err != nil {
		return "", fmt.Errorf("chaos: reading byte %d of %s: %w", off, base.Path, err)
	}
	b[0] ^= 0x5a
	if _, err := fh.WriteAt(b[:], off); err != nil {
		return "", fmt.Errorf("chaos: flipping byte %d of %s: %w", off, base.Path, err)
	}
	return fmt.Sprintf("flipped byte %d of %s (rank %d's %s region, committed step %d)", off, base.Path, rank, regions[pickI].Name, l.Committed), fh.Sync()
}
