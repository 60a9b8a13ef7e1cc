package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/testcluster"
)

// stallFor is how long StdoutStall stops reading gorun's output.
const stallFor = 3 * time.Second

// injector injects faults into jobs on the cluster's hosts.
type injector struct {
	hosts *testcluster.Hosts
	// index maps a job's host index to the cluster's.
	index func(jobHost int) int
	// resume starts the job again with --resume (Resume, CkptFlip).
	resume func() (*Job, error)
}

// injected is what inject did.
type injected struct {
	at      float64 // seconds since the job's start when the fault landed
	durable bool    // the durable tier had a committed version then
	note    string  // what was done, for the record
	// linkDown: a partitioned host, to bring up again once the run ended.
	linkDown int
	// crashedDirs are the job directories of the hosts whose agent was
	// SIGKILLed (its ranks' TMPDIR's parent, read before the kill): the
	// known leak, until the sweep of them merges.
	crashedDirs []string
	// crashedHosts are those hosts (indices into the job's hosts).
	crashedHosts []int
	// resumed is the job started again with --resume after the whole
	// job was killed (Resume, CkptFlip); nil for the other kinds.
	resumed *Job
}

// jobDir returns the job directory of the job's host i: the parent of
// its ranks' TMPDIR, "" when no rank runs there.
func jobDir(j *Job, i int) string {
	for _, p := range j.hostProcs(i) {
		if !p.isTrainer(j.Config.Workload) {
			continue
		}
		for _, kv := range strings.Split(string(p.env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "TMPDIR="); ok {
				return filepath.Dir(v)
			}
		}
	}
	return ""
}

// inject waits for G >= f.After, then injects f into j.
func (in *injector) inject(j *Job, f Fault) (injected, error) {
	out := injected{linkDown: -1}
	if err := j.waitStep(f.After); err != nil {
		return out, err
	}
	out.durable = j.CkptDir != "" && committed(j.CkptDir)
	out.at = j.since()
	if f.Crashes() > 0 {
		for _, h := range f.Lost() {
			if d := jobDir(j, h); d != "" {
				out.crashedDirs = append(out.crashedDirs, d)
			}
			out.crashedHosts = append(out.crashedHosts, h)
		}
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
		return out, in.hosts.KillAll(in.index(f.Host))
	case AgentKill:
		for _, p := range j.hostProcs(f.Host) {
			if p.isAgent() {
				out.note = fmt.Sprintf("SIGKILL agent %v", p)
				return out, signal(p.pid, syscall.SIGKILL)
			}
		}
		return out, fmt.Errorf("chaos: no agent in host %s", j.Hosts[f.Host])
	case Partition:
		out.note = "link down " + j.Hosts[f.Host]
		out.linkDown = f.Host
		if err := in.hosts.LinkDown(in.index(f.Host)); err != nil {
			return out, err
		}
		// Up again once gorun fenced it: a partition that heals.
		if err := j.waitKind("fence", 1); err != nil && !errors.Is(err, ErrJobEnded) {
			return out, err
		}
		out.linkDown = -1
		return out, in.hosts.LinkUp(in.index(f.Host))
	case TwoHosts:
		out.note = "KillAll " + j.Hosts[f.Host] + " and " + j.Hosts[f.Host2]
		if err := in.hosts.KillAll(in.index(f.Host)); err != nil {
			return out, err
		}
		return out, in.hosts.KillAll(in.index(f.Host2))
	case DuringRecovery:
		out.note = "KillAll " + j.Hosts[f.Host] + ", then " + j.Hosts[f.Host2] + " once the recovery epoch was published"
		n := countKind(j.records(), "publish")
		if err := in.hosts.KillAll(in.index(f.Host)); err != nil {
			return out, err
		}
		if err := j.waitKind("publish", n+1); err != nil {
			if errors.Is(err, ErrJobEnded) {
				out.note += " (the job ended before it)"
				return out, nil
			}
			return out, err
		}
		return out, in.hosts.KillAll(in.index(f.Host2))
	case LauncherTerm:
		out.note = "SIGTERM gorun"
		return out, j.cmd.Process.Signal(syscall.SIGTERM)
	case LauncherUsr1:
		out.note = "SIGUSR1 gorun"
		return out, j.cmd.Process.Signal(syscall.SIGUSR1)
	case StdoutStall:
		out.note = fmt.Sprintf("gorun's stdout not read for %v", stallFor)
		release := j.stdout.stall()
		time.AfterFunc(stallFor, release)
		return out, nil
	case SlotFlip:
		note, err := flipSlots(j, f.Rank)
		out.note = note
		return out, err
	case Resume, CkptFlip:
		return in.killAndResume(j, f, out)
	}
	return out, fmt.Errorf("chaos: unknown fault kind %q", f.Kind)
}

