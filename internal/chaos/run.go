package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
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
	refused bool   // gorun refused the configuration (refusal)
	hung    string // why the harness stopped it, "" when it did not
	leaks   []string
	cleaned []string
	tail    string
}

// RunOne runs run index of seed: its configuration's reference (cached),
// then the run with its fault; it returns the record (Judge it).
func (s *Suite) RunOne(ctx context.Context, seed uint64, index int) Run {
	c, f := Draw(seed, index, s.Kinds)
	r := Run{Index: index, Seed: seed, Config: c, Fault: f, FaultToDetect: -1, DetectToResume: -1}
	if missing := s.Bins.missing(c.Workload); missing != "" {
		r.Skipped = missing
		return r
	}
	p := Precheck(c, s.Hosts.Names)
	f = replicaOwner(f, p)
	r.Fault = f
	if p.Err != nil {
		r.Predicted = p.Err.Error()
	}
	ref, err := s.reference(ctx, c)
	if err != nil {
		r.InjectErr = "the failure-free run: " + err.Error()
		r.NotRun = r.InjectErr
		return r
	}
	r.RefCode, r.RefHash, r.ReferenceSeconds = ref.code, ref.hash, ref.seconds
	for _, l := range ref.leaks {
		r.Leaks = append(r.Leaks, "failure-free run: "+l)
	}
	r.Cleaned = append(r.Cleaned, ref.cleaned...)
	if ref.hung != "" {
		r.Hung = "the failure-free run: " + ref.hung
	}
	if ref.refused != (p.Err != nil) {
		r.Mismatch = fmt.Sprintf("the precheck said %q, gorun exited %d (%s)", r.Predicted, ref.code, ref.tail)
	} else if ref.refused && !sameReason(r.Predicted, ref.tail) {
		r.Mismatch = fmt.Sprintf("the precheck and gorun refuse for different reasons: the precheck said %q, gorun %q", r.Predicted, ref.tail)
	}
	if r.Mismatch != "" {
		s.Log.Warn("precheck and gorun disagree", "run", index, "config", c.Key(), "mismatch", r.Mismatch)
	}
	if ref.refused {
		r.Refused = true
		r.Reported = ref.tail
		return r
	}
	if ref.code != 0 || ref.hung != "" || r.Mismatch != "" {
		r.StderrTail = ref.tail
		r.NotRun = "the failure-free run failed, hung or disagreed with the precheck"
		return r
	}

	dir, err := os.MkdirTemp(s.Dir, fmt.Sprintf("run%d-", index))
	if err != nil {
		r.InjectErr, r.NotRun = err.Error(), "its directory: "+err.Error()
		return r
	}
	defer os.RemoveAll(dir)
	env, err := gpuFakeEnv(dir, c, f, s.Hosts.Names[:c.Hosts+c.Spares])
	if err != nil {
		r.InjectErr, r.NotRun = err.Error(), "its fake GPUs: "+err.Error()
		return r
	}
	j, err := startJob(ctx, c, s.Bins, s.Hosts, dir, s.Registry, false, env...)
	if err != nil {
		r.InjectErr, r.NotRun = err.Error(), "starting it: "+err.Error()
		return r
	}
	in := &injector{hosts: s.Hosts,
		resume: func() (*Job, error) { return startJob(ctx, c, s.Bins, s.Hosts, dir, s.Registry, true, env...) },
		killed: func(k *Job) ([]string, []string) {
			all := make([]int, len(k.Hosts))
			for i := range all {
				all[i] = i
			}
			return checkLeaks(k, s.leakCheck(all))
		}}
	done, err := in.inject(j, f)
	r.At, r.Injected = done.at, done.note
	switch {
	case err == nil:
	case errors.Is(err, ErrJobEnded):
		r.NotInjected = err.Error()
	case errors.Is(err, ErrNotLanded):
		r.NotLanded, r.Injected = true, r.Injected+"; "+err.Error()
	default:
		r.InjectErr = err.Error()
		s.Log.Warn("injection failed", "run", index, "err", err)
	}
	if done.notLanded != "" {
		r.NotLanded, r.Injected = true, r.Injected+"; not landed: "+done.notLanded
	}
	switch f.Kind {
	case SlotFlip:
		r.Flipped = strings.Contains(done.note, "still committed after: true")
		r.FlippedSteps = flippedSteps(done.note)
	case CkptFlip:
		r.Flipped = strings.Contains(done.note, "flipped byte")
	case ReplicaFlip:
		r.Flipped = flippedEvery(strings.Split(done.note, "; "), f, p)
	}
	r.Within, r.Promise = Within(f, done.lost, p, c, done.durable)
	if f.Kind == ReplicaFlip {
		r.Within, r.Promise = withinReplicaFlip(f, done.lost, p, c, done.durable, r.Flipped)
	}
	j.Wait()
	if done.linkDown >= 0 {
		if err := s.Hosts.LinkUp(done.linkDown); err != nil {
			r.Leaks = append(r.Leaks, "bringing the partitioned host's link up: "+err.Error())
		}
	}
	for _, l := range done.killedLeaks {
		r.Leaks = append(r.Leaks, "the killed job: "+l)
	}
	r.Cleaned = append(r.Cleaned, done.killedCleaned...)
	if done.resumed != nil {
		// The resumed job is the run's.
		j = done.resumed
		j.Wait()
	}
	s.outcome(&r, j)
	recs := j.records()
	if f.Kind == LauncherUsr1 {
		r.Forwarded = signalSeen(recs, "SIGUSR1")
		r.Noticed = noticedRanks(r.Stderr, r.Config.NP())
	}
	if r.Code == 0 && r.NotInjected == "" && r.InjectErr == "" && !r.NotLanded && needsFailure(f.Kind) && !failureSeen(recs, j.Hosts, f, done.lost, r.At) {
		r.NotLanded = true
		r.Injected += "; not landed: no failure or fence record names the faulted rank or host"
	}
	if f.Kind == GPUFault {
		r.GPU = gpuOutcome(f, r.Stderr, recs, j.Hosts)
		if gpuPermanent(f) {
			r.GPU.Replace = gpuReplace(f, p, c, done.durable)
		}
		if r.Code == 0 && r.NotInjected == "" && r.InjectErr == "" && !r.NotLanded && !r.GPU.Reported {
			r.NotLanded = true
			r.Injected += "; not landed: gorun's standard error reports no XID of the faulted GPU"
		}
	}
	leaks, cleaned := checkLeaks(j, s.leakCheck(done.crashed))
	r.Leaks = append(r.Leaks, leaks...)
	r.Cleaned = append(r.Cleaned, cleaned...)
	return r
}

