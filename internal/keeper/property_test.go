package keeper

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/protect"
)

// The property of state protection (DESIGN.md §5): under any interleaving
// of staging, replication and publication of G, a failure of any one host
// at any moment leaves step G (the globally recoverable step the launcher
// knows) held by a surviving copy for every rank: the rank's own slots if
// its host survives, else a replica holder on a surviving host for the
// replicated regions and a surviving data-parallel peer's slots for
// params.
//
// TestPropertyGRecoverable drives that with random schedules. Each
// iteration (one seed, logged in the subtest's name) runs a job of 3 hosts
// × 2 ranks, one data-parallel group, each rank's replicas on the next
// k hosts of a ring (k = 1 or 2), through one to three rounds:
//
//   - every rank, in its own goroutine and through its own Session, says
//     ProtectHello, restores (as a restarted rank does: step -1 at first,
//     then the G of the restart, whose bytes it checks), then stages and
//     commits successive steps with deterministic data, with random pauses
//     between Stage, the writes and Commit;
//   - the controller (the test's goroutine) waits for every rank to have
//     restored (one failure at a time), then plays the launcher: at random
//     moments it computes G as the minimum over ranks of
//     Progress.Replicated and pushes it to every host with SetG; after a
//     random number of moves it fails a random host (its slot directory
//     and the replicas it holds count as lost from that instant; it is
//     closed then, or, not strict, once the ranks stopped), sometimes in
//     the middle of publishing a newer G to some hosts only (G is then
//     that newer one, which the launcher knows);
//   - at that instant, with every other rank still staging, it checks the
//     property: Tier-1 copies by opening the rank's slot files (ckpt.Open,
//     At(G)) and comparing the bytes, replicas by reading the holders'
//     buffers under their locks;
//   - then it cancels the stagers (the contexts end stages blocked at the
//     overwrite rule), restarts the survivors from G (Keeper.Restart) and
//     replaces the failed host by a fresh one with an empty slot
//     directory, as the launcher and agents do; the next round's ranks
//     restore step G for real (Tier-1 on the survivors, Tier-2 on the new
//     host) and check the bytes. A last round only restores.
//
// One failure at a time: after a restart, the replicas the failed host
// held are gone until the survivors send them again to the host that
// replaced it, and the launcher knows it (Replicated < G); the next
// failure comes once every rank's Replicated says G again (see
// TestBugReplicasLostWithReplacedHost, where Replicated said so too early).
//
// GORUN_PROPERTY_ITERS sets the number of iterations (default 30, 10 with
// -short), GORUN_PROPERTY_SEED the first seed (to replay one: the seed in
// a failing subtest's name, with GORUN_PROPERTY_ITERS=1; the rest of the
// schedule is the goroutines' interleaving, so a replay makes a failure
// likelier, not certain).
func TestPropertyGRecoverable(t *testing.T) {
	iters := 30
	if testing.Short() {
		iters = 10
	}
	if s := os.Getenv("GORUN_PROPERTY_ITERS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("GORUN_PROPERTY_ITERS: %v", err)
		}
		iters = n
	}
	base := uint64(1)
	if s := os.Getenv("GORUN_PROPERTY_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GORUN_PROPERTY_SEED: %v", err)
		}
		base = n
	}
	before := runtime.NumGoroutine()
	for i := range iters {
		seed := base + uint64(i)
		k := 1 + int(seed%2)
		t.Run(fmt.Sprintf("seed=%d,k=%d", seed, k), func(t *testing.T) {
			runProperty(t, seed, k)
		})
		if t.Failed() {
			break
		}
	}
	checkNoLeak(t, before)
}

