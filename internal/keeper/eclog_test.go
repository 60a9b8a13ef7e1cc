package keeper

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
)

// logHolder returns host h's copy of owner (its ownerReplica).
func logHolder(t *testing.T, h *Keeper, owner int) *ownerReplica {
	t.Helper()
	h.store.mu.Lock()
	o := h.store.owners[owner]
	h.store.mu.Unlock()
	if o == nil {
		t.Fatalf("host %d keeps no copy of rank %d", h.cfg.Host, owner)
	}
	return o
}

// committedTable returns the table of the replicated regions of dr at
// step (in the holder's order, ref) with their CRC32Cs.
func committedTable(dr *diffRank, ref []tableEntry, step int64) []tableEntry {
	want := dr.want(step)
	t := slices.Clone(ref)
	for i := range t {
		t[i].sum = crc32c.Checksum(want[t[i].name])
	}
	return t
}

// restorerLabel is the label a restore on host h asks logs under.
func restorerLabel(h *Keeper) logLabel {
	p := h.place()
	h.gmu.Lock()
	defer h.gmu.Unlock()
	return logLabel{gen: h.gen, resumed: h.resumed, epoch: p.epoch, g: p.g}
}

// fetchLog runs getLog of owner's steps (from, to] from host 1 (rank 1)
// on host 0's links, and returns the frames.
func fetchLog(c *cluster, owner int, from, to int64, want []tableEntry) ([]logFrame, error) {
	var fs []logFrame
	err := c.hosts[0].links.getLog(context.Background(), 1, 1, owner, restorerLabel(c.hosts[0]), from, to, want, diffOpt.Region, maxRecordLen(diffN, c.hosts[0].cfg.Diff.codec()), nil, func(f logFrame) error {
		fs = append(fs, f)
		return nil
	})
	return fs, err
}

