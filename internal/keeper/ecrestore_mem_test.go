package keeper

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/diffstore"
)

// replViews returns zeroed buffers for rank service s's replicated
// regions, by name: what a restore fills.
func replViews(s *service) map[string][]byte {
	views := map[string][]byte{}
	for _, i := range s.repl {
		views[s.regions[i].Name] = make([]byte, s.regions[i].Size)
	}
	return views
}

// restoring returns the bytes host h's restores hold reserved, and all
// its replica-memory reserve's.
func restoring(h *Keeper) (uint64, uint64) {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	return h.store.restoring, h.store.bytes
}

// TestECRestoreReserve: a restore by decode and replay (diff mode under
// EC) reserves its buffers (the decode's chunk buffers, the replay's copy
// of the base, each differential of the log) against the host's
// replica-memory reserve before it allocates them, and gives every byte
// back when it returns: after a success, after a log source that fails
// (a damaged record: the next host's log serves), after a cancellation
// at each reservation; and a reserve too small for the restore refuses
// it with errNoRoom, the reserve unchanged.
func TestECRestoreReserve(t *testing.T) {
	const k, m, every = 2, 2, 3
	j, g, hb := logAfterH(t, k, m, every)
	const r = 0
	h := j.c.hosts[j.hostOf[r]]
	s := h.svc(r)
	pl := h.place()
	want := j.rs[r].want(g)
	restore := func(ctx context.Context) (map[string][]byte, error) {
		views := replViews(s)
		return views, s.decodeReplay(ctx, g, hb, pl.logsOf(r), pl, views)
	}
	check := func(what string, views map[string][]byte) {
		t.Helper()
		for name, v := range views {
			if !bytes.Equal(v, want[name]) {
				t.Fatalf("%s: region %s is not the committed one", what, name)
			}
		}
	}
	var peak, first uint64
	testHookHold = func(n uint64) {
		if first == 0 {
			first = n // the decode's buffers
		}
		if n, _ := restoring(h); n > peak {
			peak = n
		}
	}
	t.Cleanup(func() { testHookHold = nil })
	back := func(what string) {
		t.Helper()
		if n, _ := restoring(h); n != 0 {
			t.Fatalf("%s: %d bytes still reserved by the restore", what, n)
		}
	}

	views, err := restore(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	check("restored", views)
	back("after a restore")
	if peak == 0 {
		t.Fatal("the restore reserved nothing past its first reservation")
	}

	// The first log source's record of step g damaged: it fails, the
	// next one serves.
	cands := s.logCandidates(pl, pl.logsOf(r))
	o := logHolder(t, j.c.hosts[cands[0].host], r)
	flip := func() {
		t.Helper()
		o.mu.Lock()
		lg := o.log
		o.mu.Unlock()
		if lg == nil {
			t.Fatalf("host %d keeps no log of rank %d", cands[0].host, r)
		}
		if err := lg.Records(g-1, g, func(d diffstore.Diff) error { d.Record[len(d.Record)/2] ^= 0x40; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	flip()
	views, err = restore(context.Background())
	flip()
	if err != nil {
		t.Fatalf("with the first log damaged: %v", err)
	}
	check("restored from the second log", views)
	back("after a failing log source")

	// Cancelled at each reservation: the decode's buffers, the base's
	// copy, the first differential.
	for i := 1; i <= 3; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		testHookHold = func(uint64) {
			if n++; n == i {
				cancel()
			}
		}
		_, err := restore(ctx)
		cancel()
		if !errors.Is(err, context.Canceled) || n < i {
			t.Fatalf("cancelled at reservation %d (of %d made): %v, want context.Canceled", i, n, err)
		}
		back("after a cancellation")
	}
	testHookHold = nil

	// A reserve with less room left than the decode's buffers.
	h.store.mu.Lock()
	h.store.limit = h.store.bytes + first - 1
	h.store.mu.Unlock()
	t.Cleanup(func() {
		h.store.mu.Lock()
		h.store.limit = 0
		h.store.mu.Unlock()
	})
	_, err = restore(context.Background())
	if !errors.Is(err, errNoRoom) {
		t.Fatalf("with a reserve too small: %v, want errNoRoom", err)
	}
	back("after a refusal")
}

// TestECRestoreReserveLogNoRoom: a restore by decode and replay whose
// every log source that keeps the log is refused for want of room in the
// reserve (full from the first differential on: the decode and the
// base's copy fit) fails with errNoRoom, not ErrUnrecoverable (a retry
// once there is room may restore), every byte given back.
func TestECRestoreReserveLogNoRoom(t *testing.T) {
	const k, m, every = 2, 2, 3
	j, g, hb := logAfterH(t, k, m, every)
	const r = 0
	h := j.c.hosts[j.hostOf[r]]
	s := h.svc(r)
	pl := h.place()
	views := replViews(s)
	n := 0
	testHookHold = func(uint64) {
		if n++; n == 3 { // the first differential: no room from now on
			h.store.mu.Lock()
			h.store.limit = max(h.store.bytes, 1) // 0 is the default limit
			h.store.mu.Unlock()
		}
	}
	t.Cleanup(func() {
		testHookHold = nil
		h.store.mu.Lock()
		h.store.limit = 0
		h.store.mu.Unlock()
	})
	err := s.decodeReplay(context.Background(), g, hb, pl.logsOf(r), pl, views)
	if !errors.Is(err, errNoRoom) || errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("every log refused for want of room: %v; want errNoRoom, not ErrUnrecoverable", err)
	}
	if n < 4 {
		t.Fatalf("%d reservations asked for, want the decode's, the base's and one per log holder (2)", n)
	}
	if got, _ := restoring(h); got != 0 {
		t.Fatalf("%d bytes still reserved by the restore", got)
	}
	t.Log(err)
}

// TestECRestoreMemberNoRoom: a decode whose other members' hosts refuse
// their shards for want of room in their reserves (their answer buffers
// are reserved: getAnswerBuf), leaving fewer than K sources, fails with
// errNoRoom, not ErrUnrecoverable: restoreRemote retries it
// (retryNoRoom) instead of giving the rank up. Once the reserves have
// room, the same decode restores the committed state. (A review found
// the refusal read as an unusable source, and the restore unrecoverable.)
func TestECRestoreMemberNoRoom(t *testing.T) {
	const k, m, every = 2, 1, 3 // the decode needs both other sources
	j, g, hb := logAfterH(t, k, m, every)
	const r = 0
	h := j.c.hosts[j.hostOf[r]]
	s := h.svc(r)
	pl := h.place()
	views := replViews(s)
	setLimits := func(full bool) {
		for x, o := range j.c.hosts[:j.work] {
			if x == j.hostOf[r] {
				continue
			}
			o.store.mu.Lock()
			o.store.limit = 0 // the default: no limit
			if full {
				o.store.limit = 1 // refuses any reservation, whatever the count does
			}
			o.store.mu.Unlock()
		}
	}
	setLimits(true)
	t.Cleanup(func() { setLimits(false) })
	err := s.decodeReplay(context.Background(), g, hb, pl.logsOf(r), pl, views)
	if !errors.Is(err, errNoRoom) || errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("the other members' hosts without room: %v; want errNoRoom, not ErrUnrecoverable", err)
	}
	if got, _ := restoring(h); got != 0 {
		t.Fatalf("%d bytes still reserved by the restore", got)
	}
	setLimits(false)
	if err := s.decodeReplay(context.Background(), g, hb, pl.logsOf(r), pl, views); err != nil {
		t.Fatalf("with room again: %v", err)
	}
	for name, v := range j.rs[r].want(g) {
		if !bytes.Equal(views[name], v) {
			t.Fatalf("region %s is not the committed one", name)
		}
	}
}

// TestECRestoreReserveRetry: a lost rank restoring by decode on a spare
// whose replica-memory reserve has no room for its first buffers (the
// owners' copies, rows and logs sent there, or other ranks' restores,
// hold it) and has room a moment later restores (restoreRemote retries
// errNoRoom, retryNoRoom), rather than failing at once.
func TestECRestoreReserveRetry(t *testing.T) {
	const k, m, every = 2, 2, 3
	j := newECDiffRecJob(t, k, m, every, 1)
	j.run(0, 3*every+5)
	g, _ := j.published()
	// Host 0 lost: its ranks restore on the spare, the one on its data
	// host by decode.
	spare := j.c.hosts[j.work]
	var mu sync.Mutex
	calls := 0
	testHookHold = func(uint64) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		spare.store.mu.Lock()
		if calls == 1 {
			spare.store.limit = max(spare.store.bytes, 1) // no room (0 is the default limit)
		} else {
			spare.store.limit = 0 // room again
		}
		spare.store.mu.Unlock()
	}
	t.Cleanup(func() { testHookHold = nil })
	sw, res, errs := j.swapRestore([]int{0}, 2)
	testHookHold = nil
	decoded := 0
	for _, r := range sw.lost {
		if sw.sources[r].Decode {
			decoded++
		}
		if got := res[r]; errs[r] != nil || got.Step != g || got.Tier != 2 {
			t.Errorf("rank %d (source %+v): %+v, %v; want tier 2 at %d", r, sw.sources[r], got, errs[r], g)
		}
	}
	if decoded == 0 || calls < 2 {
		t.Fatalf("%d ranks restored by decode, %d reservations asked for: want some, and a refusal retried", decoded, calls)
	}
	if n, _ := restoring(spare); n != 0 {
		t.Fatalf("%d bytes still reserved by the restores", n)
	}
}

