package chaos

import (
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/events"
)

// TestJudge applies the oracle to fabricated runs, one or more per rule.
func TestJudge(t *testing.T) {
	// Two defects as the suite records them (both since fixed).
	defer func(kd []knownDefect) { KnownDefects = kd }(KnownDefects)
	KnownDefects = []knownDefect{
		{Name: "ec-diff-restore-H", Kind: SlotFlip, Signature: "(H is -1)"},
		{Name: "mpich-reinit-shm", Kind: DuringRecovery, Workload: MPICH, Signature: "unable to allocate shared memory"},
	}
	const ref, other = "params aa optimizer bb", "params aa optimizer cc"
	base := func(k Kind, within bool) Run {
		return Run{Fault: Fault{Kind: k, Host: 0, Host2: -1, Rank: -1}, RefHash: ref, Within: within,
			FaultToDetect: -1, DetectToResume: -1}
	}
	with := func(r Run, f func(*Run)) Run { f(&r); return r }
	// A replica-flip run beyond the promise for its flip (withinReplicaFlip).
	flipOnly := with(base(ReplicaFlip, false), func(r *Run) { r.Promise = "rank 2's " + onlyFlipped + " on host 0" })
	usr1 := func(workload string, hosts, perHost int) Run {
		r := base(LauncherUsr1, true)
		r.Config = Config{Workload: workload, Hosts: hosts, RanksPerHost: perHost}
		return r
	}
	tests := []struct {
		name  string
		run   Run
		class string
		rules []string // broken rules, in order
	}{
		{"within survived", with(base(HostKill, true), func(r *Run) { r.Hash = ref }), Survived, nil},
		{"within, exit 1", with(base(HostKill, true), func(r *Run) { r.Code, r.Reported = 1, "host lost" }), Failed, []string{"within-exit-0"}},
		{"within, exit 0 with a wrong hash", with(base(RankKill, true), func(r *Run) { r.Hash = other }), Failed, []string{"within-equal-hash"}},
		{"within, exit 0 without a hash", with(base(RankKill, true), func(*Run) {}), Failed, []string{"within-equal-hash"}},
		{"within, exit 1 with a wrong hash", with(base(Partition, true), func(r *Run) { r.Code, r.Hash, r.Reported = 1, other, "x" }), Failed, []string{"within-exit-0"}},
		{"beyond, reported", with(base(TwoHosts, false), func(r *Run) { r.Code, r.Reported = 1, "rank 3's state is lost" }), Reported, nil},
		{"beyond, exit 1 without a report", with(base(TwoHosts, false), func(r *Run) { r.Code = 1 }), Failed, []string{"beyond-reported"}},
		{"beyond, exit 0 with the right hash", with(base(HostKill, false), func(r *Run) { r.Hash = ref }), SurvivedBeyond, nil},
		{"beyond, exit 0 with a wrong hash", with(base(HostKill, false), func(r *Run) { r.Hash = other }), Failed, []string{"never-wrong-hash"}},
		{"beyond, exit 0 without a hash", with(base(DuringRecovery, false), func(*Run) {}), Failed, []string{"never-wrong-hash"}},
		{"beyond, exit 1 with a wrong hash", with(base(TwoHosts, false), func(r *Run) { r.Code, r.Reported, r.Hash = 1, "x", other }), Failed, []string{"never-wrong-hash"}},
		{"sigterm, 143", with(base(LauncherTerm, false), func(r *Run) { r.Code, r.Reported = 143, "terminated" }), Reported, nil},
		{"sigterm, exit 1", with(base(LauncherTerm, false), func(r *Run) { r.Code = 1 }), Failed, []string{"sigterm-exit"}},
		{"sigterm, exit 0", with(base(LauncherTerm, false), func(r *Run) { r.Hash = ref }), Failed, []string{"sigterm-exit"}},
		{"leak", with(base(RankKill, true), func(r *Run) { r.Hash, r.Leaks = ref, []string{"left behind: /dev/shm/gorun-x.r0.hdr"} }), Failed, []string{"no-leaks"}},
		{"launcher goroutine left", with(base(LauncherTerm, false), func(r *Run) {
			r.Code, r.Reported = 143, "terminated"
			r.Leaks = []string{"a goroutine of the launcher's left at its exit:\ngoroutine 41 [chan receive]:\ngithub.com/gorun/gorun/launcher.(*lane).run(0x1)"}
		}), Failed, []string{"no-leaks"}},
		{"removed by gorun clean only", with(base(TwoHosts, true), func(r *Run) {
			r.Hash, r.Cleaned = ref, []string{"removed protected state of job x in /dev/shm"}
		}), Survived, nil},
		{"launcher hung", with(base(AgentKill, true), func(r *Run) { r.Hash, r.Hung = ref, "the launcher outlived every process of its job by 30s" }), Failed, []string{"launcher-exits"}},
		{"slot flip detected", with(base(SlotFlip, true), func(r *Run) { r.Hash, r.Flipped, r.Detected = ref, true, true }), Survived, nil},
		{"slot flip restored silently", with(base(SlotFlip, true), func(r *Run) { r.Hash, r.Flipped = ref, true }), Failed, []string{"corruption-detected"}},
		{"slot flip, flipped step restored silently", with(base(SlotFlip, true), func(r *Run) {
			r.Hash, r.Flipped, r.FlippedSteps, r.RestoredSteps = ref, true, []int64{40}, []int64{40}
		}), Failed, []string{"corruption-detected"}},
		{"slot flip, flipped step restored by a later epoch, silently", with(base(SlotFlip, true), func(r *Run) {
			r.Hash, r.Flipped, r.FlippedSteps, r.RestoredSteps = ref, true, []int64{39, 40}, []int64{41, 40}
		}), Failed, []string{"corruption-detected"}},
		{"slot flip, flipped step restored and detected", with(base(SlotFlip, true), func(r *Run) {
			r.Hash, r.Flipped, r.Detected, r.FlippedSteps, r.RestoredSteps = ref, true, true, []int64{40}, []int64{40}
		}), Survived, nil},
		// The flake of SEED=13 ONLY=10: the one committed slot was
		// flipped, the restart restored another step: no flipped byte was
		// read, nothing to detect, the hash decides.
		{"slot flip, another step restored", with(base(SlotFlip, true), func(r *Run) {
			r.Hash, r.Flipped, r.FlippedSteps, r.RestoredSteps = ref, true, []int64{40}, []int64{41}
		}), Survived, nil},
		{"slot flip, another step restored, wrong hash", with(base(SlotFlip, true), func(r *Run) {
			r.Hash, r.Flipped, r.FlippedSteps, r.RestoredSteps = other, true, []int64{40}, []int64{41}
		}), Failed, []string{"within-equal-hash"}},
		{"slot flip, nothing restored from a step", with(base(SlotFlip, true), func(r *Run) {
			r.Hash, r.Flipped, r.FlippedSteps, r.RestoredSteps = ref, true, []int64{40}, []int64{-1}
		}), Survived, nil},
		{"slot flip not committed", with(base(SlotFlip, true), func(r *Run) { r.Hash = ref }), Survived, nil},
		{"slot flip beyond, reported", with(base(SlotFlip, false), func(r *Run) { r.Code, r.Reported, r.Flipped, r.Detected = 1, "not from other hosts", true, true }), Reported, nil},
		{"resumed", with(base(Resume, true), func(r *Run) { r.Hash = ref }), Survived, nil},
		{"resume failed", with(base(Resume, true), func(r *Run) { r.Code, r.Reported = 2, "--resume: no committed version" }), Failed, []string{"within-exit-0"}},
		{"corrupt base, rank named", with(base(CkptFlip, false), func(r *Run) {
			r.Fault.Rank, r.Code, r.Flipped, r.Detected, r.Reported = 3, 1, true, true, "stopping the job"
			r.Stderr = "gorun agent h1: --resume: rank 3: the base at step 5: durable: /d/r3/base.1: bytes [8192, 12288): CRC32C\nstopping the job\n"
		}), Reported, nil},
		{"corrupt base, rank not named", with(base(CkptFlip, false), func(r *Run) { r.Fault.Rank, r.Code, r.Flipped, r.Reported = 3, 1, true, "stopping the job" }), Failed, []string{"corrupt-base-named"}},
		{"corrupt base, another rank named", with(base(CkptFlip, false), func(r *Run) {
			r.Fault.Rank, r.Code, r.Flipped, r.Reported = 3, 1, true, "stopping the job"
			r.Stderr = "rank 31: the base at step 5: durable: /d/r31/base.1: bytes [8192, 12288): CRC32C\n"
		}), Failed, []string{"corrupt-base-named"}},
		{"corrupt base restored silently", with(base(CkptFlip, false), func(r *Run) { r.Fault.Rank, r.Flipped, r.Hash = 3, true, ref }), Failed, []string{"corruption-detected"}},
		{"known defect", with(base(SlotFlip, true), func(r *Run) {
			r.Code, r.Reported, r.Flipped, r.Detected = 1, "again with no progress", true, true
			r.Stderr = "rank: unrecoverable from the erasure-coded stripe: rank 0: no coded base at or before step 9 (H is -1)\n"
		}), KnownDefect, []string{"within-exit-0"}},
		{"known defect's signature, another fault", with(base(RankKill, true), func(r *Run) {
			r.Code, r.Reported = 1, "again with no progress"
			r.Stderr = "no coded base at or before step 9 (H is -1)\n"
		}), Failed, []string{"within-exit-0"}},
		{"known defect's signature, and a leak", with(base(SlotFlip, true), func(r *Run) {
			r.Code, r.Reported, r.Leaks = 1, "x", []string{"left behind: /dev/shm/gorun-x.r0.hdr"}
			r.Stderr = "(H is -1)\n"
		}), Failed, []string{"no-leaks", "within-exit-0"}},
		{"stdout stall, lines lost", with(base(StdoutStall, true), func(r *Run) { r.Hash, r.MissingSteps = ref, []int{7, 8} }), Failed, []string{"no-output-lost"}},
		// Round 2, #7: a stall judged not landed is still checked.
		{"stdout stall not landed, lines lost and reordered", with(base(StdoutStall, true), func(r *Run) {
			r.Hash, r.NotLanded, r.MissingSteps, r.Reordered = ref, true, []int{7}, "rank 0's line of step 6 after that of step 8"
		}), Failed, []string{"no-output-lost", "no-output-lost"}},
		{"stdout stall, all lines", with(base(StdoutStall, true), func(r *Run) { r.Hash = ref }), Survived, nil},
		{"refused", with(base(HostKill, false), func(r *Run) { r.Refused, r.RefCode, r.RefHash = true, 2, "" }), Refused, nil},
		{"reference failed", with(base(RankKill, true), func(r *Run) { r.RefCode, r.RefHash = 1, "" }), Failed, []string{"reference-runs"}},
		{"not injected", with(base(RankKill, true), func(r *Run) { r.NotInjected, r.Hash = "the job ended first", ref }), NotInjected, nil},
		{"not injected, wrong hash", with(base(RankKill, true), func(r *Run) { r.NotInjected, r.Hash = "the job ended first", other }), Failed, []string{"unfaulted-run"}},
		// Review findings F1, F9: a refused configuration's run is still
		// checked for leaks and hangs, and a refusal the precheck did not
		// predict (or a prediction gorun did not follow) fails.
		{"refused, with leaks", with(base(HostKill, false), func(r *Run) {
			r.Refused, r.RefCode, r.RefHash, r.Leaks = true, 2, "", []string{"failure-free run: left behind: /tmp/gorun-x-1.agent"}
		}), Failed, []string{"no-leaks"}},
		{"refused, hung reference", with(base(HostKill, false), func(r *Run) {
			r.Refused, r.RefCode, r.RefHash, r.Hung = true, 2, "", "the failure-free run: the launcher outlived every process of its job by 30s"
		}), Failed, []string{"launcher-exits"}},
		{"hung reference", with(base(HostKill, true), func(r *Run) {
			r.RefCode, r.RefHash, r.Hung = 2, "", "the failure-free run: gorun ran past 3m0s"
		}), Failed, []string{"launcher-exits", "reference-runs"}},
		{"refused, not predicted", with(base(HostKill, false), func(r *Run) {
			r.Refused, r.RefCode, r.RefHash, r.Mismatch = true, 2, "", `the precheck said "", gorun exited 2`
		}), Failed, []string{"refusal-predicted"}},
		{"accepted, predicted refused", with(base(RankKill, false), func(r *Run) {
			r.Hash, r.Mismatch = ref, `the precheck said "too few spares", gorun exited 0`
		}), Failed, []string{"refusal-predicted"}},
		// F2: a fault that was not injected leaves a failure-free run,
		// which must end as one; an injection that failed otherwise fails.
		{"not injected, exit 1", with(base(RankKill, true), func(r *Run) { r.NotInjected, r.Code = "the job ended first", 1 }), Failed, []string{"unfaulted-run"}},
		{"not injected, no hash", with(base(HostKill, false), func(r *Run) { r.NotInjected = "the job ended first" }), Failed, []string{"unfaulted-run"}},
		{"injection failed", with(base(Resume, true), func(r *Run) { r.InjectErr, r.Hash = "chaos: no committed version in /d within 60s", ref }), Failed, []string{"fault-injected"}},
		// F6: a fault gorun never saw is not survived.
		{"not landed", with(base(RankKill, true), func(r *Run) { r.NotLanded, r.Hash = true, ref }), NotLanded, nil},
		{"not landed, exit 1", with(base(Partition, true), func(r *Run) { r.NotLanded, r.Code, r.Reported = true, 1, "x" }), Failed, []string{"unfaulted-run"}},
		// F5: a report is the exit record's reason, nothing else.
		{"beyond, exit 1, a panic on stderr only", with(base(TwoHosts, false), func(r *Run) {
			r.Code, r.StderrTail = 1, "panic: runtime error: index out of range [3] with length 3"
		}), Failed, []string{"beyond-reported"}},
		// A known defect hides nothing else: another workload, an exit 0.
		{"known defect's signature, another workload", with(base(DuringRecovery, true), func(r *Run) {
			r.Config.Workload, r.Code, r.Reported = Dptrain, 1, "called MPI_Abort"
			r.Stderr = "MPIDU_Init_shm_init: unable to allocate shared memory\n"
		}), Failed, []string{"within-exit-0"}},
		{"known defect's signature, exit 0 with a wrong hash", with(base(SlotFlip, true), func(r *Run) {
			r.Hash, r.Flipped, r.Detected = other, true, true
			r.Stderr = "no coded base at or before step 9 (H is -1)\n"
		}), Failed, []string{"within-equal-hash"}},
		{"known defect's signature, not injected, exit 1", with(base(SlotFlip, true), func(r *Run) {
			r.NotInjected, r.Code = "the job ended first", 1
			r.Stderr = "(H is -1)\n"
		}), Failed, []string{"unfaulted-run"}},
		// Round 2, #1: SIGUSR1 must reach the ranks: pytrain's die of it;
		// dptrain's and MPICH's note it and go on (issue 21: every dptrain
		// run with all ranks' lines failed, no rank exit naming it).
		{"usr1 forwarded, pytrain", with(usr1(Pytrain, 2, 1), func(r *Run) { r.Hash, r.Forwarded = ref, true }), Survived, nil},
		{"usr1 not forwarded, pytrain", with(usr1(Pytrain, 2, 1), func(r *Run) { r.Hash = ref }), Failed, []string{"usr1-forwarded"}},
		{"usr1 noted by every rank, dptrain", with(usr1(Dptrain, 2, 2), func(r *Run) { r.Hash, r.Noticed = ref, []int{0, 1, 2, 3} }), Survived, nil},
		{"usr1 noted by some ranks, dptrain", with(usr1(Dptrain, 2, 2), func(r *Run) { r.Hash, r.Noticed = ref, []int{0, 1} }), Failed, []string{"usr1-forwarded"}},
		{"usr1 noted by none, dptrain, a rank killed by it", with(usr1(Dptrain, 2, 1), func(r *Run) { r.Hash, r.Forwarded = ref, true }), Failed, []string{"usr1-forwarded"}},
		{"usr1 noted by every rank, MPICH", with(usr1(MPICH, 3, 2), func(r *Run) { r.Hash, r.Noticed = ref, []int{0, 1, 2, 3, 4, 5} }), Survived, nil},
		{"usr1 noted by none, MPICH", with(usr1(MPICH, 3, 2), func(r *Run) { r.Hash = ref }), Failed, []string{"usr1-forwarded"}},
		// #2: a corrupt base detected must stop the job.
		{"corrupt base detected, exit 0", with(base(CkptFlip, false), func(r *Run) {
			r.Fault.Rank, r.Flipped, r.Detected, r.Hash = 3, true, true, ref
		}), Failed, []string{"corrupt-base-named"}},
		// #4: a run whose faulty job never ran is judged no further.
		{"mismatch, the faulty job never ran", with(base(RankKill, false), func(r *Run) {
			r.Mismatch, r.NotRun = `the precheck said "too few spares", gorun exited 0`, "the failure-free run disagreed with the precheck"
		}), Failed, []string{"refusal-predicted"}},
		{"the faulty job did not start", with(base(RankKill, true), func(r *Run) {
			r.InjectErr, r.NotRun = "fork/exec gorun: no such file", "starting it: fork/exec gorun: no such file"
		}), Failed, []string{"fault-injected"}},
		{"skipped", with(base(RankKill, true), func(r *Run) { r.Skipped, r.RefHash = "no python3", "" }), Skipped, nil},
		// replica-flip (replflip.go).
		{"replica flip, a good copy left", with(base(ReplicaFlip, true), func(r *Run) { r.Hash, r.Flipped = ref, true }), Survived, nil},
		{"replica flip, only copy, refused for its CRC", with(flipOnly, func(r *Run) {
			r.Code, r.Flipped, r.Reported = 1, true, "rank 2 on h2: state not restored"
			r.Stderr = `rank 2: step 7: not here, and not from other hosts: holder rank 1: region "optimizer" of step 7: CRC32C 1a2b3c4d, want 5e6f7a8b` + "\n"
		}), Reported, nil},
		{"replica flip, only copy, stopped for another cause", with(flipOnly, func(r *Run) { r.Code, r.Flipped, r.Reported = 1, true, "rank 2 exited 1" }), Failed, []string{"replica-flip-reported"}},
		{"replica flip, only copy, restored silently", with(flipOnly, func(r *Run) { r.Flipped, r.Hash = true, ref }), Failed, []string{"replica-flip-detected"}},
		{"replica flip, only copy, restored with a wrong hash", with(flipOnly, func(r *Run) { r.Flipped, r.Hash = true, other }), Failed, []string{"never-wrong-hash", "replica-flip-detected"}},
		{"replica flip, only copy, rolled back from disk", with(flipOnly, func(r *Run) { r.Config.Durable, r.Flipped, r.Hash = true, true, ref }), SurvivedBeyond, nil},
		{"replica flip that hit nothing, host loss reported", with(base(ReplicaFlip, false), func(r *Run) { r.Code, r.Reported = 1, "no spare" }), Reported, nil},
		{"replica flip, no spare, host loss reported", with(base(ReplicaFlip, false), func(r *Run) {
			r.Code, r.Flipped, r.Reported, r.Promise = 1, true, "host h1 lost: no spare host is left", "README, --spares / --on-no-spare: 1 hosts lost, 0 spares, no free slots"
		}), Reported, nil},
	}
	for _, c := range gpuJudgeCases() {
		tests = append(tests, c)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Judge(tt.run)
			var rules []string
			for _, f := range v.Failures {
				rule, _, _ := strings.Cut(f, ":")
				rules = append(rules, rule)
			}
			if v.Class != tt.class || !slices.Equal(rules, tt.rules) {
				t.Errorf("Judge = %s %q, want %s with rules %v", v.Class, v.Failures, tt.class, tt.rules)
			}
		})
	}
	// Every rule is covered by some case, and every rule a case names
	// exists.
	covered := map[string]bool{}
	for _, tt := range tests {
		for _, r := range tt.rules {
			covered[r] = true
		}
	}
	for _, r := range Rules {
		if !covered[r.Name] {
			t.Errorf("rule %s is covered by no case", r.Name)
		}
		delete(covered, r.Name)
	}
	for r := range covered {
		t.Errorf("cases name rule %s, which Rules does not list", r)
	}
}

