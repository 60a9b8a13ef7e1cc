package launcher

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/wire"
)

// The durable tier (gorun --ckpt-dir; package durable, DESIGN.md §5
// "Persistent tier", issue 17), the launcher's part of it:
//
//   - at the start, the directory is checked (it exists and is writable)
//     and must not hold another job's checkpoints unless the job resumes
//     them (--resume): nothing of it is ever overwritten;
//   - the job's manifest is written once every rank has reported its
//     regions (the ranks declare them when they first protect their state:
//     the launcher cannot know them before), and before any commit;
//   - the two-phase commit (TierCheck), the launcher deciding every base
//     step (package durable, "Committing and abandoning"): each rank
//     reports its markers and its resolved step S_r (every save of a
//     step at or before it has ended, and its markers there are final);
//     X is the minimum of the S_r and of G, never moving back. Of the
//     steps after the commit record and after the X published before, at
//     or below X, the newest every rank reports a marker of is committed
//     (durable.Commit); every other step at or below X is abandoned for
//     good, and no step at or below a published X is committed later. The
//     launcher publishes the commit record's step D and X (GlobalStep.D
//     and X), on which the agents reclaim what is older than D and free
//     every version at or below X other than D's (keeper.Keeper.SetDurable):
//     a rank whose saves failed or were skipped where the others' were
//     not gets its base files back, and the tier never stalls for good.
//     Only steps at or below G: a recovery resumes from G and forgets
//     every rank's saves after it (internal/keeper/persist.go), so a commit past G
//     could name a version no rank keeps;
//   - at the end of the job the last decision is final (no report is
//     taken in once the ranks ended): the OpExit that ends the agents
//     carries D and X as last published (job.exitControl), and each
//     agent's host applies them to its stores before it closes them
//     (keeper.Keeper.Close, bounded; a host that cannot says what it
//     leaves), even if it never handled the G that carried them. So a
//     job that ends well leaves the final commit record and nothing
//     older it makes useless, and -v's footprint, printed after the
//     agents exited, is what stays;
//   - when G runs more than twice --ckpt-every ahead of the commit record,
//     it says so, at most every durableWarnEvery, with what the ranks
//     skipped and failed; with -v the end of the job reports every rank's
//     saves and the directory's footprint.
//   - In diff mode each rank also reports its differential log on disk's
//     counters (wire.RankDurable.Log): when a rank's log lost steps (a
//     full queue, a failed batch) since the last warning, the launcher
//     says how many, at most every durableWarnEvery (diffLogTick); -v's
//     report adds each rank's log steps written, dropped and failed.

// durableWarnEvery is how often at most the launcher says the durable
// tier is falling behind.
const durableWarnEvery = 30 * time.Second

// durableTier is the launcher's side of a job's durable tier, owned by
// the job's loop.
type durableTier struct {
	opts     DurableOptions
	manifest durable.Manifest // what the launcher knows (Regions once the ranks reported them)
	// written: the manifest is in the directory (written here, or the
	// resumed job's); no commit before.
	written   bool
	committed int64 // the commit record's step, or -1
	// x is the resolved step published (-1: none): every base step at
	// or below it is decided, committed or abandoned.
	x int64
	// errs are the manifest's and commit's last errors, said once each;
	// retry is when they are tried again (a full disk is not retried at
	// every report).
	manifestErr, commitErr string
	retry                  time.Time
	warned                 time.Time // the last falling-behind warning
	// logWarned is the last warning that a rank's differential log on
	// disk lost steps, and logLost the steps lost per rank it said (the
	// next warning says the ones lost since).
	logWarned time.Time
	logLost   map[int]int64
}

// durableRetry is how long the launcher waits after a failed manifest or
// commit record before it tries again.
const durableRetry = time.Second

// newDurableTier returns the durable tier of job j, or nil without one.
func (j *job) newDurableTier() *durableTier {
	o := j.cfg.Durable
	if o.Dir == "" {
		return nil
	}
	t := &durableTier{opts: o, committed: -1, x: -1, manifest: durable.Manifest{
		Job: j.id, World: j.world, Protect: string(modeOrFull(j.cfg.ProtectMode)), Every: o.Every, Command: commandHash(j.cfg.Prog, j.cfg.Args),
	}}
	if j.cfg.ProtectMode == ModeDiff {
		t.manifest.Codec = j.cfg.Diff.Codec
	}
	if o.Resume {
		// The resumed job's manifest and commit record (the resume checks
		// them): later commits only move the record forward.
		if _, err := durable.ReadManifest(o.Dir); err == nil {
			t.written = true
		}
		if c, err := durable.ReadCommitted(o.Dir); err == nil {
			t.committed = c
		}
	}
	return t
}

