package chaos

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The replica-flip fault (ReplicaFlip): a byte flipped in every complete
// replica a drawn host (Fault.Host, the holder) keeps for other ranks,
// then the host whose ranks' replicas it holds (Fault.Host2, the owner)
// lost. The harness cannot reach an agent's memory: every job runs with
// GORUN_DEBUG_FLIP_REPLICAS naming a file in its run's directory
// (internal/agent/debugflip.go, a debugging aid), and the holder's agent,
// sent SIGUSR2, flips its replicas (keeper.Keeper.FlipReplicas) and writes a
// line per buffer it flipped, then "done HOST N".

// flipEnv is the agents' debugging hook (internal/agent's debugFlipEnv).
const flipEnv = "GORUN_DEBUG_FLIP_REPLICAS"

// flipAckWithin bounds the wait for the agent's "done" line.
const flipAckWithin = 10 * time.Second

// replicaFlipApplies reports whether ReplicaFlip can hit a job of c: its
// replicas must be whole buffers (replicas:K, K ≥ 1, --protect-mode
// full; diff mode's bases and logs and erasure coding's chunks are not
// flipped: keeper.ErrFlipMode), and the workload must protect state (not
// MPICH).
func replicaFlipApplies(c Config) bool {
	k, ok := strings.CutPrefix(c.Redundancy, "replicas:")
	n, err := strconv.Atoi(k)
	return ok && err == nil && n >= 1 && c.Protect == "full" && c.Workload != MPICH
}

// replicaOwner sets ReplicaFlip's lost host (f.Host2) from the plan: the
// host of the lowest rank not on the holder f.Host whose replicas a rank
// of f.Host holds (topology.Place's holders, as the launcher places
// them). Other kinds, a refused configuration, or a holder holding
// nothing of another host's ranks leave f as it is (Host2 -1: the fault
// then lands on nothing).
func replicaOwner(f Fault, p Plan) Fault {
	if f.Kind != ReplicaFlip || p.Err != nil {
		return f
	}
	for r, h := range p.HostOf {
		if h != f.Host && heldOn(p, r, f.Host) {
			f.Host2 = h
			return f
		}
	}
	return f
}

// heldOn reports whether a replica holder of rank r is on host, by plan
// p.
func heldOn(p Plan, r, host int) bool {
	return heldWhere(p, r, func(h int) bool { return h == host })
}

// heldWhere reports whether a replica holder of rank r is on a host for
// which on holds, by plan p.
func heldWhere(p Plan, r int, on func(host int) bool) bool {
	return r < len(p.Holders) && slices.ContainsFunc(p.Holders[r], func(x int) bool { return on(p.HostOf[x]) })
}

// replicaFlip injects ReplicaFlip: the owner host f.Host2 frozen (its
// ranks send no newer step that would replace a flipped buffer), the
// holder f.Host's agent sent SIGUSR2, its "done" line awaited, then every
// process of the owner host killed (as HostKill). Whatever fails once the
// owner is frozen, it is killed: a frozen host is a fault not drawn. An
// owner's replica the agent could not lock in time (a request holds it:
// a "busy HOST OWNER" line), or no "done" line within flipAckWithin,
// is a flip that did not land (flippedEvery; ErrNotLanded); the job
// ending first is ErrJobEnded.
func (in *injector) replicaFlip(j *Job, f Fault, out injected) (res injected, err error) {
	out.lost, out.crashed = nil, nil
	if f.Host2 < 0 {
		return out, fmt.Errorf("%w: host %d holds no replica of another host's rank", ErrNotLanded, f.Host)
	}
	ps, err := j.hostProcs(f.Host)
	if err != nil {
		return out, err
	}
	agent := -1
	for _, p := range ps {
		if p.isAgent() {
			if !p.hasEnv(flipEnv + "=" + j.Flips) {
				return out, fmt.Errorf("chaos: the agent of host %s (pid %d) has no %s=%s in its environment", j.Hosts[f.Host], p.pid, flipEnv, j.Flips)
			}
			agent = p.pid
		}
	}
	if agent < 0 {
		return out, fmt.Errorf("chaos: no agent in host %s", j.Hosts[f.Host])
	}
	before := readFlips(j.Flips)
	if err := in.hosts.StopAll(f.Host2); err != nil {
		return out, err
	}
	out.lost, out.crashed = []int{f.Host2}, []int{f.Host2}
	out.note = "StopAll " + j.Hosts[f.Host2]
	defer func() {
		kerr := in.hosts.KillAll(f.Host2)
		res.note += "; KillAll " + j.Hosts[f.Host2]
		if err == nil {
			err = kerr
		}
	}()
	if err := signal(agent, syscall.SIGUSR2); err != nil {
		return out, err
	}
	out.note += fmt.Sprintf("; SIGUSR2 agent pid %d of %s", agent, j.Hosts[f.Host])
	lines, err := awaitFlip(j, f.Host, len(before), flipAckWithin)
	if len(lines) > 0 {
		out.note += "; " + strings.Join(lines, "; ")
	}
	return out, err
}

