package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/testcluster"
)

// Suite runs chaos runs on one set of namespace hosts. Its fields are set
// by the caller; runs are sequential (the machine has two cores).
type Suite struct {
	Hosts    *testcluster.Hosts
	Bins     Binaries
	Dir      string // work directory: one subdirectory per job
	Registry string // XDG_RUNTIME_DIR of the jobs (internal/jobstatus's registry under it)
	Log      *slog.Logger
	Kinds    []Kind // the fault kinds drawn (nil: every kind)

	refs map[string]reference // failure-free runs by Config.Key
}

// reference is a failure-free run's outcome.
type reference struct {
	code    int
	hash    string
	seconds float64
	leaks   []string
	tail    string
}

// RunOne runs run index of seed: its configuration's reference (cached),
// then the run with its fault; it returns the record (Judge it).
func (s *Suite) RunOne(ctx context.Context, seed uint64, index int) Run {
	c, f := Draw(seed, index, s.Bins, s.Kinds)
	r := Run{Index: index, Seed: seed, Config: c, Fault: f, FaultToDetect: -1, DetectToResume: -1}
	p := Precheck(c, s.Hosts.Names)
	if p.Err != nil {
		r.Predicted = p.Err.Error()
	}
	ref, err := s.reference(ctx, c)
	if err != nil {
		r.NotInjected = err.Error()
		return r
	}
	r.RefCode, r.RefHash, r.ReferenceSeconds = ref.code, ref.hash, ref.seconds
	for _, l := range ref.leaks {
		r.Leaks = append(r.Leaks, "failure-free run: "+l)
	}
	if (ref.code == 2) != (p.Err != nil) {
		r.Mismatch = fmt.Sprintf("the precheck said %q, gorun exited %d", r.Predicted, ref.code)
		s.Log.Warn("precheck and gorun disagree", "run", index, "config", c.Key(), "mismatch", r.Mismatch, "stderr", ref.tail)
	}
	if ref.code == 2 {
		r.Refused = true
		r.Reported = ref.tail
		return r
	}
	if ref.code != 0 {
		r.StderrTail = ref.tail
		return r
	}

	dir, err := os.MkdirTemp(s.Dir, fmt.Sprintf("run%d-", index))
	if err != nil {
		r.NotInjected = err.Error()
		return r
	}
	defer os.RemoveAll(dir)
	j, err := startJob(ctx, c, s.Bins, s.Hosts.Names[:c.Hosts+c.Spares], s.Hosts.BridgeAddr, dir, s.Registry, false)
	if err != nil {
		r.NotInjected = err.Error()
		return r
	}
	in := &injector{hosts: s.Hosts, index: func(i int) int { return i }, resume: func() (*Job, error) {
		return startJob(ctx, c, s.Bins, s.Hosts.Names[:c.Hosts+c.Spares], s.Hosts.BridgeAddr, dir, s.Registry, true)
	}}
	done, err := in.inject(j, f)
	r.At, r.Injected = done.at, done.note
	if done.linkDown >= 0 {
		defer s.Hosts.LinkUp(done.linkDown)
	}
	if err != nil {
		r.NotInjected = err.Error()
		if !errors.Is(err, ErrJobEnded) {
			s.Log.Warn("injection failed", "run", index, "err", err)
		}
	}
	switch f.Kind {
	case SlotFlip:
		r.Flipped = strings.Contains(done.note, "still committed after: true")
	case CkptFlip:
		r.Flipped = strings.Contains(done.note, "flipped byte")
	}
	r.Within, r.Promise = Within(f, p, c, done.durable)
	j.Wait()
	if done.linkDown >= 0 {
		s.Hosts.LinkUp(done.linkDown)
	}
	var killed *Job
	if done.resumed != nil {
		// The resumed job is the run's; the killed job's leftovers are
		// looked for once it ended too (the resumed job runs in the same
		// hosts, and its agents' start sweeps the killed one's files).
		killed, j = j, done.resumed
		j.Wait()
	}
	s.outcome(&r, j)
	if killed != nil {
		leaks, known := checkLeaks(killed, s.Hosts, func(i int) int { return i }, s.Registry, done.crashedDirs, done.crashedHosts)
		for _, l := range leaks {
			r.Leaks = append(r.Leaks, "the killed job: "+l)
		}
		r.KnownLeaks = append(r.KnownLeaks, known...)
		done.crashedDirs, done.crashedHosts = nil, nil
	}
	leaks, known := checkLeaks(j, s.Hosts, func(i int) int { return i }, s.Registry, done.crashedDirs, done.crashedHosts)
	r.Leaks = append(r.Leaks, leaks...)
	r.KnownLeaks = append(r.KnownLeaks, known...)
	return r
}