// commandHash is the manifest's command: the SHA-256 of the program and
// its arguments, each followed by a NUL byte, in hex.
func commandHash(prog string, args []string) string {
	h := sha256.New()
	for _, s := range append([]string{prog}, args...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// durableProgress takes the ranks' durable reports in after report u:
// the manifest once every rank's regions are known, then the decision of
// every base step up to X, the minimum of the ranks' resolved steps and
// of G: the commit of the newest one every rank has a marker of (after
// the record and the X before), the others abandoned; then D and X are
// published.
func (j *job) durableProgress(u *wire.UpProgress) {
	t := j.dur
	if t == nil || j.reach != nil {
		// (While a roll-back gathers the ranks' reach from the commit
		// record, the record stays.)
		return
	}
	news := false
	for _, r := range u.Ranks {
		if d := r.D; d != nil && (len(d.Regions) > 0 || len(d.Markers) > 0 && d.Markers[len(d.Markers)-1] > t.committed || d.Resolved > t.x) {
			news = true
		}
	}
	if !news || time.Now().Before(t.retry) {
		return
	}
	reports := make([]*wire.RankDurable, j.world)
	for r := range reports {
		reports[r] = j.prog.rank(r).D
	}
	if !t.written && !j.writeManifest(reports) {
		return
	}
	x := resolvedStep(reports, j.prog.G())
	if x <= t.x || x < t.committed {
		// Nothing decided that was not before (or, in a resumed job, X
		// is still below its commit record: D <= X is published).
		return
	}
	// The steps at or below an X published were decided then: only
	// later ones are committed.
	v := commitStep(reports, x, max(t.committed, t.x))
	if v >= 0 {
		if err := durable.Commit(t.opts.Dir, v); err != nil {
			// X is not published either: the ranks would free v.
			t.retry = time.Now().Add(durableRetry)
			if msg := err.Error(); msg != t.commitErr {
				t.commitErr = msg
				j.out.report("the durable tier cannot write its commit record of step %d: %v", v, err)
			}
			return
		}
		t.commitErr = ""
		t.committed = v
		j.log.Debug("durable tier: committed", "step", v)
		if j.m != nil { // (durable_test.go drives the tier without a machine)
			j.step(hotswap.DiskCommitted{Step: v})
		}
	}
	t.x = x
	d := &t.committed
	if t.committed < 0 {
		d = nil
	}
	j.prog.setDurable(d, t.x)
}

// resolvedStep returns X given every rank's durable report (by rank;
// nil: none yet) and G: the minimum of G and the ranks' resolved steps,
// or -1 if a rank has not reported.
func resolvedStep(reports []*wire.RankDurable, g int64) int64 {
	if len(reports) == 0 {
		return -1
	}
	x := g
	for _, d := range reports {
		if d == nil {
			return -1
		}
		x = min(x, d.Resolved)
	}
	return x
}

// writeManifest writes the job's manifest once reports (by rank) hold
// every rank's regions, and reports whether it is written.
func (j *job) writeManifest(reports []*wire.RankDurable) bool {
	t := j.dur
	regions := make([][]durable.Region, len(reports))
	for r, d := range reports {
		if d == nil || len(d.Regions) == 0 {
			return false
		}
		for _, x := range d.Regions {
			regions[r] = append(regions[r], durable.Region{Name: x.Name, Size: x.Size})
		}
	}
	m := t.manifest
	m.Regions = regions
	if err := durable.CreateManifest(t.opts.Dir, &m); err != nil {
		t.retry = time.Now().Add(durableRetry)
		if errors.Is(err, fs.ErrExist) {
			err = fmt.Errorf("another job wrote its manifest there since this one started: %w", err)
		}
		if msg := err.Error(); msg != t.manifestErr {
			t.manifestErr = msg
			j.out.report("the durable tier cannot write the job's manifest in %s, so it commits nothing: %v", t.opts.Dir, err)
		}
		return false
	}
	t.written, t.manifest = true, m
	j.log.Debug("durable tier: manifest written", "dir", t.opts.Dir)
	return true
}

// commitStep returns the step to commit given every rank's durable
// report (by rank; nil: none yet): the newest step after committed, at
// or below g, that every rank has a marker of; -1 if there is none.
// durableProgress passes X as g, and the newer of the commit record and
// the X published before as committed.
func commitStep(reports []*wire.RankDurable, g, committed int64) int64 {
	if len(reports) == 0 || reports[0] == nil {
		return -1
	}
	first := reports[0].Markers
	for i := len(first) - 1; i >= 0; i-- {
		v := first[i]
		if v <= committed {
			break
		}
		if v > g {
			continue
		}
		all := true
		for _, d := range reports[1:] {
			if d == nil {
				return -1
			}
			if _, found := slices.BinarySearch(d.Markers, v); !found {
				all = false
				break
			}
		}
		if all {
			return v
		}
	}
	return -1
}

// durableTick says, at most every durableWarnEvery, that the durable tier
// is falling behind: G more than twice --ckpt-every past the commit
// record.
func (j *job) durableTick(now time.Time) {
	t := j.dur
	if t == nil || !j.prog.used() {
		return
	}
	j.diffLogTick(now)
	if now.Sub(t.warned) < durableWarnEvery {
		return
	}
	g := j.prog.G()
	if g-t.committed <= 2*int64(t.opts.Every) {
		return
	}
	t.warned = now
	reports := make([]wire.RankProgress, j.world)
	for r := range reports {
		reports[r] = j.prog.rank(r)
	}
	j.out.report("%s", fallingBehind(g, t.committed, reports))
}

// diffLogTick says, at most every durableWarnEvery, which ranks'
// differential logs on disk (diff mode) lost steps since the last time it
// said so: each lost step is a gap the disk's reach (--resume, a roll-back
// to the durable tier) stops before until the next base is committed.
func (j *job) diffLogTick(now time.Time) {
	t := j.dur
	if now.Sub(t.logWarned) < durableWarnEvery {
		return
	}
	var parts []string
	for r := range j.world {
		d := j.prog.rank(r).D
		if d == nil || d.Log == nil {
			continue
		}
		if d.Log.Dropped < t.logLost[r] { // a new writer (the rank's service restarted): counts from 0
			t.logLost[r] = 0
		}
		if d.Log.Dropped == t.logLost[r] {
			continue
		}
		if t.logLost == nil {
			t.logLost = map[int]int64{}
		}
		parts = append(parts, diffLogLost(r, d.Log.Dropped-t.logLost[r], d.Log.LastErr, t.committed))
		t.logLost[r] = d.Log.Dropped
	}
	if len(parts) == 0 {
		return
	}
	t.logWarned = now
	for _, p := range parts {
		j.out.report("%s", p)
	}
}

// diffLogLost is the warning that rank's differential log on disk lost n
// steps (lastErr: its last write error, or empty), the commit record being
// at step committed (-1: none). The launcher does not know which steps
// were lost, only that the log stops being contiguous at the first.
func diffLogLost(rank int, n int64, lastErr string, committed int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "the differential log on disk lost %d steps of rank %d", n, rank)
	if lastErr != "" {
		fmt.Fprintf(&b, " (last error: %s)", lastErr)
	}
	if committed >= 0 {
		fmt.Fprintf(&b, ": --resume and a roll-back reach only up to its first lost step after the committed version step %d until the next base is committed", committed)
	} else {
		b.WriteString(": --resume and a roll-back reach only up to its first lost step until a base is committed")
	}
	return b.String()
}

// fallingBehind is the warning that the durable tier lags G: the commit
// record's step, how far behind G it is, and the ranks that skipped or
// failed the most bases (or have no store).
func fallingBehind(g, committed int64, ranks []wire.RankProgress) string {
	var b strings.Builder
	if committed < 0 {
		fmt.Fprintf(&b, "the durable tier is falling behind: no version committed yet, G is step %d", g)
	} else {
		fmt.Fprintf(&b, "the durable tier is falling behind: committed version step %d, %d steps behind G", committed, g-committed)
	}
	type lag struct {
		rank            int
		skipped, failed int64
		off             string
		noReport        bool
	}
	var lags []lag
	for _, r := range ranks {
		switch d := r.D; {
		case d == nil:
			lags = append(lags, lag{rank: r.Rank, noReport: true})
		case d.Off != "":
			lags = append(lags, lag{rank: r.Rank, off: d.Off})
		case d.Skipped+d.Failed > 0:
			lags = append(lags, lag{rank: r.Rank, skipped: d.Skipped, failed: d.Failed})
		}
	}
	slices.SortStableFunc(lags, func(a, b lag) int {
		wa, wb := a.skipped+a.failed, b.skipped+b.failed
		switch {
		case (a.off != "" || a.noReport) != (b.off != "" || b.noReport):
			if a.off != "" || a.noReport {
				return -1
			}
			return 1
		case wa != wb:
			if wa > wb {
				return -1
			}
			return 1
		}
		return 0
	})
	const most = 3
	var parts []string
	for _, l := range lags[:min(len(lags), most)] {
		switch {
		case l.noReport:
			parts = append(parts, fmt.Sprintf("rank %d has not opened its store", l.rank))
		case l.off != "":
			parts = append(parts, fmt.Sprintf("rank %d has no store: %s", l.rank, l.off))
		default:
			parts = append(parts, fmt.Sprintf("rank %d: %d bases skipped, %d failed", l.rank, l.skipped, l.failed))
		}
	}
	if len(lags) > most {
		parts = append(parts, fmt.Sprintf("and %d more", len(lags)-most))
	}
	if len(parts) == 0 {
		parts = append(parts, "no base skipped or failed: the saves are slow")
	}
	fmt.Fprintf(&b, " (%s)", strings.Join(parts, "; "))
	return b.String()
}

// durableTable describes the durable tier for -v at the end of the job:
// the commit record, per rank its saves, skipped and failed bases, write
// time and rate, and stages' wait for the saves; then the directory's
// footprint.
func (j *job) durableTable() string {
	t := j.dur
	var b strings.Builder
	fmt.Fprintf(&b, "durable tier: %s, a base every %d steps", t.opts.Dir, t.opts.Every)
	if t.committed >= 0 {
		fmt.Fprintf(&b, ", committed version step %d", t.committed)
	} else {
		b.WriteString(", no version committed")
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "  %6s %6s %8s %7s %12s %10s %12s %4s", "rank", "saves", "skipped", "failed", "write/save", "MB/s", "stage wait", "N")
	logs := false
	for r := range j.world {
		if d := j.prog.rank(r).D; d != nil && d.Log != nil {
			logs = true
		}
	}
	if logs {
		fmt.Fprintf(&b, " %11s %11s %10s", "log written", "log dropped", "log failed")
	}
	b.WriteByte('\n')
	for r := range j.world {
		d := j.prog.rank(r).D
		if d == nil {
			fmt.Fprintf(&b, "  %6d %6s\n", r, "-")
			continue
		}
		per, rate := "-", "-"
		if d.Saves > 0 && d.WriteNS > 0 {
			per = (time.Duration(d.WriteNS) / time.Duration(d.Saves)).Round(time.Microsecond).String()
			rate = fmt.Sprintf("%.0f", float64(d.Bytes)/1e6/(float64(d.WriteNS)/1e9))
		}
		fmt.Fprintf(&b, "  %6d %6d %8d %7d %12s %10s %12v %4d", r, d.Saves, d.Skipped, d.Failed, per, rate, time.Duration(d.HoldNS).Round(time.Microsecond), d.N)
		if l := d.Log; l != nil {
			fmt.Fprintf(&b, " %11d %11d %10d", l.Steps, l.Dropped, l.Failed)
		} else if logs {
			fmt.Fprintf(&b, " %11s %11s %10s", "-", "-", "-")
		}
		if d.Off != "" {
			fmt.Fprintf(&b, "  no store: %s", d.Off)
		}
		b.WriteByte('\n')
	}
	if u, err := durable.Footprint(t.opts.Dir); err != nil {
		fmt.Fprintf(&b, "durable footprint: %v", err)
	} else {
		fmt.Fprintf(&b, "durable footprint: %s in %s", formatBytes(u.Total), t.opts.Dir)
		if len(u.Ranks) > 0 {
			per := make([]string, len(u.Ranks))
			for r, n := range u.Ranks {
				per[r] = formatBytes(n)
			}
			fmt.Fprintf(&b, " (by rank: %s)", strings.Join(per, " "))
		}
	}
	return b.String()
}
