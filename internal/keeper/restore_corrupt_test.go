package keeper

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// flipHeld flips a byte of every copy of owner's step that host h's
// store keeps (as Keeper.FlipReplicas does, which refuses under erasure
// coding): it reports how many it flipped.
func flipHeld(h *Keeper, owner int, step int64) int {
	st := h.store
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for i := range o.bufs {
		b := &o.bufs[i]
		if b.step != step {
			continue
		}
		for _, d := range b.data {
			if len(d) > 0 {
				d[0] ^= 0x5a
				n++
				break
			}
		}
	}
	return n
}

// TestECRestoreCorruptClearCopy: under erasure coding, a lost rank whose
// clear copy fails its CRC32C and whose stripe cannot be decoded either
// (its data host and the parity host lost) fails its restore with a
// *CopiesCorruptError naming the clear copy's holder, so that the agent
// reports it with the rank's exit; the error still matches
// ErrUnrecoverable (the decode's).
func TestECRestoreCorruptClearCopy(t *testing.T) {
	j := newECRecJob(t, 2, 1, 2, 2)
	hostOf := slices.Clone(j.hostOf) // before the swap
	_, sw := j.loseDataAndParity()
	i := slices.IndexFunc(sw.lost, func(r int) bool { return !sw.sources[r].Decode })
	if i < 0 {
		t.Fatal("no lost rank restores from a clear copy: the test's losses are wrong")
	}
	r := sw.lost[i]
	holder := j.holders[r][0]
	if n := flipHeld(j.c.hosts[hostOf[holder]], r, j.g); n == 0 {
		t.Fatalf("holder rank %d keeps no copy of rank %d's step %d", holder, r, j.g)
	}
	j.connect(r)
	s := j.c.hosts[sw.hostOf[r]].svc(r)
	s.reqMu.Lock()
	_, err := s.restoreRemote(context.Background(), j.g)
	s.reqMu.Unlock()
	cc, ok := errors.AsType[*CopiesCorruptError](err)
	if !ok || cc.Step != j.g || !slices.Equal(cc.Holders, []int{holder}) {
		t.Fatalf("rank %d's restore with its clear copy flipped and no decode: %v; want a CopiesCorruptError of step %d naming holder %d", r, err, j.g, holder)
	}
	if !errors.Is(err, ErrUnrecoverable) || !errors.Is(err, ErrCopyCRC) {
		t.Errorf("%v does not match ErrUnrecoverable and ErrCopyCRC", err)
	}
}

// TestCorruptNoteStale: the note of a restore that failed on corrupt
// copies (Keeper.TakeCorruptCopies) is reported only with an exit of the
// generation whose restore left it: a later restore forgets it whatever
// its outcome (here one from the rank's own slot), as does the spawn of
// a new process for the rank (ForgetCorruptCopies), and a note of
// another generation (a restore still running when its rank was killed)
// is dropped.
func TestCorruptNoteStale(t *testing.T) {
	peers := func(int) []int { return []int{0, 1, 2} }
	for _, tc := range []struct {
		name   string
		noteIn func(h *Keeper) uint64 // the generation the note is of
		then   func(t *testing.T, h *Keeper, r0 *sessRank)
		want   bool
	}{
		{"this generation's", (*Keeper).Gen, func(*testing.T, *Keeper, *sessRank) {}, true},
		{"another generation's", func(h *Keeper) uint64 { return h.Gen() + 1 }, func(*testing.T, *Keeper, *sessRank) {}, false},
		{"a new process", (*Keeper).Gen, func(_ *testing.T, h *Keeper, _ *sessRank) { h.ForgetCorruptCopies(0) }, false},
		{"a later restore from the rank's own slot", (*Keeper).Gen, func(t *testing.T, _ *Keeper, r0 *sessRank) {
			if res := r0.restore(context.Background()); res.Err != "" || res.Tier != 1 {
				t.Fatalf("rank 0's restore from its own slot: %+v", res)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, [][]int{{0}, {1}, {2}}, [][]int{{1}, {2}, {0}}, peers)
			rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
			protectReplicated(c, rs, 2) // G = 1
			h := c.hosts[0]
			h.noteCorruptCopies(0, tc.noteIn(h), 1, []int{1})
			tc.then(t, h, rs[0])
			step, hs, ok := h.TakeCorruptCopies(0)
			if ok != tc.want || ok && (step != 1 || !slices.Equal(hs, []int{1})) {
				t.Errorf("TakeCorruptCopies(0) = %d %v %t; want step 1 holders [1]: %t", step, hs, ok, tc.want)
			}
		})
	}
}
