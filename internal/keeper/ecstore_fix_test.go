package keeper

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
)

// memberIn says whether member x's share of step is in parity row row of
// stripe 0 of group 0, as the row's host holds it.
func (j *ecTestJob) memberIn(row, stripe, x int, step int64) bool {
	host, _ := j.rowHost(row)
	r := j.c.hosts[host].parity.row(ecRowKey{0, stripe, row}, false)
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.bufs {
		if b := &r.bufs[i]; b.step == step && x < len(b.mem) && b.mem[x].in {
			return true
		}
	}
	return false
}

// TestECCommitCRCKeepsAckedShares: an ecCommit whose share CRC32C is not
// that of the chunks that came is refused, and nothing else: the shares
// of the other members, acknowledged already (their acks count toward
// Replicated), stay in; the member's correct commit then completes the
// row; and the next step's first chunk takes the older complete row, not
// the newest.
func TestECCommitCRCKeepsAckedShares(t *testing.T) {
	j := newECJob(t, 2, 2, 1, false)
	ws := rawMembers(j)
	for _, w := range ws {
		if err := w.whole(2, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := ws[0].whole(3, 0); err != nil {
		t.Fatal(err)
	}
	sh, tab := ws[1].share(3, 0)
	h := len(sh) / 2
	if err := errors.Join(ws[1].chunk(3, 0, 0, h), ws[1].chunk(3, 0, h, len(sh))); err != nil {
		t.Fatal(err)
	}
	if err := ws[1].send(kindECCommit, 3, 0, 0, int64(len(sh)), tab, nil, crc32c.Checksum(sh)^1); err == nil {
		t.Fatal("a commit with a wrong share CRC32C was taken")
	}
	if err := ws[0].has(3, 0); err != nil {
		t.Fatalf("member 0's acknowledged share of step 3 is gone after member 1's bad commit: %v", err)
	}
	// Member 1 sends again (its chunks are in already) and commits right.
	if err := ws[1].whole(3, 0); err != nil {
		t.Fatal(err)
	}
	got, err := j.readRow(0, 3)
	if err != nil {
		t.Fatalf("both members acknowledged for step 3, the row is not complete: %v", err)
	}
	if want := wantRow(t, 2, 2, stripeMembers(j.groups[0], 0), 3, noSalt)[0]; !bytes.Equal(got, want) {
		t.Fatal("row 0 of step 3 differs from the codec's parity")
	}
	if err := ws[0].chunk(4, 0, 0, 64); err != nil {
		t.Fatal(err)
	}
	if _, err := j.readRow(0, 3); err != nil {
		t.Fatalf("the first chunk of step 4 took the newest complete row, of step 3: %v", err)
	}
}

// TestECResendOtherBytes: a chunk sent again with other bytes than those
// of the member's share that are in is refused as failShare, and the
// member's share of that step is refused from then on (chunks and
// commit): the row holds bytes of it that no commit vouches for. The
// other member's acknowledged share stays in, the row is never complete,
// and the next step's first chunk takes the incomplete buffer, keeping
// the complete row of the step before.
func TestECResendOtherBytes(t *testing.T) {
	j := newECJob(t, 2, 2, 1, false)
	ws := rawMembers(j)
	for _, w := range ws {
		if err := w.whole(2, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := ws[0].whole(3, 0); err != nil {
		t.Fatal(err)
	}
	sh, _ := ws[1].share(3, 0)
	h := len(sh) / 2
	if err := ws[1].chunk(3, 0, 0, h); err != nil {
		t.Fatal(err)
	}
	other := ws[1]
	other.salt = 1
	if err := other.chunk(3, 0, 0, h); !refusedAs(err, failShare) {
		t.Fatalf("a resent chunk with other bytes: %v, want a failShare refusal", err)
	}
	// The same bytes as the first time: still refused, the member's
	// share is poisoned for this step.
	if err := ws[1].chunk(3, 0, 0, h); !refusedAs(err, failShare) {
		t.Fatalf("a resent chunk after a conflict: %v, want a failShare refusal", err)
	}
	if err := ws[1].chunk(3, 0, h, len(sh)); !refusedAs(err, failShare) {
		t.Fatalf("the rest of the share after a conflict: %v, want a failShare refusal", err)
	}
	if err := ws[1].commit(3, 0); !refusedAs(err, failShare) {
		t.Fatalf("the commit after a conflict: %v, want a failShare refusal", err)
	}
	if err := ws[0].has(3, 0); err != nil {
		t.Fatalf("member 0's acknowledged share of step 3: %v", err)
	}
	if _, err := j.readRow(0, 3); err == nil {
		t.Fatal("row 0 of step 3 is complete with a share no commit vouches for")
	}
	// Another row of the step is not concerned.
	if err := ws[1].whole(3, 1); err != nil {
		t.Fatalf("member 1's share of row 1: %v", err)
	}
	if err := ws[0].chunk(4, 0, 0, 64); err != nil {
		t.Fatal(err)
	}
	got, err := j.readRow(0, 2)
	if err != nil {
		t.Fatalf("the first chunk of step 4 took the complete row of step 2 rather than step 3's incomplete one: %v", err)
	}
	if want := wantRow(t, 2, 2, stripeMembers(j.groups[0], 0), 2, noSalt)[0]; !bytes.Equal(got, want) {
		t.Fatal("row 0 of step 2 differs from the codec's parity")
	}
	// A committed share sent again with other bytes: refused, and the
	// share stays in (its commit vouched for the bytes in the row).
	other = ws[0]
	other.salt = 1
	sh0, _ := ws[0].share(2, 0)
	if err := other.chunk(2, 0, 0, len(sh0)/2); !refusedAs(err, failShare) {
		t.Fatalf("a committed share's chunk resent with other bytes: %v, want a failShare refusal", err)
	}
	if err := ws[0].has(2, 0); err != nil {
		t.Fatalf("member 0's committed share of step 2 after a resend with other bytes: %v", err)
	}
	if _, err := j.readRow(0, 2); err != nil {
		t.Fatalf("row 0 of step 2 after a resend with other bytes: %v", err)
	}
}

// tornECStep protects steps 0 and 1 of every rank of a 2+2 job, with
// testHookECBlock set to hook(torn's service) while step 1 is encoded,
// torn being member 0 of stripe 0, and checks that rank torn fails with a CorruptError of step 1 (whose message contains want),
// that every other rank's step 1 is replicated, that no row of torn's
// stripe is complete at step 1 while the other member's share of each is
// in, and that the other stripe's rows of step 1 are the codec's parity.
func tornECStep(t *testing.T, hook func(victim *service) func(s *service, off int64, read bool), want string) {
	j := newECJob(t, 2, 2, 1, true)
	torn := j.groups[0].DataGroups[0][0]
	for _, er := range j.rs {
		er.protect(0, 0)
	}
	j.waitReplicated(0)
	j.c.publishG()
	testHookECBlock = hook(j.c.hosts[j.c.hostOf[torn]].svc(torn))
	t.Cleanup(func() { testHookECBlock = nil })
	for _, er := range j.rs {
		er.protect(1, 0)
	}
	select {
	case f := <-j.c.failed:
		ce, ok := errors.AsType[*CorruptError](f.err)
		if f.rank != torn || !ok || ce.Step != 1 || !errors.Is(f.err, ckpt.ErrCorrupt) || !strings.Contains(f.err.Error(), want) {
			t.Fatalf("failure %+v, want rank %d's step 1 corrupt (%q)", f, torn, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the encoding of bytes that are not the commit's was not found")
	}
	j.c.waitFor("the other ranks' step 1", func() bool {
		for r := range j.c.hostOf {
			if r != torn && j.c.progress(r).Replicated < 1 {
				return false
			}
		}
		return true
	})
	if p := j.c.progress(torn); p.Replicated >= 1 {
		t.Fatalf("the torn rank's step 1 counts as replicated: %+v", p)
	}
	g := j.groups[0]
	for stripe := range len(g.DataGroups[0]) {
		members := stripeMembers(g, stripe)
		x := slices.Index(members, torn)
		for row := range 2 {
			host, _ := j.rowHost(row)
			got := make([]byte, len(ecShard(members[0], 1, 0))+len(ecShard(members[1], 1, 0)))
			_, err := j.c.hosts[host].parity.read(0, stripe, row, 1, 0, got)
			if x < 0 {
				if err != nil {
					t.Fatalf("stripe %d row %d of step 1: %v", stripe, row, err)
				}
				w := wantRow(t, 2, 2, members, 1, noSalt)[row]
				if !bytes.Equal(got[:len(w)], w) {
					t.Fatalf("stripe %d row %d of step 1 differs from the codec's parity", stripe, row)
				}
				continue
			}
			if err == nil {
				t.Fatalf("stripe %d row %d of step 1 is complete, with bytes of the torn rank that are not its commit's", stripe, row)
			}
			if !j.memberIn(row, stripe, 1-x, 1) {
				t.Fatalf("stripe %d row %d of step 1: the other member's acknowledged share is gone", stripe, row)
			}
		}
	}
}

// flipper writes into byte 5 of the first region of rank torn's slot of
// step 1 (flip) and takes the write back (revert), each once.
type flipper struct {
	victim       *service
	flip, revert sync.Once
}

func (f *flipper) do(s *service, once *sync.Once) {
	if s != f.victim {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for slot, st := range s.slotStep {
		if st == 1 {
			once.Do(func() { s.views[slot][0][5] ^= 0x5a })
		}
	}
}

// TestECTornSlotReverted: a write into a committed slot while its shares
// are encoded, taken back before the encoder ends (the slot matches its
// commit again when it is verified): the shares sent are of bytes that
// are not the commit's and no row can take them out again, so the rank
// fails with a CorruptError naming the bytes encoded, and no row of that
// step completes (TestECTornSlot is the write that stays).
func TestECTornSlotReverted(t *testing.T) {
	tornECStep(t, func(victim *service) func(*service, int64, bool) {
		f := &flipper{victim: victim}
		return func(s *service, off int64, read bool) {
			switch {
			case off == 0 && !read:
				f.do(s, &f.flip) // before the first block is read
			case off > 0 && !read:
				f.do(s, &f.revert) // once it was encoded: at the next region's block
			}
		}
	}, "CRC mismatch")
}

// TestECShareOfCheckedBytes: a write into a committed slot before the
// encoder's first block is read, taken back as soon as that block's
// shares and CRC32Cs are made (testHookECBlock's read true comes after
// ckpt.Codec.ShareChecked returns): the sum checked at the end is of the
// bytes encoded, not of the slot read again, so the rank fails with a
// CorruptError and no row of the step completes with a share of bytes
// that are not the commit's. That each share is built from exactly the
// bytes whose CRC32C is taken, whatever writes into the slot during the
// call, is ckpt's TestShareCheckedTornData: no hook falls inside the call.
func TestECShareOfCheckedBytes(t *testing.T) {
	tornECStep(t, func(victim *service) func(*service, int64, bool) {
		f := &flipper{victim: victim}
		return func(s *service, off int64, read bool) {
			switch {
			case off == 0 && !read:
				f.do(s, &f.flip)
			case off == 0 && read:
				f.do(s, &f.revert)
			}
		}
	}, "CRC mismatch")
}

// TestECOwnerShareDiffers: a parity row holds bytes of a rank's share of
// a step that are not those of its commit (sent under its name before, as
// an earlier encoding of bytes that were not the commit's would have):
// the rank's own, correct, encoding is refused there, no resend can
// replace them, and the rank fails with a CorruptError that says so,
// rather than retrying for ever.
func TestECOwnerShareDiffers(t *testing.T) {
	j := newECJob(t, 2, 2, 1, true)
	for _, er := range j.rs {
		er.protect(0, 0)
	}
	j.waitReplicated(0)
	j.c.publishG()
	w := rawMembers(j)[0]
	h := j.c.hosts[j.c.hostOf[w.owner]]
	w.salt, w.epoch, w.gen = 1, h.place().epoch, h.Gen()
	// The owner's first chunk is its first region (ecChunkSize is more).
	if err := w.chunk(1, 0, 0, int(ecRegions(w.owner)[0].Size)); err != nil {
		t.Fatal(err)
	}
	for _, er := range j.rs {
		er.protect(1, 0)
	}
	select {
	case f := <-j.c.failed:
		ce, ok := errors.AsType[*CorruptError](f.err)
		if f.rank != w.owner || !ok || ce.Step != 1 || !strings.Contains(f.err.Error(), "parity row 0") {
			t.Fatalf("failure %+v, want rank %d's step 1 corrupt at parity row 0", f, w.owner)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the rank did not fail")
	}
	if _, err := j.readRow(0, 1); err == nil {
		t.Fatal("row 0 of step 1 is complete")
	}
}

// lockedBuf is an io.Writer for a logger shared by goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestECRowNoRoom: a parity host whose replicas' memory is full refuses a
// row's buffer: it logs the error, and the owners report the host as a
// replica holder does whose put does not fit (Config.LinkFailed, with
// the holder's reason), rather than retrying in silence; their step is not
// replicated until there is room, then it is.
func TestECRowNoRoom(t *testing.T) {
	limit := physicalMemory() / 2
	if limit == 0 {
		t.Skip("the host's memory is unknown: no limit to reach")
	}
	logs := make([]*lockedBuf, 4)
	j := newECJobWith(t, 2, 2, 1, true, func(cfg *Config) {
		logs[cfg.Host] = &lockedBuf{}
		cfg.Log = slog.New(slog.NewTextHandler(logs[cfg.Host], nil))
	})
	for _, er := range j.rs {
		er.protect(0, 0)
	}
	j.waitReplicated(0)
	j.c.publishG()
	ph, _ := j.rowHost(0)
	st := j.c.hosts[ph].store
	st.mu.Lock()
	pad := limit - st.bytes - 100
	st.bytes += pad
	st.mu.Unlock()
	for _, er := range j.rs {
		er.protect(1, 0)
	}
	deadline := time.After(10 * time.Second)
	for found := false; !found; {
		select {
		case lf := <-j.c.links:
			found = lf.to == ph && strings.Contains(lf.err.Error(), "memory")
		case <-deadline:
			t.Fatal("no owner reported the parity host that has no room")
		}
	}
	for r := range j.c.hostOf {
		if p := j.c.progress(r); p.Replicated >= 1 {
			t.Fatalf("rank %d's step 1 is replicated while parity row 0 has no room: %+v", r, p)
		}
	}
	j.c.waitFor("the parity host's log", func() bool {
		s := logs[ph].String()
		return strings.Contains(s, "level=ERROR") && strings.Contains(s, "parity row") && strings.Contains(s, "memory")
	})
	st.mu.Lock()
	st.bytes -= pad
	st.mu.Unlock()
	j.waitReplicated(1)
	if _, err := j.readRow(0, 1); err != nil {
		t.Fatal(err)
	}
}
