package keeper

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

// rawShare sends rank owner's share of row at step as raw frames from
// the owner's host: chunks (off, n) in order, then the commit (unless
// commit is false). It returns the errors of each request.
type rawEC struct {
	j      *ecTestJob
	owner  int
	x      int
	stripe int
	salt   byte
	epoch  uint64
	gen    uint64
}

func (w rawEC) share(step int64, row int) ([]byte, []tableEntry) {
	codec, _ := ckpt.NewCodec(w.j.k, w.j.m)
	d := ecShard(w.owner, step, w.salt)
	shares := make([][]byte, w.j.m)
	for i := range shares {
		shares[i] = make([]byte, len(d))
	}
	if err := codec.Share(d, w.x, shares); err != nil {
		w.j.t.Fatal(err)
	}
	var t []tableEntry
	for _, reg := range ecRegions(w.owner) {
		if reg.Name != "params" {
			t = append(t, tableEntry{name: reg.Name, size: reg.Size, sum: crc32c.Checksum(ecState(w.owner, step, reg, w.salt))})
		}
	}
	return shares[row], t
}

func (w rawEC) send(kind byte, step int64, row int, off, n int64, t []tableEntry, data []byte, crc uint32) error {
	host, holder := w.j.rowHost(row)
	from := w.j.c.hosts[w.j.c.hostOf[w.owner]]
	h := linkHdr{kind: kind, owner: w.owner, holder: holder, step: step, gen: w.gen}
	e := ecHdr{group: 0, stripe: w.stripe, row: row, member: w.x, off: off, n: n, epoch: w.epoch, crc: crc}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return from.links.ecAcked(ctx, host, h, t, e, data)
}

// chunk sends bytes [a, b) of the owner's share of row at step.
func (w rawEC) chunk(step int64, row int, a, b int) error {
	sh, _ := w.share(step, row)
	return w.send(kindECChunk, step, row, int64(a), int64(len(sh)), nil, sh[a:b], crc32c.Checksum(sh[a:b]))
}

func (w rawEC) commit(step int64, row int) error {
	sh, t := w.share(step, row)
	return w.send(kindECCommit, step, row, 0, int64(len(sh)), t, nil, crc32c.Checksum(sh))
}

func (w rawEC) has(step int64, row int) error {
	sh, t := w.share(step, row)
	return w.send(kindECHas, step, row, 0, int64(len(sh)), t, nil, 0)
}

// whole sends the share in two chunks and commits it.
func (w rawEC) whole(step int64, row int) error {
	sh, _ := w.share(step, row)
	h := len(sh) / 2
	return errors.Join(w.chunk(step, row, 0, h), w.chunk(step, row, h, len(sh)), w.commit(step, row))
}

// rawMembers returns the raw senders of stripe 0's members of a 2+2 job
// whose ranks never say ProtectHello (their replicators send nothing).
func rawMembers(j *ecTestJob) []rawEC {
	var ws []rawEC
	for x, r := range stripeMembers(j.groups[0], 0) {
		ws = append(ws, rawEC{j: j, owner: r, x: x, epoch: 1})
	}
	return ws
}

func (j *ecTestJob) readRow(row int, step int64) ([]byte, error) {
	host, _ := j.rowHost(row)
	n := 0
	for _, r := range stripeMembers(j.groups[0], 0) {
		n = max(n, len(ecShard(r, step, 0)))
	}
	got := make([]byte, n)
	_, err := j.c.hosts[host].parity.read(0, 0, row, step, 0, got)
	return got, err
}