// reference returns c's failure-free run, running it the first time.
func (s *Suite) reference(ctx context.Context, c Config) (reference, error) {
	if ref, ok := s.refs[c.Key()]; ok {
		ref.leaks = nil // reported with the run that ran it
		return ref, nil
	}
	dir, err := os.MkdirTemp(s.Dir, "ref-")
	if err != nil {
		return reference{}, err
	}
	defer os.RemoveAll(dir)
	j, err := startJob(ctx, c, s.Bins, s.Hosts.Names[:c.Hosts+c.Spares], s.Hosts.BridgeAddr, dir, s.Registry, false)
	if err != nil {
		return reference{}, err
	}
	j.Wait()
	var r Run
	s.outcome(&r, j)
	ref := reference{code: j.code, hash: r.Hash, seconds: j.elapsed.Seconds(), tail: r.StderrTail}
	if j.hung != "" {
		ref.leaks = append(ref.leaks, "hung: "+j.hung)
	}
	leaks, known := checkLeaks(j, s.Hosts, func(i int) int { return i }, s.Registry, nil, nil)
	ref.leaks = append(append(ref.leaks, leaks...), known...)
	if j.code != 0 && j.code != 2 {
		s.Log.Warn("failure-free run failed", "config", c.Key(), "code", j.code, "stderr", r.StderrTail)
	}
	if s.refs == nil {
		s.refs = map[string]reference{}
	}
	s.refs[c.Key()] = ref
	return ref, nil
}

var (
	dptrainHashRE = regexp.MustCompile(`(?m)^\[0\] (params|optimizer) sha256 ([0-9a-f]{64})$`)
	pytrainHashRE = regexp.MustCompile(`(?m)^\[0\] final hash ([0-9a-f]{64})$`)
	mpiHashRE     = regexp.MustCompile(`(?m)^\[0\] final hash ([0-9a-f]{16})$`)
	stepRE        = regexp.MustCompile(`(?m)^\[0\] step (\d+)\b`)
	// corruptRE is what gorun says of a slot that failed its CRC32C:
	// ckpt.ErrCorrupt's text (the agent's "restoring from other hosts"
	// line names it under -v), or rank.CorruptError's.
	// For a base file on disk: durable.CorruptError's "durable: PATH:
	// bytes [A, B): ...".
	corruptRE = regexp.MustCompile(`ckpt: corrupt slot|corrupted in memory|durable: \S+: bytes \[`)
)

// outcome fills r with what job j ended with.
func (s *Suite) outcome(r *Run, j *Job) {
	out, errOut := j.stdout.String(), j.stderr.String()
	r.Code, r.Seconds, r.Hung = j.code, j.elapsed.Seconds(), j.hung
	if j.hung != "" {
		r.Dump = errOut
	}
	switch j.Config.Workload {
	case Pytrain:
		if m := pytrainHashRE.FindAllStringSubmatch(out, -1); m != nil {
			r.Hash = m[len(m)-1][1]
		}
	case MPICH:
		if m := mpiHashRE.FindAllStringSubmatch(out, -1); m != nil {
			r.Hash = m[len(m)-1][1]
		}
	default:
		var p, o string
		for _, m := range dptrainHashRE.FindAllStringSubmatch(out, -1) {
			if m[1] == "params" {
				p = m[2]
			} else {
				o = m[2]
			}
		}
		if p != "" || o != "" {
			r.Hash = "params " + p + " optimizer " + o
		}
	}
	// Rank 0's step lines: every step of dptrain (--log-every 1) and
	// of the MPICH program, every tenth and the last of pytrain's.
	seen := map[int]bool{}
	for _, m := range stepRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		seen[n] = true
	}
	if r.Hash != "" {
		for i := range j.Config.Steps {
			logged := j.Config.Workload != Pytrain || i%10 == 9 || i == j.Config.Steps-1
			if logged && !seen[i] {
				r.MissingSteps = append(r.MissingSteps, i)
			}
		}
	}
	r.StderrTail, r.Stderr = tail(errOut, 12), errOut
	recs := j.records()
	evText, _ := os.ReadFile(j.Events)
	r.Detected = corruptRE.MatchString(errOut) || corruptRE.Match(evText)
	var timelines []events.Timeline
	for _, rec := range recs {
		switch e := rec.Event.(type) {
		case events.Exit:
			if e.Code != 0 {
				r.Reported = e.Reason
			}
		case events.Timeline:
			timelines = append(timelines, e)
		}
	}
	if r.Code != 0 && r.Reported == "" {
		r.Reported = tail(errOut, 1)
	}
	if len(timelines) > 0 && r.At > 0 {
		first, last := timelines[0], timelines[len(timelines)-1]
		if first.Detected != nil {
			r.FaultToDetect = max(0, *first.Detected-r.At)
			if last.Resumed != nil {
				r.DetectToResume = *last.Resumed - *first.Detected
			}
		}
	}
}

// tail returns the last n non-empty lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	var out []string
	for i := len(lines) - 1; i >= 0 && len(out) < n; i-- {
		if strings.TrimSpace(lines[i]) != "" {
			out = append([]string{lines[i]}, out...)
		}
	}
	return strings.Join(out, "\n")
}

// ReplayLine is the command line that replays run index of seed alone
// (kinds: the fault kinds drawn, "" for all).
func ReplayLine(seed uint64, index int, kinds string) string {
	mk, env := "", ""
	if kinds != "" {
		mk, env = " KINDS="+kinds, " GORUN_CHAOS_KINDS="+kinds
	}
	return fmt.Sprintf("make chaos SEED=%d ONLY=%d%s   (or: GORUN_CHAOS_SEED=%d GORUN_CHAOS_ONLY=%d%s GORUN_TESTCLUSTER_REQUIRE=1 go test ./internal/chaos -run 'TestChaos$' -count=1 -v -timeout 20m)",
		seed, index, mk, seed, index, env)
}