// TestDrawReproducible: a run's configuration and fault depend on the
// seed and its index alone, and Precheck's refusals are what the drawn
// configurations meant.
func TestDrawReproducible(t *testing.T) {
	for i := range 50 {
		c1, f1 := Draw(7, i, nil)
		c2, f2 := Draw(7, i, nil)
		if c1 != c2 || f1 != f2 {
			t.Fatalf("run %d drew %v %v, then %v %v", i, c1, f1, c2, f2)
		}
		if f1.Host < 0 || f1.Host >= c1.Hosts || f1.Host2 >= c1.Hosts || f1.Host2 == f1.Host {
			t.Errorf("run %d: fault %v outside the %d work hosts", i, f1, c1.Hosts)
		}
		if f1.Rank >= c1.NP() || (f1.Rank >= 0 && f1.Rank/c1.RanksPerHost != f1.Host) {
			t.Errorf("run %d: fault %v: rank not on its host (%d per host)", i, f1, c1.RanksPerHost)
		}
	}
	_, f := Draw(7, 3, []Kind{SlotFlip})
	if f.Kind != SlotFlip {
		t.Errorf("Draw with kinds [slot-flip] drew %s", f.Kind)
	}
}

// TestRefusal: only an exit 2 with gorun's own line, neither hung nor
// panicking, is a refusal (F1: a SIGQUIT's dump or a rank's panic exits
// 2 too).
func TestRefusal(t *testing.T) {
	tests := []struct {
		name   string
		code   int
		hung   string
		stderr string
		want   bool
	}{
		{"usage", 2, "", "gorun: --spares 3: only 2 hosts\nRun 'gorun --help' for usage.\n", true},
		{"refusal after -v lines", 2, "", "gorun: listening on 10.0.0.1:4000\ngorun: --resume: no committed version in /d\nRun 'gorun --help' for usage.\n", true},
		// Round 2, #8: a rank's exit status 2 is gorun's status, no refusal.
		{"a rank exited 2", 2, "", "gorun: rank 0 on h0 exited with status 2\n", false},
		{"hung (SIGQUIT)", 2, "gorun ran past 3m0s", "gorun: x\nSIGQUIT: quit\nPC=0x0\n\ngoroutine 1 [running]:\n", false},
		{"a rank's panic", 2, "", "gorun: rank 0 exited 2\n[0] panic: runtime error\n\ngoroutine 1 [running]:\n", false},
		{"exit 1", 1, "", "gorun: rank 1 failed\n", false},
		{"exit 2 without a word of gorun's", 2, "", "usage: mpisteps STEPS MS\n", false},
	}
	for _, tt := range tests {
		if got := refusal(tt.code, tt.hung, tt.stderr); got != tt.want {
			t.Errorf("%s: refusal = %v, want %v", tt.name, got, tt.want)
		}
	}
	// The precheck's reason and gorun's (seen: SEED=2026's runs).
	reasons := []struct {
		predicted, stderr string
		want              bool
	}{
		{"topology: replica placement: data-parallel group 0 (ranks 0,1) spans 1 host; 1 replicas on other hosts need 2",
			"gorun: --replicas 1: topology: replica placement: data-parallel group 0 (ranks 0,1) spans 1 host; 1 replicas on other hosts need 2\nRun 'gorun --help' for usage.", true},
		{`topology: erasure-coding groups: group 0 has 8 ranks on hosts "h0" (2), "h1" (2): not a multiple of K`,
			`gorun: --redundancy ec:3+1: group 0 has 8 ranks on hosts "h0" (2), "h1" (2): not a multiple of K` + "\nRun 'gorun --help' for usage.", true},
		{"topology: replica placement: data-parallel group 0 (ranks 0,1) spans 1 host; 1 replicas on other hosts need 2",
			"gorun: --spares 2: the 2 spare hosts leave 2 slots for -np 4 ranks\nRun 'gorun --help' for usage.", false},
	}
	for _, tt := range reasons {
		if got := sameReason(tt.predicted, tt.stderr); got != tt.want {
			t.Errorf("sameReason(%q, %q) = %v, want %v", tt.predicted, tt.stderr, got, tt.want)
		}
	}
}