// awaitFlip waits up to within for host's agent's "done" (or "refused")
// line in j.Flips after its first skip lines, and returns the lines
// after those: ErrJobEnded when the job ends first, ErrNotLanded when
// within passes (the agent bounds its own wait for busy replicas: no line
// at all is a flip not known to have happened).
func awaitFlip(j *Job, host, skip int, within time.Duration) ([]string, error) {
	deadline := time.Now().Add(within)
	for {
		lines := readFlips(j.Flips)
		lines = lines[min(skip, len(lines)):]
		if slices.ContainsFunc(lines, func(l string) bool {
			return strings.HasPrefix(l, fmt.Sprintf("done %d ", host)) || strings.HasPrefix(l, fmt.Sprintf("refused %d:", host))
		}) {
			return lines, nil
		}
		if j.Exited() {
			return lines, fmt.Errorf("%w: waiting for the agent of host %s to flip its replicas", ErrJobEnded, j.Hosts[host])
		}
		if time.Now().After(deadline) {
			return lines, fmt.Errorf("%w: the agent of host %s wrote no done line to %s within %v", ErrNotLanded, j.Hosts[host], j.Flips, within)
		}
		select {
		case <-j.done:
		case <-time.After(pollEvery):
		}
	}
}

// flipLine is one line of the agent's: "flipped HOST OWNER STEP REGION".
// An owner it could not flip wholly is named in "busy HOST OWNER" (as
// well, when it flipped one buffer and a get was sending the other), so
// flippedEvery counts it as not flipped.
var (
	flipLine = regexp.MustCompile(`^flipped (\d+) (\d+) (\d+) \S+$`)
	busyLine = regexp.MustCompile(`^busy (\d+) (\d+)$`)
)

// flippedEvery reports whether lines (the agents' of one flip, in the
// fault's note: Run.Flipped) show a
// flipped buffer of every rank on f.Host2 that a rank of f.Host holds,
// by plan p.
func flippedEvery(lines []string, f Fault, p Plan) bool {
	flipped, busy := map[int]bool{}, map[int]bool{}
	for _, l := range lines {
		if m := flipLine.FindStringSubmatch(l); m != nil && m[1] == strconv.Itoa(f.Host) {
			owner, _ := strconv.Atoi(m[2])
			flipped[owner] = true
		}
		if m := busyLine.FindStringSubmatch(l); m != nil && m[1] == strconv.Itoa(f.Host) {
			owner, _ := strconv.Atoi(m[2])
			busy[owner] = true
		}
	}
	n := 0
	for r, h := range p.HostOf {
		if h != f.Host2 || !heldOn(p, r, f.Host) {
			continue
		}
		if !flipped[r] || busy[r] {
			return false
		}
		n++
	}
	return n > 0
}

// readFlips returns the lines of the agents' flip file (none when it
// does not exist yet).
func readFlips(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")[:strings.Count(string(b), "\n")]
}