// leakCheck is checkLeaks's setting for a job whose hosts crashed were
// SIGKILLed.
func (s *Suite) leakCheck(crashed []int) leakCheck {
	return leakCheck{hosts: s.Hosts, registry: s.Registry, gorun: s.Bins.Gorun, log: s.Log, crashed: crashed}
}

// needsFailure reports whether a fault of kind k, survived, must have
// been seen by gorun as a failure (a failure or fence record).
func needsFailure(k Kind) bool {
	switch k {
	case RankKill, RankStop, HostKill, AgentKill, Partition, TwoHosts, DuringRecovery, SlotFlip, ReplicaFlip:
		return true
	}
	return false
}

// failureSeen reports whether recs (an events file's records, of a job
// on hosts) show gorun seeing fault f, injected at seconds at, which lost
// the hosts lost: a failure record of f's rank (rank faults; for
// RankStop, any rank's hang recorded after at: a stopped rank stalls the
// others in its collective at the same step, and gorun may name one of
// them), and a failure or fence record of every lost host (host faults).
func failureSeen(recs []events.Record, hosts []string, f Fault, lost []int, at float64) bool {
	seen := make([]bool, len(lost))
	rank := f.Rank < 0
	for _, rec := range recs {
		host := ""
		switch e := rec.Event.(type) {
		case events.Failure:
			if f.Rank >= 0 && e.Rank == f.Rank {
				rank = true
			}
			if f.Kind == RankStop && e.What == events.FailHang && rec.T >= at {
				rank = true
			}
			host = e.Host
		case events.Fence:
			host = e.Host
		}
		for i, h := range lost {
			if host != "" && host == hosts[h] {
				seen[i] = true
			}
		}
	}
	return rank && !slices.Contains(seen, false)
}