// TestReportOf: the report is the exit record's reason; standard error's
// last line is none (F5).
func TestReportOf(t *testing.T) {
	exit := func(code int, reason string) events.Record {
		return events.Record{Event: events.Exit{Code: code, Reason: reason}}
	}
	if got := reportOf(nil); got != "" {
		t.Errorf("reportOf(no records) = %q, want none", got)
	}
	if got := reportOf([]events.Record{exit(1, "rank 3 on h1: killed by SIGKILL")}); got != "rank 3 on h1: killed by SIGKILL" {
		t.Errorf("reportOf = %q", got)
	}
	if got := reportOf([]events.Record{exit(0, "")}); got != "" {
		t.Errorf("reportOf(exit 0) = %q, want none", got)
	}
}

// TestWithinLost: during-recovery whose second kill never happened is
// judged on the one host lost (F3): hosts 3, one spare, replicas:1
// survive one loss, not two.
func TestWithinLost(t *testing.T) {
	c := Config{Workload: Dptrain, Hosts: 3, Spares: 1, RanksPerHost: 1, TP: 1, PP: 1, Redundancy: "replicas:1",
		Recovery: "restart", Protect: "full", Params: "4096", Steps: 30, Seed: 1}
	names := []string{"h0", "h1", "h2", "h3"}
	p := Precheck(c, names)
	if p.Err != nil {
		t.Fatalf("Precheck: %v", p.Err)
	}
	f := Fault{Kind: DuringRecovery, Host: 0, Host2: 1, Rank: -1, After: 5}
	if in, why := Within(f, []int{0}, p, c, false); !in {
		t.Errorf("one host lost: beyond (%s), want within", why)
	}
	if in, _ := Within(f, f.Lost(), p, c, false); in {
		t.Errorf("two hosts lost with one spare: within, want beyond")
	}
}