// TestECResentChunk: a chunk sent again is not XORed in twice; a chunk
// that overlaps others in part is refused; a commit before every byte of
// the share came is refused.
func TestECResentChunk(t *testing.T) {
	j := newECJob(t, 2, 2, 1, false)
	ws := rawMembers(j)
	sh, _ := ws[0].share(3, 0)
	h := len(sh) / 2
	for _, err := range []error{ws[0].chunk(3, 0, 0, h), ws[0].chunk(3, 0, 0, h)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := ws[0].commit(3, 0); err == nil {
		t.Fatal("a commit of half a share was taken")
	}
	if err := ws[0].chunk(3, 0, h-64, h+64); err == nil {
		t.Fatal("a chunk over bytes in already and bytes not was taken")
	}
	for _, err := range []error{ws[0].chunk(3, 0, h, len(sh)), ws[0].chunk(3, 0, h, len(sh)), ws[0].commit(3, 0), ws[1].whole(3, 0)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := j.readRow(0, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := wantRow(t, 2, 2, stripeMembers(j.groups[0], 0), 3, noSalt)[0]; !bytes.Equal(got, want) {
		t.Fatal("the row differs from the codec's parity after resent chunks")
	}
	// A damaged chunk is refused as such.
	host, holder := j.rowHost(1)
	from := j.c.hosts[j.c.hostOf[ws[0].owner]]
	err = from.links.ecAcked(context.Background(), host, linkHdr{kind: kindECChunk, owner: ws[0].owner, holder: holder, step: 3},
		nil, ecHdr{row: 1, n: int64(len(sh)), epoch: 1, crc: 1}, sh[:64])
	if !errors.Is(err, errPutDamaged) {
		t.Fatalf("a damaged chunk: %v", err)
	}
}

// TestECLabels: shares of different steps are never mixed; a step after
// G committed again under a newer placement (an in-place recovery: the
// same generation, other bytes) empties the row and the older label's
// shares are refused from then on; ecHas acknowledges only a share of its
// own label, except for a step up to G, which is final.
func TestECLabels(t *testing.T) {
	j := newECJob(t, 2, 2, 1, false)
	ws := rawMembers(j)
	members := stripeMembers(j.groups[0], 0)
	check := func(step int64, salt func(int) byte) {
		t.Helper()
		got, err := j.readRow(0, step)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if want := wantRow(t, 2, 2, members, step, salt)[0]; !bytes.Equal(got, want) {
			t.Fatalf("the row of step %d differs from the codec's parity", step)
		}
	}
	// Steps 5 and 6, both complete, side by side.
	for _, s := range []int64{5, 6} {
		for _, w := range ws {
			if err := w.whole(s, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	check(5, noSalt)
	check(6, noSalt)
	// Member 0 asks about step 6 under a newer label: not proven.
	w0 := ws[0]
	w0.epoch = 2
	if err := w0.has(6, 0); err == nil {
		t.Fatal("ecHas of a newer label acknowledged an older label's share")
	}
	// Member 1 commits step 6 again under label 2 with other bytes: the
	// row of step 6 is emptied.
	w1 := ws[1]
	w1.epoch, w1.salt = 2, 0x77
	if err := w1.chunk(6, 0, 0, 64); err != nil {
		t.Fatal(err)
	}
	if _, err := j.readRow(0, 6); err == nil {
		t.Fatal("the row of step 6 is still complete after a newer commit began")
	}
	if err := ws[0].has(6, 0); !errors.Is(err, errPutStale) {
		t.Fatalf("ecHas under the old label after a newer commit: %v, want stale", err)
	}
	if err := ws[0].chunk(6, 0, 0, 64); !errors.Is(err, errPutStale) {
		t.Fatalf("a chunk under the old label after a newer commit: %v, want stale", err)
	}
	sh, _ := w1.share(6, 0)
	if err := errors.Join(w1.chunk(6, 0, 64, len(sh)), w1.commit(6, 0)); err != nil {
		t.Fatal(err)
	}
	if err := w0.whole(6, 0); err != nil {
		t.Fatal(err)
	}
	check(6, func(r int) byte {
		if r == w1.owner {
			return 0x77
		}
		return 0
	})
	check(5, noSalt) // untouched
	if err := w0.has(6, 0); err != nil {
		t.Fatalf("ecHas of a share in under its label: %v", err)
	}
	// A second commit of one step under one label with other CRC32Cs is
	// refused, the row kept.
	bad := w1
	bad.salt = 0x11
	if err := bad.whole(6, 0); err == nil {
		t.Fatal("a second commit under one label with other bytes was taken")
	}
	// Step 5 is final once G passes it: an ecHas of any label is
	// answered by its tables.
	for _, h := range j.c.hosts {
		h.SetG(0, 5)
	}
	w0.epoch = 9
	if err := w0.has(5, 0); err != nil {
		t.Fatalf("ecHas of final step 5 under another label: %v", err)
	}
	// An older generation is refused after a restart; the restart
	// empties the rows after G of older generations.
	for _, h := range j.c.hosts {
		if err := h.Restart(1, 5); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := j.readRow(0, 6); err == nil {
		t.Fatal("the row of step 6 survived a restart to G = 5")
	}
	check(5, noSalt)
	if err := ws[0].chunk(7, 0, 0, 64); !errors.Is(err, errPutStale) {
		t.Fatalf("a share of generation 0 after a restart to generation 1: %v", err)
	}
}

// TestECReplicatedWaitsForRows: a rank's step counts as replicated only
// once every parity row took its share, and a stage waits at the
// overwrite rule meanwhile; an incomplete row is never served by ecGet,
// a complete one is, bitwise.
func TestECReplicatedWaitsForRows(t *testing.T) {
	j := newECJob(t, 2, 2, 1, true)
	for s := range int64(2) {
		for _, er := range j.rs {
			er.protect(s, 0)
		}
	}
	j.waitReplicated(1)
	j.c.publishG()
	release := make(chan struct{})
	var held sync.WaitGroup
	held.Add(len(j.rs))
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // nothing stays held
	setECCommitHook(t, func(h linkHdr, e ecHdr) {
		if e.row == 1 && h.step == 2 {
			held.Done()
			<-release
		}
	})
	for _, er := range j.rs {
		er.protect(2, 0)
	}
	held.Wait() // every member's commit of row 1 is held
	for r := range j.rs {
		if p := j.c.progress(r); p.Replicated != 1 {
			t.Fatalf("rank %d: Replicated %d with row 1 of step 2 not in", r, p.Replicated)
		}
	}
	if g := j.c.publishG(); g != 1 {
		t.Fatalf("G = %d", g)
	}
	staged := make(chan error, 1)
	er := j.rs[0]
	go func() {
		_, ans, err := er.sess.Handle(context.Background(), protect.TypeStage, []byte(`{"step":3}`))
		if err == nil && ans.(*protect.Staged).Err != "" {
			err = errors.New(ans.(*protect.Staged).Err)
		}
		staged <- err
	}()
	h0 := j.c.hosts[0]
	j.c.waitFor("the stage to wait", func() bool { return h0.waiters.Load() == 1 })
	// Row 0 of step 2 is complete and served bitwise; row 1 is not.
	for i := range len(j.groups[0].DataGroups[0]) {
		want := wantRow(t, 2, 2, stripeMembers(j.groups[0], i), 2, noSalt)
		for row := range 2 {
			host, holder := j.rowHost(row)
			from := j.c.hosts[(host+1)%4]
			got := make([]byte, len(want[row])-10)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			ms, err := from.links.ecGet(ctx, host, holder, 0, i, row, 2, 10, got)
			cancel()
			switch {
			case row == 1 && !errors.Is(err, errNoRow):
				t.Fatalf("ecGet of incomplete row 1: %v", err)
			case row == 0 && err != nil:
				t.Fatalf("ecGet of complete row 0: %v", err)
			case row == 0 && (!bytes.Equal(got, want[0][10:]) || len(ms) != 2 || ms[0].rank != stripeMembers(j.groups[0], i)[0]):
				t.Fatalf("ecGet of stripe %d row 0 served other bytes or members %+v", i, ms)
			}
		}
	}
	free()
	j.waitReplicated(2)
	if g := j.c.publishG(); g != 2 {
		t.Fatalf("G = %d", g)
	}
	select {
	case err := <-staged:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stage(3) still waits with G = 2")
	}
}

// TestECGetRange: bytes of a rank's shard from its own slot and from its
// clear copy, with zeros past its end, and its table.
func TestECGetRange(t *testing.T) {
	j := newECJob(t, 2, 2, 1, true)
	for _, er := range j.rs {
		er.protect(0, 0)
	}
	j.waitReplicated(0)
	for r := range j.rs {
		want := ecShard(r, 0, 0)
		srcs := [][2]int{{r, r}} // (host, holder rank): its own slot
		if hs := j.holders[r]; len(hs) > 0 {
			srcs = append(srcs, [2]int{j.c.hostOf[hs[0]], hs[0]})
		}
		for _, src := range srcs {
			from := j.c.hosts[(src[0]+1)%4]
			off := int64(len(want) - 100)
			got := make([]byte, 300)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			tab, err := from.links.getRange(ctx, src[0], src[1], r, 0, off, got)
			cancel()
			if err != nil {
				t.Fatalf("rank %d from holder %d: %v", r, src[1], err)
			}
			if !bytes.Equal(got[:100], want[off:]) || slices.ContainsFunc(got[100:], func(b byte) bool { return b != 0 }) {
				t.Fatalf("rank %d from holder %d: other bytes", r, src[1])
			}
			if len(tab) != 2 || tab[0].name != "optimizer" || tab[1].name != "meta" || int64(tableBytes(tab)) != int64(len(want)) ||
				tab[0].sum != crc32c.Checksum(want[:tab[0].size]) {
				t.Fatalf("rank %d from holder %d: table %+v", r, src[1], tab)
			}
		}
		// A step not held is refused.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := j.c.hosts[(r+1)%4].links.getRange(ctx, r, r, r, 7, 0, make([]byte, 10))
		cancel()
		if _, ok := errors.AsType[*remoteError](err); !ok {
			t.Fatalf("getRange of a step not held: %v", err)
		}
	}
}

// TestECPlacementCheck: EC layouts that do not fit the placement are
// refused.
func TestECPlacementCheck(t *testing.T) {
	good := topology.ECGroup{Hosts: []int{0, 1, 2, 3}, Data: []int{0, 1}, Parity: []int{2, 3}, DataGroups: [][]int{{0, 1}, {2, 3}}}
	hostOf := []int{0, 1, 2, 3}
	mod := func(f func(g *topology.ECGroup)) []topology.ECGroup {
		g := cloneGroup(good)
		f(&g)
		return []topology.ECGroup{g}
	}
	for _, tc := range []struct {
		name string
		ec   []topology.ECGroup
		ok   bool
	}{
		{"good", []topology.ECGroup{good}, true},
		{"rank missing", mod(func(g *topology.ECGroup) { g.DataGroups = [][]int{{0}, {2}} }), false},
		{"rank twice", mod(func(g *topology.ECGroup) { g.DataGroups = [][]int{{0, 1}, {1, 3}} }), false},
		{"unequal data groups", mod(func(g *topology.ECGroup) { g.DataGroups = [][]int{{0, 1, 2}, {3}} }), false},
		{"host in two roles", mod(func(g *topology.ECGroup) { g.Parity = []int{1, 3} }), false},
		{"host out of range", mod(func(g *topology.ECGroup) { g.Hosts[3], g.Parity[1] = 9, 9 }), false},
		{"no parity", mod(func(g *topology.ECGroup) { g.Parity, g.Hosts = nil, []int{0, 1} }), false},
	} {
		p := Placement{Ranks: []int{0}, HostOf: hostOf, EC: tc.ec}
		if err := p.check(0, 4); (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrPlacement) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