// checkNoLeak waits for the goroutines started since there were before
// to end.
func checkNoLeak(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// propRegions are small, to keep an iteration cheap; params is restored
// from a data-parallel peer, the others from a replica holder.
var propRegions = []protect.Region{{Name: "optimizer", Size: 3000}, {Name: "params", Size: 2048}, {Name: "meta", Size: 100}}

var propHello = []byte(`{"v":1,"regions":[{"name":"optimizer","size":3000},{"name":"params","size":2048},{"name":"meta","size":100}]}`)

func propCkptRegions() []ckpt.Region {
	out := make([]ckpt.Region, len(propRegions))
	for i, r := range propRegions {
		out[i] = ckpt.Region{Name: r.Name, Size: r.Size}
	}
	return out
}

// propState is rank r's deterministic state at step, by region.
func propState(r int, step int64) map[string][]byte {
	out := map[string][]byte{}
	for name, parts := range stateOf(r, step, propRegions) {
		out[name] = joined(parts)
	}
	return out
}

// propJob is one iteration's job.
type propJob struct {
	t       *testing.T
	seed    uint64
	c       *cluster
	nh, per int
	ranks   [][]int
	holders [][]int
	peers   func(int) []int
	gen     uint64
	failed  atomic.Int32 // the host failed in this round, or -1
}

func newPropJob(t *testing.T, seed uint64, k int) *propJob {
	j := &propJob{t: t, seed: seed, nh: 3, per: 2}
	world := j.nh * j.per
	all := make([]int, world)
	for r := range all {
		all[r] = r
	}
	j.peers = func(int) []int { return all }
	for h := range j.nh {
		var rs []int
		for i := range j.per {
			rs = append(rs, h*j.per+i)
		}
		j.ranks = append(j.ranks, rs)
	}
	j.holders = make([][]int, world)
	for r := range world {
		for i := 1; i <= k; i++ {
			j.holders[r] = append(j.holders[r], (r+i*j.per)%world)
		}
	}
	j.failed.Store(-1)
	j.c = newCluster(t, j.ranks, j.holders, j.peers)
	return j
}

func (j *propJob) world() int         { return j.nh * j.per }
func (j *propJob) hostOf(r int) int   { return r / j.per }
func (j *propJob) stopped(r int) bool { return j.failed.Load() == int32(j.hostOf(r)) }

func (j *propJob) host(h int) *Keeper {
	j.c.mu.Lock()
	defer j.c.mu.Unlock()
	return j.c.hosts[h]
}

func (j *propJob) dir(h int) string {
	j.c.mu.Lock()
	defer j.c.mu.Unlock()
	return j.c.dirs[h]
}

// launcherG is G as the launcher computes it: the minimum over ranks of
// Replicated, from every host's progress report.
func (j *propJob) launcherG() int64 {
	g := int64(protect.MaxStep)
	for h := range j.nh {
		gen, ps := j.host(h).Progress()
		if gen != j.gen {
			j.t.Fatalf("seed %d: host %d reports generation %d, not %d", j.seed, h, gen, j.gen)
		}
		for _, p := range ps {
			g = min(g, p.Replicated)
		}
	}
	return g
}

func (j *propJob) errorf(format string, args ...any) {
	j.t.Helper()
	j.t.Errorf("seed %d: "+format, append([]any{j.seed}, args...)...)
}

func runProperty(t *testing.T, seed uint64, k int) {
	j := newPropJob(t, seed, k)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	rounds := 1 + rng.IntN(3) // failures
	restoreStep, replaced := int64(-1), -1
	for round := 0; ; round++ {
		last := round == rounds
		ctx, cancel := context.WithCancel(context.Background())
		var wg, restored sync.WaitGroup
		restored.Add(j.world())
		for r := range j.world() {
			rrng := rand.New(rand.NewPCG(seed, uint64(1+round*j.world()+r)))
			wg.Go(func() { j.rank(ctx, r, restoreStep, replaced, !last, rrng, restored.Done) })
		}
		// One failure at a time: a host failing while the previous one's
		// ranks still restore from their holders is a double failure.
		allRestored := make(chan struct{})
		go func() { restored.Wait(); close(allRestored) }()
		select {
		case <-allRestored:
		case <-time.After(20 * time.Second):
			j.errorf("round %d: the ranks did not all restore step %d within 20 s", round, restoreStep)
			cancel()
			ended := make(chan struct{})
			go func() { wg.Wait(); close(ended) }()
			select {
			case <-ended:
			case <-time.After(5 * time.Second):
				// Nothing ends a deadlock, and closing the hosts
				// (the test's cleanup) would wait for it too.
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				fmt.Fprintf(os.Stderr, "FAIL: seed %d: round %d: the ranks' restores are deadlocked (see TestBugConcurrentTier2RestoreDeadlock):\n%s", seed, round, buf)
				os.Exit(1)
			}
			return
		}
		if last {
			wg.Wait()
			cancel()
			return
		}
		g, fh := j.runUntilFailure(rng, restoreStep)
		t.Logf("round %d: host %d failed with G = %d", round, fh, g)
		j.check(g, fh)
		cancel()
		wg.Wait()
		if t.Failed() {
			return
		}
		j.restart(g, fh)
		restoreStep, replaced = g, fh
	}
}

// runUntilFailure plays the launcher publishing G at random moments, then
// fails a random host. It returns the G the launcher knows at the failure,
// and the host.
func (j *propJob) runUntilFailure(rng *rand.Rand, g0 int64) (int64, int) {
	published := g0
	publish := func(g int64, hosts []int) {
		for _, h := range hosts {
			j.host(h).SetG(j.gen, g)
		}
	}
	all := rng.Perm(j.nh)
	if g0 >= 0 {
		// After a restart, the replicas the failed host held for the
		// survivors are gone until sent again: the launcher sees it
		// (some rank's Replicated < G) and the job is under-protected.
		// One failure at a time: the next comes once every rank's
		// Replicated says G again, which must then be true.
		deadline := time.Now().Add(10 * time.Second)
		for {
			g := j.launcherG()
			if g >= g0 {
				break
			}
			if time.Now().After(deadline) {
				j.t.Fatalf("seed %d: the ranks' Replicated did not come back to G = %d within 10 s after the restart (minimum %d)", j.seed, g0, g)
			}
			select {
			case <-j.c.changed:
			case <-time.After(time.Millisecond):
			}
		}
	}
	for range rng.IntN(160) {
		switch rng.IntN(6) {
		case 0, 1:
			if g := j.launcherG(); g > published {
				publish(g, all)
				published = g
			}
		case 2, 3:
			runtime.Gosched()
		case 4:
			time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
		case 5:
			select {
			case <-j.c.changed:
			case <-time.After(time.Millisecond):
			}
		}
	}
	known := published
	if rng.IntN(4) == 0 {
		// The failure comes while a newer G is on its way: some hosts
		// have it, and the launcher knows it.
		if g := j.launcherG(); g > known {
			publish(g, rng.Perm(j.nh)[:rng.IntN(j.nh)])
			known = g
		}
	}
	fh := rng.IntN(j.nh)
	j.failed.Store(int32(fh))
	j.close(fh)
	return known, fh
}

func (j *propJob) close(h int) {
	if err := j.host(h).Close(); err != nil {
		j.errorf("closing host %d: %v", h, err)
	}
}

// rank is rank r's life in one round: ProtectHello, Restore (which must
// give step want, from this host's slots unless r's host was replaced),
// then steps from want+1 on until ctx ends or r's host fails.
func (j *propJob) rank(ctx context.Context, r int, want int64, replaced int, stage bool, rng *rand.Rand, restored func()) {
	var once sync.Once
	defer once.Do(restored)
	sess := j.host(j.hostOf(r)).Session(r)
	fail := func(format string, args ...any) {
		if ctx.Err() == nil && !j.stopped(r) {
			j.errorf("rank %d: "+format, append([]any{r}, args...)...)
		}
	}
	typ, ans, err := sess.Handle(ctx, protect.TypeProtectHello, propHello)
	if err != nil || typ != protect.TypeProtectWelcome {
		fail("ProtectHello: type %d, %v", typ, err)
		return
	}
	w := ans.(*protect.ProtectWelcome)
	if w.Err != "" {
		fail("ProtectHello: %s", w.Err)
		return
	}
	views, unmap, err := mapRegionFiles(w.Regions)
	if err != nil {
		fail("%v", err)
		return
	}
	defer unmap()

	typ, ans, err = sess.Handle(ctx, protect.TypeRestore, []byte(`{}`))
	if err != nil || typ != protect.TypeRestorable {
		fail("Restore: type %d, %v", typ, err)
		return
	}
	res := ans.(*protect.Restorable)
	wantTier := 1
	if j.hostOf(r) == replaced {
		wantTier = 2
	}
	switch {
	case res.Err != "":
		fail("Restore (step %d wanted): %s", want, res.Err)
		return
	case res.Step != want:
		fail("Restore gave step %d, want %d", res.Step, want)
		return
	case want >= 0 && (res.Tier != wantTier || res.Slot != 0 && res.Slot != 1):
		fail("Restore of step %d: tier %d slot %d, want tier %d", want, res.Tier, res.Slot, wantTier)
		return
	case want >= 0:
		st := propState(r, want)
		for i, reg := range propRegions {
			if !bytes.Equal(views[res.Slot][i], st[reg.Name]) {
				fail("tier-%d restore of step %d: region %s differs", res.Tier, want, reg.Name)
				return
			}
		}
	}
	once.Do(restored)
	if !stage {
		return
	}
	jitter := func() {
		switch rng.IntN(8) {
		case 0:
			time.Sleep(time.Duration(rng.IntN(100)) * time.Microsecond)
		case 1, 2:
			runtime.Gosched()
		}
	}
	for step := want + 1; ctx.Err() == nil && !j.stopped(r); step++ {
		req := fmt.Appendf(nil, `{"step":%d}`, step)
		typ, ans, err := sess.Handle(ctx, protect.TypeStage, req)
		if err != nil || typ != protect.TypeStaged {
			fail("Stage(%d): type %d, %v", step, typ, err)
			return
		}
		sd := ans.(*protect.Staged)
		if sd.Err != "" {
			fail("Stage(%d): %s", step, sd.Err)
			return
		}
		jitter()
		st := propState(r, step)
		for i, reg := range propRegions {
			d := views[sd.Slot][i]
			h := len(d) / 2
			copy(d[:h], st[reg.Name][:h])
			jitter()
			copy(d[h:], st[reg.Name][h:])
		}
		jitter()
		typ, ans, err = sess.Handle(ctx, protect.TypeCommit, req)
		if err != nil || typ != protect.TypeCommitted {
			fail("Commit(%d): type %d, %v", step, typ, err)
			return
		}
		if cm := ans.(*protect.Committed); cm.Err != "" {
			fail("Commit(%d): %s", step, cm.Err)
			return
		}

	}
}

// replicated returns rank r's Progress.Replicated.
func (j *propJob) replicated(r int) int64 {
	_, ps := j.host(j.hostOf(r)).Progress()
	for _, p := range ps {
		if p.Rank == r {
			return p.Replicated
		}
	}
	return noStep
}

// mapRegionFiles maps the slot files a ProtectWelcome names, as a rank
// does: views[slot][region].
func mapRegionFiles(files []protect.RegionFile) ([2][][]byte, func(), error) {
	var views [2][][]byte
	var unmaps []func() error
	unmap := func() {
		for _, u := range unmaps {
			u()
		}
	}
	for _, f := range files {
		v, u, err := ckpt.MapData(ckpt.RegionFile{Name: f.Name, Size: f.Size, Stride: f.Stride, Path: f.Path})
		if err != nil {
			unmap()
			return views, nil, fmt.Errorf("mapping %s: %w", f.Path, err)
		}
		unmaps = append(unmaps, u)
		views[0], views[1] = append(views[0], v[0]), append(views[1], v[1])
	}
	return views, unmap, nil
}

// restart resumes the job from step g after host fh failed, as the
// launcher and the agents do: a new generation, the survivors' steps after
// g discarded, and a new host, with an empty slot directory, in fh's
// place.
func (j *propJob) restart(g int64, fh int) {
	j.gen++
	for h := range j.nh {
		if h != fh {
			if err := j.host(h).Restart(j.gen, g); err != nil {
				j.errorf("restart of host %d from step %d: %v", h, g, err)
			}
		}
	}
	j.c.startHost(fh, j.ranks[fh], j.peers, j.t.TempDir())
	addrs := make([]string, j.nh)
	for h := range j.nh {
		addrs[h] = j.host(h).cfg.Listener.Addr().String()
	}
	for h := range j.nh {
		j.host(h).SetAddrs(addrs)
	}
	if err := j.host(fh).Restart(j.gen, g); err != nil {
		j.errorf("restart of the new host %d: %v", fh, err)
	}
	j.failed.Store(-1)
}