// TestFailureSeen: a host fault landed only when every lost host was
// seen lost (round 2, #3); a rank-stop's hang record of another rank
// counts only after the stop (#6); SIGUSR1 is seen in a rank's exit (#1).
func TestFailureSeen(t *testing.T) {
	hosts := []string{"h0", "h1", "h2"}
	fail := func(at float64, host string, rank int, what string) events.Record {
		return events.Record{T: at, Event: events.Failure{Host: host, Rank: rank, What: what}}
	}
	fence := func(at float64, host string) events.Record {
		return events.Record{T: at, Event: events.Fence{Host: host}}
	}
	two := Fault{Kind: TwoHosts, Host: 0, Host2: 1, Rank: -1}
	stop := Fault{Kind: RankStop, Host: 0, Host2: -1, Rank: 0}
	tests := []struct {
		name string
		f    Fault
		lost []int
		recs []events.Record
		want bool
	}{
		{"two hosts, both lost", two, []int{0, 1}, []events.Record{fail(5, "h0", -1, events.FailHostLost), fence(6, "h1")}, true},
		{"two hosts, only the first seen", two, []int{0, 1}, []events.Record{fail(5, "h0", -1, events.FailHostLost), fence(6, "h0")}, false},
		{"two hosts, the second never killed", two, []int{0}, []events.Record{fail(5, "h0", -1, events.FailHostLost)}, true},
		{"rank stop, its hang", stop, nil, []events.Record{fail(9, "h0", 0, events.FailHang)}, true},
		{"rank stop, a peer's hang after it", stop, nil, []events.Record{fail(9, "h1", 1, events.FailHang)}, true},
		{"rank stop, a peer's hang before it", stop, nil, []events.Record{fail(2, "h1", 1, events.FailHang)}, false},
		{"rank kill, another rank", Fault{Kind: RankKill, Host: 0, Host2: -1, Rank: 0}, nil, []events.Record{fail(9, "h1", 1, events.FailRankExit)}, false},
	}
	for _, tt := range tests {
		if got := failureSeen(tt.recs, hosts, tt.f, tt.lost, 4); got != tt.want {
			t.Errorf("%s: failureSeen = %v, want %v", tt.name, got, tt.want)
		}
	}
	usr1 := events.Record{T: 5, Event: events.Failure{Host: "h1", Rank: 2, What: events.FailRankExit, Signal: "SIGUSR1"}}
	kill := events.Record{T: 5, Event: events.Failure{Host: "h1", Rank: 2, What: events.FailRankExit, Signal: "SIGKILL"}}
	if !signalSeen([]events.Record{kill, usr1}, "SIGUSR1") || signalSeen([]events.Record{kill}, "SIGUSR1") {
		t.Errorf("signalSeen: want SIGUSR1 seen in a rank's exit record, and only there")
	}
}