// withinReplicaFlip is ReplicaFlip's promise, flipped saying whether the
// flip hit the lost host's ranks' replicas the holder keeps: each of
// them survives if a holder on neither the lost host nor the flipped one
// has its copy (README, --redundancy: "replicas:K: whole copies on K
// other hosts"; a restore checks every region against the owner's
// CRC32C and takes another holder's copy: internal/keeper/restore.go). A rank whose
// only copies left are the flipped ones survives too when the durable
// tier had a version committed at injection (durable): its restore
// reports the copies corrupt, the launcher counts them lost, and the job
// rolls back to that version (README, recovery: --ckpt-dir). Without
// one (no --ckpt-dir, or nothing committed yet: a commit may still come
// before the restore, as gpu-fault's replaceEither) it is beyond the
// promise: reported, never a wrong hash. A flip that hit nothing leaves
// a host lost.
func withinReplicaFlip(f Fault, lost []int, p Plan, c Config, durable, flipped bool) (bool, string) {
	if p.Err != nil {
		return false, "gorun refuses the configuration"
	}
	if !flipped {
		ok, why := Within(Fault{Kind: HostKill, Host: f.Host2, Host2: -1, Rank: -1}, lost, p, c, durable)
		return ok, "the flip hit no replica of the lost host's ranks: a host lost; " + why
	}
	if !p.Replaceable(len(lost)) {
		return false, fmt.Sprintf(`README, --spares / --on-no-spare: %d hosts lost, %d spares, no free slots`, len(lost), p.Spares)
	}
	for r, h := range p.HostOf {
		if !slices.Contains(lost, h) {
			continue
		}
		good := heldWhere(p, r, func(x int) bool { return !slices.Contains(lost, x) && x != f.Host })
		if !good && c.Durable && durable {
			return true, fmt.Sprintf(`README, recovery: rank %d's only copies left are flipped on host %d, and --ckpt-dir had a committed version at injection: the restore reports the copies corrupt (CRC32C) and the job rolls back to that version`, r, f.Host)
		}
		if !good {
			return false, fmt.Sprintf("rank %d's %s on host %d: beyond the promise (reported, never a wrong hash)", r, onlyFlipped, f.Host)
		}
	}
	return true, fmt.Sprintf(`README, --redundancy %s: "whole copies on K other hosts", and Protecting training state: the holders "check the CRCs"; a restore checks every region against the owner's CRC32C (internal/keeper/restore.go) and takes a good copy from another holder`, c.Redundancy)
}

// onlyFlipped is in a ReplicaFlip run's Promise when it is beyond the
// promise for the flip (not for a want of spares): replicaFlipRules
// apply to such runs only.
const onlyFlipped = "only copies left are the ones flipped"

// replicaFlipRules are the oracle's rules of ReplicaFlip (in Rules).
var replicaFlipRules = [2]Rule{
	{"replica-flip-detected", `README, Chaos testing: "A flipped slot, replica or base is detected (its CRC32C), never restored silently"; internal/keeper/restore.go: a copy's regions are checked against the owner's CRC32Cs (fillRegion, internal/keeper/holderget.go) — with the flipped copies the only ones left and no durable tier, an exit 0 restored them`},
	{"replica-flip-reported", `README, Exit code: "... with a one-line report naming the rank, its host and the cause": a restore refused for the flipped copies fails with the CRC32C mismatch (rank's "CRC32C X, want Y"), never for another cause`},
}

// crcMismatchRE is a restore's refusal of a copy that fails its CRC32C
// (internal/keeper's fillRegion).
var crcMismatchRE = regexp.MustCompile(`CRC32C [0-9a-f]{8}, want [0-9a-f]{8}`)

// judgeReplicaFlip applies replicaFlipRules to r (Judge's fail): a run
// whose flip landed and left a rank of the lost host only flipped copies
// (its Promise says so: withinReplicaFlip).
func judgeReplicaFlip(r Run, fail func(rule, format string, args ...any)) {
	if r.Fault.Kind != ReplicaFlip || !r.Flipped || r.Within || !strings.Contains(r.Promise, onlyFlipped) {
		return
	}
	if r.Code == 0 && !r.Config.Durable {
		fail("replica-flip-detected", "the only copies of a rank of host %d were flipped on host %d, there is no durable tier, and the job exited 0: it restored a flipped replica", r.Fault.Host2, r.Fault.Host)
	}
	if r.Code != 0 && !crcMismatchRE.MatchString(r.Stderr) && !crcMismatchRE.MatchString(r.Reported) {
		fail("replica-flip-reported", "exit %d, and no line of gorun's names the flipped replica's CRC32C mismatch; it reported %q", r.Code, r.Reported)
	}
}