// TestGetLog: a holder answers getLog with the differentials it received,
// each with the owner's committed table, which replay onto the owner's
// state at the first step to its state at the last; it refuses a range it
// does not hold whole (no frame; the link stays usable); a record
// damaged at the holder is refused by the restorer's store; a log-only
// holder's diffstore.Log is served first.
func TestGetLog(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000) // no fold, no refresh: host 1 keeps rank 0's steps 0 to 12
	rs := startDiffRanks(t, c, 2, 41)
	runSteps(t, c, rs, 0, 12)
	o := logHolder(t, c.hosts[1], 0)
	o.mu.Lock()
	ref := slices.Clone(o.sums[12])
	o.mu.Unlock()
	want := regionTable(nil)
	for _, e := range ref {
		want = append(want, tableEntry{name: e.name, size: e.size})
	}
	dr := rs[0]

	fs, err := fetchLog(c, 0, 3, 12, want)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 9 {
		t.Fatalf("getLog(3, 12) gave %d frames, want 9", len(fs))
	}
	for i, f := range fs {
		s := int64(4 + i)
		if f.d.Step != s || !slices.Equal(f.table, committedTable(dr, ref, s)) {
			t.Fatalf("frame %d: step %d, table %v; want step %d, table %v", i, f.d.Step, f.table, s, committedTable(dr, ref, s))
		}
	}
	// The frames replay onto the owner's state at 3 to its state at 12.
	s := c.hosts[0].svc(0)
	views := map[string][]byte{}
	for name, b := range dr.want(3) {
		views[name] = slices.Clone(b)
	}
	ds, err := baseStore(committedTable(dr, ref, 3), &diffOpt, 3, views)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if err := ds.Append(f.d); err != nil {
			t.Fatalf("step %d: %v", f.d.Step, err)
		}
	}
	if err := s.replayInto(ds, 3, 12, fs[len(fs)-1].table, views); err != nil {
		t.Fatal(err)
	}
	for name, b := range dr.want(12) {
		if !bytes.Equal(views[name], b) {
			t.Fatalf("region %s replayed to step 12 differs from the committed one", name)
		}
	}

	// A range the holder lacks a step of: a refusal, no frame.
	for _, r := range [][2]int64{{3, 13}, {-1, 5}} {
		fs, err := fetchLog(c, 0, r[0], r[1], want)
		if !errors.Is(err, errNoLog) || len(fs) != 0 {
			t.Fatalf("getLog(%d, %d): %d frames, %v; want none and errNoLog", r[0], r[1], len(fs), err)
		}
	}
	if _, err := fetchLog(c, 1, 3, 5, want); !errors.Is(err, errNoLog) {
		t.Fatalf("getLog of a rank host 1 keeps no copy of: %v, want errNoLog", err)
	}
	if fs, err := fetchLog(c, 0, 10, 12, want); err != nil || len(fs) != 2 {
		t.Fatalf("getLog after the refusals: %d frames, %v", len(fs), err)
	}

	// A log-only holder's Log is served before the clear store: give
	// host 1 one with steps 3 to 12 of its store, then damage the
	// store's record of step 7.
	lg := logOfStore(t, o, want, 2, 12)
	o.mu.Lock()
	cur := o.cur
	o.mu.Unlock()
	damage := func(step int64) {
		t.Helper()
		if err := cur.Records(step-1, step, func(d diffstore.Diff) error { d.Record[len(d.Record)/2] ^= 0x40; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	damage(7)
	o.mu.Lock()
	o.log = lg
	o.mu.Unlock()
	if fs, err := fetchLog(c, 0, 3, 12, want); err != nil || len(fs) != 9 {
		t.Fatalf("getLog from the log-only copy: %d frames, %v", len(fs), err)
	}
	// Without it, the damaged record comes from the store, and the
	// restorer's store refuses it (the link stays usable).
	o.mu.Lock()
	o.log = nil
	o.mu.Unlock()
	ds2, err := baseStore(committedTable(dr, ref, 3), &diffOpt, 3, maps.Clone(dr.want(3)))
	if err != nil {
		t.Fatal(err)
	}
	err = c.hosts[0].links.getLog(context.Background(), 1, 1, 0, restorerLabel(c.hosts[0]), 3, 12, want, diffOpt.Region, maxRecordLen(diffN, c.hosts[0].cfg.Diff.codec()), nil, func(f logFrame) error {
		return ds2.Append(f.d)
	})
	if !errors.Is(err, diffstore.ErrCorrupt) {
		t.Fatalf("getLog with a damaged record: %v, want ErrCorrupt", err)
	}
	if _, last, _ := ds2.Range(); last != 6 {
		t.Fatalf("the restorer's store took steps up to %d, want 6 (step 7 damaged)", last)
	}
	if fs, err := fetchLog(c, 0, 10, 12, want); err != nil || len(fs) != 2 {
		t.Fatalf("getLog after a damaged record: %d frames, %v", len(fs), err)
	}
	select {
	case lf := <-c.links:
		t.Fatalf("a link failure was reported: %+v", lf)
	default:
	}
}

// TestReplayIntoMismatch: a replay whose state at G is not the one the
// owner committed (a log of another trajectory, or a wrong table) is
// refused, and the views hold the base again.
func TestReplayIntoMismatch(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000)
	rs := startDiffRanks(t, c, 2, 43)
	runSteps(t, c, rs, 0, 6)
	o := logHolder(t, c.hosts[1], 0)
	o.mu.Lock()
	ref := slices.Clone(o.sums[6])
	o.mu.Unlock()
	dr := rs[0]
	var want []tableEntry
	for _, e := range ref {
		want = append(want, tableEntry{name: e.name, size: e.size})
	}
	fs, err := fetchLog(c, 0, 2, 6, want)
	if err != nil {
		t.Fatal(err)
	}
	views := maps.Clone(dr.want(2))
	for name, b := range views {
		views[name] = slices.Clone(b)
	}
	ds, err := baseStore(committedTable(dr, ref, 2), &diffOpt, 2, views)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if err := ds.Append(f.d); err != nil {
			t.Fatal(err)
		}
	}
	bad := slices.Clone(fs[len(fs)-1].table)
	bad[0].sum ^= 1
	err = c.hosts[0].svc(0).replayInto(ds, 2, 6, bad, views)
	if !errors.Is(err, errReplayMismatch) {
		t.Fatalf("replayInto with another committed CRC32C: %v, want errReplayMismatch", err)
	}
	for name, b := range dr.want(2) {
		if !bytes.Equal(views[name], b) {
			t.Fatalf("region %s does not hold the base again after the mismatch", name)
		}
	}
	if err := c.hosts[0].svc(0).replayInto(ds, 2, 6, fs[len(fs)-1].table, views); err != nil {
		t.Fatal(err)
	}
	if err := ds.Truncate(2); err != nil {
		t.Fatal(err)
	}
	if err := c.hosts[0].svc(0).replayInto(ds, 2, 6, fs[len(fs)-1].table, views); err == nil {
		t.Fatal("replayInto of a store without the log's steps succeeded")
	}
}

// logOfStore is a log-only copy of the steps (from, to] of o's clear
// store, in want's regions: what a log-only holder keeps of them.
func logOfStore(t *testing.T, o *ownerReplica, want []tableEntry, from, to int64) *diffstore.Log {
	t.Helper()
	regions := make([]diffstore.Region, len(want))
	for i, e := range want {
		regions[i] = diffstore.Region{Name: e.name, Size: e.size}
	}
	lg, err := diffstore.NewLog(regions, diffstore.Optimizer{Region: diffOpt.Region, N: diffOpt.N, WOff: diffOpt.W, MOff: diffOpt.M, VOff: diffOpt.V})
	if err != nil {
		t.Fatal(err)
	}
	lg.TruncateThrough(from)
	o.mu.Lock()
	cur := o.cur
	o.mu.Unlock()
	err = cur.Records(from, to, func(d diffstore.Diff) error {
		d.Record = bytes.Clone(d.Record)
		d.Other = maps.Clone(d.Other)
		return lg.Append(d)
	})
	if err != nil {
		t.Fatal(err)
	}
	return lg
}