// TestNoticedRanks reads the ranks' SIGUSR1 lines from gorun's standard
// error as it prefixes them, each rank once, none beyond the world.
func TestNoticedRanks(t *testing.T) {
	stderr := "[1] dptrain: rank 1: got SIGUSR1 at step 4 (a preemption notice); going on\n" +
		"gorun: forwarding SIGUSR1\n" +
		"[0] dptrain: rank 0: got SIGUSR1 at step 5 (a preemption notice); going on\n" +
		"[1] dptrain: rank 1: got SIGUSR1 at step 9 (a preemption notice); going on\n" +
		"[2] mpisteps: rank 2: got SIGUSR1 at step 3 (a preemption notice); going on\n" +
		"[7] dptrain: rank 7: got SIGUSR1 at step 3 (a preemption notice); going on\n"
	if got := noticedRanks(stderr, 4); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("noticedRanks = %v, want [0 1 2]", got)
	}
	if got := noticedRanks("[0] step 3 loss 1\n", 4); got != nil {
		t.Errorf("noticedRanks without a line = %v, want none", got)
	}
}

// TestSummarizeNotRun: runs that injected nothing are not counted as
// injected (round 2, #4): a faulty job that never ran, an injection
// that failed.
func TestSummarizeNotRun(t *testing.T) {
	f := Fault{Kind: RankKill, Host2: -1}
	runs := []Run{
		{Fault: f, RefCode: 1, NotRun: "the failure-free run failed"},
		{Fault: f, RefHash: "x", Mismatch: "m", NotRun: "disagreed with the precheck"},
		{Fault: f, RefHash: "x", Within: true, InjectErr: "no such process"},
		{Fault: f, RefHash: "x", Within: true, Hash: "x"},
	}
	var vs []Verdict
	for _, r := range runs {
		vs = append(vs, Judge(r))
	}
	s := Summarize(1, "", runs, vs, 0)
	if got := s.Total; got.Injected != 1 || got.NotRun != 2 || got.InjectFailed != 1 || got.NotLanded != 0 || got.Beyond != 0 {
		t.Errorf("Summarize: injected %d, not-run %d, inject-failed %d, not-landed %d, beyond %d; want 1, 2, 1, 0, 0",
			got.Injected, got.NotRun, got.InjectFailed, got.NotLanded, got.Beyond)
	}
}