// TestECRestoreDecodeFallsToDisk: a lost rank whose stripe keeps fewer
// than K shards (M+1 hosts of its 2+2 group lost) and whose job has a
// durable tier (its committed base on disk is of G) restores from
// the durable tier, at G, bit for bit, instead of failing with
// ErrUnrecoverable (restoreRemote tries the disk after a decode that
// cannot give the state).
func TestECRestoreDecodeFallsToDisk(t *testing.T) {
	const k, m, every = 2, 2, 3
	dir := t.TempDir()
	j := newECDiffRecJobWith(t, k, m, every, m+1, func(c *Config) {
		c.DiffLog = &DiffLogConfig{Dir: dir, Batch: 1, Queue: 64}
	})
	j.run(0, 3*every+5)
	g, _ := j.published()
	waitLogged(t, j.c, g)
	// The durable base at G itself (params is not in the differentials:
	// a base before G could not be rolled forward to G).
	saveAll(t, dir, j.rs[0], g)
	if err := durable.Commit(dir, g); err != nil {
		t.Fatal(err)
	}
	lost := []int{0, 1, 2}
	sw, res, errs := j.swapRestore(lost, 2)
	if !sw.sources[0].Decode {
		t.Fatalf("rank 0 restores from %+v: want by decode", sw.sources[0])
	}
	if got := res[0]; errs[0] != nil || got.Step != g {
		t.Fatalf("rank 0, hosts %v of a 2+2 group lost, the durable tier reaching G %d: %+v, %v; want a restore at G", lost, g, got, errs[0])
	}
}

// logAfterH runs a k+m diff-mode-under-EC job of bases every every steps
// until G is past H (a restore decodes at H and replays a log up to G),
// and returns it with G and H.
func logAfterH(t *testing.T, k, m, every int) (*ecDiffRecJob, int64, int64) {
	t.Helper()
	j := newECDiffRecJob(t, k, m, every, 0)
	j.run(0, int64(3*every+5))
	g, hb := j.published()
	if hb < 0 || hb >= g {
		t.Fatalf("G %d, H %d: want a log to replay after H", g, hb)
	}
	return j, g, hb
}