// signalSeen reports whether recs have a rank-exit failure record of a
// rank killed by sig ("SIGUSR1").
func signalSeen(recs []events.Record, sig string) bool {
	for _, rec := range recs {
		if e, ok := rec.Event.(events.Failure); ok && e.What == events.FailRankExit && e.Signal == sig {
			return true
		}
	}
	return false
}

// notesUsr1 reports whether workload's ranks note SIGUSR1 and go on
// (dptrain: Go ignores SIGUSR1 unless notified; mpisteps: MPICH catches
// it) rather than die of it (pytrain: Python's default).
func notesUsr1(workload string) bool { return workload == Dptrain || workload == MPICH }

// usr1Note is a rank's line on getting SIGUSR1 (dptrain's, mpisteps').
var usr1Note = regexp.MustCompile(`(?m)(?:dptrain|mpisteps): rank (\d+): got SIGUSR1 at step \d+`)

// noticedRanks returns the ranks below np whose SIGUSR1 line is in
// stderr, each once, in order.
func noticedRanks(stderr string, np int) []int {
	var ranks []int
	for _, m := range usr1Note.FindAllStringSubmatch(stderr, -1) {
		if n, err := strconv.Atoi(m[1]); err == nil && n < np && !slices.Contains(ranks, n) {
			ranks = append(ranks, n)
		}
	}
	slices.Sort(ranks)
	return ranks
}

// reference returns c's failure-free run, running it the first time.
func (s *Suite) reference(ctx context.Context, c Config) (reference, error) {
	if ref, ok := s.refs[c.Key()]; ok {
		ref.leaks, ref.cleaned = nil, nil // reported with the run that ran it
		return ref, nil
	}
	dir, err := os.MkdirTemp(s.Dir, "ref-")
	if err != nil {
		return reference{}, fmt.Errorf("chaos: the reference's directory: %w", err)
	}
	defer os.RemoveAll(dir)
	j, err := startJob(ctx, c, s.Bins, s.Hosts, dir, s.Registry, false)
	if err != nil {
		return reference{}, err
	}
	j.Wait()
	var r Run
	s.outcome(&r, j)
	ref := reference{code: j.code, hash: r.Hash, seconds: j.elapsed.Seconds(), tail: r.StderrTail, hung: j.hung}
	ref.refused = refusal(j.code, j.hung, r.Stderr)
	ref.leaks, ref.cleaned = checkLeaks(j, s.leakCheck(nil))
	if j.code != 0 && !ref.refused {
		s.Log.Warn("failure-free run failed", "config", c.Key(), "code", j.code, "stderr", r.StderrTail)
	}
	if s.refs == nil {
		s.refs = map[string]reference{}
	}
	s.refs[c.Key()] = ref
	return ref, nil
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

// flippedNote is flipSlots' note of one flipped slot that stayed
// committed.
var flippedNote = regexp.MustCompile(`committed step (-?\d+), still committed after: true`)

// flippedSteps returns the committed steps of the slots a SlotFlip note
// says were flipped and stayed committed.
func flippedSteps(note string) []int64 {
	var steps []int64
	for _, m := range flippedNote.FindAllStringSubmatch(note, -1) {
		if n, err := strconv.ParseInt(m[1], 10, 64); err == nil {
			steps = append(steps, n)
		}
	}
	return steps
}