// TestOrphaned: slot files are gorun clean's to remove when every host
// with ranks was SIGKILLed and no live spare took ranks (round-2 review
// #5: a spare that took them claims the job, and its release must remove
// them); everything is when every agent was.
func TestOrphaned(t *testing.T) {
	hosts := []string{"h0", "h1", "s0"}
	splice := func(with string) events.Record {
		return events.Record{T: 3, Event: events.Splice{Epoch: 1, Lost: "h0", With: with, Ranks: []int{0}, Spare: true}}
	}
	tests := []struct {
		name              string
		crashed           []int
		recs              []events.Record
		everyAgent, slots bool
	}{
		{"one work host", []int{0}, nil, false, false},
		{"every work host, no splice", []int{0, 1}, nil, false, true},
		{"every work host, a spare took ranks", []int{0, 1}, []events.Record{splice("s0")}, false, false},
		{"every host, the spare killed after it took ranks", []int{0, 1, 2}, []events.Record{splice("s0")}, true, true},
	}
	for _, tt := range tests {
		every, slots := orphaned(hosts, 2, tt.crashed, tt.recs)
		if every != tt.everyAgent || slots != tt.slots {
			t.Errorf("%s: orphaned = %v, %v; want %v, %v", tt.name, every, slots, tt.everyAgent, tt.slots)
		}
	}
}

// TestFlippedSteps reads flipSlots' notes: the steps of the slots that
// stayed committed after their flip.
func TestFlippedSteps(t *testing.T) {
	for _, tc := range []struct {
		note string
		want []int64
	}{
		{"SIGSTOP pid 7; flipped byte 3 of slot 0 (committed step 40, still committed after: true); SIGKILL", []int64{40}},
		{"SIGSTOP pid 7; flipped byte 3 of slot 0 (committed step 40, still committed after: true); flipped byte 3 of slot 1 (committed step 41, still committed after: true); SIGKILL", []int64{40, 41}},
		{"SIGSTOP pid 7; flipped byte 3 of slot 1 (committed step 41, still committed after: false); SIGKILL", nil},
		{"SIGSTOP pid 7; SIGKILL", nil},
	} {
		if got := flippedSteps(tc.note); !slices.Equal(got, tc.want) {
			t.Errorf("flippedSteps(%q) = %v, want %v", tc.note, got, tc.want)
		}
	}
}