// signal sends sig to pid; a process that has already exited is no
// error (the fault then landed on nothing, which the record says).
func signal(pid int, sig syscall.Signal) error {
	err := syscall.Kill(pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// committed reports whether the durable directory has a commit record.
func committed(dir string) bool {
	_, err := os.Stat(dir + "/COMMITTED")
	return err == nil
}

// flipSlots stops rank's trainer (SIGSTOP: nothing is staged for it any
// more), flips the first byte of its optimizer region in every slot the
// header says is committed, checks the header still says the same after
// the flip (so the flip came after the commit's CRC32C), and kills the
// trainer: its restart must restore step G and find the slot corrupt.
func flipSlots(j *Job, rank int) (string, error) {
	p, err := j.rankProc(rank)
	if err != nil {
		return "", err
	}
	if err := signal(p.pid, syscall.SIGSTOP); err != nil {
		return "", err
	}
	s, err := ckpt.Open(j.ID(), rank, nil, ckpt.Options{})
	if err != nil {
		signal(p.pid, syscall.SIGKILL)
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
		signal(p.pid, syscall.SIGKILL)
		return "", fmt.Errorf("chaos: rank %d has no optimizer region", rank)
	}
	before, ok := s.Committed()
	fh, err := os.OpenFile(file.Path, os.O_RDWR, 0)
	if err != nil {
		signal(p.pid, syscall.SIGKILL)
		return "", fmt.Errorf("chaos: %w", err)
	}
	defer fh.Close()
	note := fmt.Sprintf("SIGSTOP %v; ", p)
	for i := range 2 {
		if !ok[i] {
			continue
		}
		off := int64(i) * file.Stride
		var b [1]byte
		if _, err := fh.ReadAt(b[:], off); err != nil {
			return note, fmt.Errorf("chaos: %w", err)
		}
		b[0] ^= 0x5a
		if _, err := fh.WriteAt(b[:], off); err != nil {
			return note, fmt.Errorf("chaos: %w", err)
		}
		after, okAfter := s.Committed()
		still := okAfter[i] && after[i] == before[i]
		note += fmt.Sprintf("flipped byte 0 of slot %d (committed step %d, still committed after: %v); ", i, before[i], still)
	}
	note += "SIGKILL"
	return note, signal(p.pid, syscall.SIGKILL)
}

// killAndResume waits for a committed version on disk, kills the whole
// job (the launcher, then every process of every host: its agents cannot
// clean up, their job directories are the known leak), flips a byte of
// rank f.Rank's committed base file for CkptFlip, and starts the job
// again with --resume.
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
	for h := range j.Hosts {
		if d := jobDir(j, h); d != "" {
			out.crashedDirs = append(out.crashedDirs, d)
		}
		out.crashedHosts = append(out.crashedHosts, h)
	}
	out.note = "SIGKILL gorun, KillAll every host"
	j.killed = true
	if err := j.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return out, err
	}
	for h := range j.Hosts {
		if err := in.hosts.KillAll(in.index(h)); err != nil {
			return out, err
		}
	}
	j.Wait()
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

// flipBase flips the first byte of the optimizer region (else the
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
		return "", fmt.Errorf("chaos: %w", err)
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
	fh, err := os.OpenFile(base.Path, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	defer fh.Close()
	var b [1]byte
	if _, err := fh.ReadAt(b[:], off); err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	b[0] ^= 0x5a
	if _, err := fh.WriteAt(b[:], off); err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	return fmt.Sprintf("flipped byte %d of %s (rank %d's %s region, committed step %d)", off, base.Path, rank, regions[pickI].Name, l.Committed), fh.Sync()
}
