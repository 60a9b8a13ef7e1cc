package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

// ecTestJob is a job protected with erasure coding on in-process hosts:
// per ranks on each of K+M hosts (one group), rank r on host r/per, each
// rank's optimizer region of its own size (unequal shards).
type ecTestJob struct {
	t       *testing.T
	c       *cluster
	k, m    int
	per     int
	groups  []topology.ECGroup
	holders [][]int
	rs      []*ecRank
}

// ecRank is a rank speaking to its service through a Session.
type ecRank struct {
	t       *testing.T
	r       int
	sess    *Session
	regions []protect.Region
	views   [2][][]byte
}

// protectHello says rank r's ProtectHello declaring regions on sess and
// maps the slots' region files it is answered with (unmapped at the end
// of the test).
func protectHello(t *testing.T, sess *Session, r int, regions []protect.Region) [2][][]byte {
	t.Helper()
	_, ans, err := sess.Handle(context.Background(), protect.TypeProtectHello, helloJSON(regions))
	if err != nil || ans.(*protect.ProtectWelcome).Err != "" {
		t.Fatalf("rank %d: ProtectHello: %+v, %v", r, ans, err)
	}
	views, unmap, err := mapRegionFiles(ans.(*protect.ProtectWelcome).Regions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unmap)
	return views
}

// helloJSON is a ProtectHello declaring regions.
func helloJSON(regions []protect.Region) []byte {
	hello := `{"v":1,"regions":[`
	for i, reg := range regions {
		if i > 0 {
			hello += ","
		}
		hello += fmt.Sprintf(`{"name":%q,"size":%d}`, reg.Name, reg.Size)
	}
	return []byte(hello + `]}`)
}

func ecRegions(r int) []protect.Region {
	return []protect.Region{{Name: "optimizer", Size: int64(3000 + 777*r)}, {Name: "params", Size: 256}, {Name: "meta", Size: int64(40 + r)}}
}

// ecState is rank r's bytes of region i at step (salt changes them).
func ecState(r int, step int64, reg protect.Region, salt byte) []byte {
	b := make([]byte, reg.Size)
	for j := range b {
		b[j] = byte(int64(r)*131+step*17+int64(j)*3+int64(len(reg.Name))) ^ salt
	}
	return b
}

// newECJob plans one group of k+m hosts with per ranks each and starts
// the hosts; connect says whether every rank says ProtectHello.
func newECJob(t *testing.T, k, m, per int, connect bool) *ecTestJob {
	t.Helper()
	return newECJobWith(t, k, m, per, connect, nil)
}

// newECJobWith is newECJob with mod applied to each host's configuration
// after the EC groups are set (nil: none).
func newECJobWith(t *testing.T, k, m, per int, connect bool, mod func(*Config)) *ecTestJob {
	t.Helper()
	n := k + m
	hosts := make([]topology.Host, n)
	var assign []topology.Assignment
	ranks := make([][]int, n)
	for h := range n {
		hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: per}
		for l := range per {
			r := h*per + l
			assign = append(assign, topology.Assignment{Rank: r, Host: h, LocalRank: l})
			ranks[h] = append(ranks[h], r)
		}
	}
	groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: k, M: m})
	if err != nil {
		t.Fatal(err)
	}
	// Clear copies: on the data host of the rank's data group, unless the
	// rank runs there.
	holders := make([][]int, n*per)
	for j, dg := range groups[0].DataGroups {
		dh := groups[0].Data[j]
		for _, r := range dg {
			if r/per != dh {
				holders[r] = []int{dh * per}
			}
		}
	}
	j := &ecTestJob{t: t, k: k, m: m, per: per, groups: groups, holders: holders}
	j.c = newClusterWith(t, ranks, holders, nil, func(cfg *Config) {
		cfg.EC = groups
		if mod != nil {
			mod(cfg)
		}
	})
	if connect {
		for r := range n * per {
			j.rs = append(j.rs, j.connect(r))
		}
	}
	return j
}

func (j *ecTestJob) connect(r int) *ecRank {
	j.t.Helper()
	er := &ecRank{t: j.t, r: r, sess: j.c.hosts[r/j.per].Session(r), regions: ecRegions(r)}
	er.views = protectHello(j.t, er.sess, r, er.regions)
	return er
}

// protect stages, writes and commits step (its bytes changed by salt)
// and returns the slot.
func (er *ecRank) protect(step int64, salt byte) int {
	er.t.Helper()
	req := fmt.Appendf(nil, `{"step":%d}`, step)
	_, ans, err := er.sess.Handle(context.Background(), protect.TypeStage, req)
	if err != nil || ans.(*protect.Staged).Err != "" {
		er.t.Fatalf("rank %d: Stage(%d): %+v, %v", er.r, step, ans, err)
	}
	slot := ans.(*protect.Staged).Slot
	for i, reg := range er.regions {
		copy(er.views[slot][i], ecState(er.r, step, reg, salt))
	}
	_, ans, err = er.sess.Handle(context.Background(), protect.TypeCommit, req)
	if err != nil || ans.(*protect.Committed).Err != "" {
		er.t.Fatalf("rank %d: Commit(%d): %+v, %v", er.r, step, ans, err)
	}
	return slot
}

// shard is rank r's shard at step: its replicated regions concatenated.
func ecShard(r int, step int64, salt byte) []byte {
	var out []byte
	for _, reg := range ecRegions(r) {
		if reg.Name != "params" {
			out = append(out, ecState(r, step, reg, salt)...)
		}
	}
	return out
}

// wantRow is parity row of the stripe whose members are ranks, at step:
// ckpt.Codec's parity of their shards padded to the longest.
func wantRow(t *testing.T, k, m int, members []int, step int64, salt func(r int) byte) [][]byte {
	t.Helper()
	codec, err := ckpt.NewCodec(k, m)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range members {
		n = max(n, len(ecShard(r, step, salt(r))))
	}
	rows := make([][]byte, m)
	for j := range rows {
		rows[j] = make([]byte, n)
	}
	shares := make([][]byte, m)
	for j := range shares {
		shares[j] = make([]byte, n)
	}
	for x, r := range members {
		d := make([]byte, n)
		copy(d, ecShard(r, step, salt(r)))
		if err := codec.Share(d, x, shares); err != nil {
			t.Fatal(err)
		}
		for j := range rows {
			ckpt.Accumulate(rows[j], shares[j])
		}
	}
	return rows
}

func noSalt(int) byte { return 0 }

// waitReplicated waits until every rank's Replicated is step.
func (j *ecTestJob) waitReplicated(step int64) {
	j.t.Helper()
	j.c.waitFor(fmt.Sprintf("step %d replicated", step), func() bool {
		for r := range j.c.hostOf {
			if j.c.progress(r).Replicated < step {
				return false
			}
		}
		return true
	})
}

// rowHost returns the host of parity row row and its holder rank.
func (j *ecTestJob) rowHost(row int) (int, int) {
	h := j.groups[0].Parity[row]
	return h, h * j.per
}

func stripeMembers(g topology.ECGroup, i int) []int {
	var out []int
	for _, dg := range g.DataGroups {
		out = append(out, dg[i])
	}
	return out
}

// TestECParity: after a step is replicated, every parity row held is
// bitwise ckpt.Codec's parity of the stripe's shards (unequal lengths,
// padded), cut into many chunks, for 2+1, 2+2, 4+2 and 8+4; and the row's
// members are the stripe's with their committed tables.
func TestECParity(t *testing.T) {
	defer func(n int) { ecChunkSize = n }(ecChunkSize)
	ecChunkSize = 1024
	for _, km := range [][2]int{{2, 1}, {2, 2}, {4, 2}, {8, 4}} {
		t.Run(fmt.Sprintf("%d+%d", km[0], km[1]), func(t *testing.T) {
			j := newECJob(t, km[0], km[1], 2, true)
			for s := range int64(3) {
				for _, er := range j.rs {
					er.protect(s, 0)
				}
				j.waitReplicated(s)
				j.c.publishG()
			}
			g := j.groups[0]
			for i := range len(g.DataGroups[0]) {
				members := stripeMembers(g, i)
				want := wantRow(t, km[0], km[1], members, 2, noSalt)
				for row := range km[1] {
					host, _ := j.rowHost(row)
					got := make([]byte, len(want[row])+100) // past the end: zeros
					ms, err := j.c.hosts[host].parity.read(0, i, row, 2, 0, got)
					if err != nil {
						t.Fatalf("stripe %d row %d: %v", i, row, err)
					}
					if !bytes.Equal(got[:len(want[row])], want[row]) || slices.ContainsFunc(got[len(want[row]):], func(b byte) bool { return b != 0 }) {
						t.Fatalf("stripe %d row %d differs from the codec's parity", i, row)
					}
					for x, mb := range ms {
						if mb.rank != members[x] || mb.length != int64(len(ecShard(members[x], 2, 0))) {
							t.Fatalf("stripe %d row %d member %d: %+v, want rank %d", i, row, x, mb, members[x])
						}
						for ti, e := range mb.table {
							if e.sum != crc32c.Checksum(ecState(mb.rank, 2, ecRegions(mb.rank)[[]int{0, 2}[ti]], 0)) {
								t.Fatalf("member rank %d region %s: CRC32C %08x is not its committed one", mb.rank, e.name, e.sum)
							}
						}
					}
				}
			}
		})
	}
}

// TestECTornSlot: a rank's committed slot written while its shares are
// encoded: the rank fails with a CRC mismatch, and no row of that step
// completes or is served.
func TestECTornSlot(t *testing.T) {
	j := newECJob(t, 2, 2, 1, true)
	for _, er := range j.rs {
		er.protect(0, 0)
	}
	j.waitReplicated(0)
	j.c.publishG()
	torn := j.groups[0].DataGroups[0][0]
	victim := j.c.hosts[torn].svc(torn)
	var once sync.Once
	testHookSlotRead = func(s *service) {
		if s != victim {
			return
		}
		s.mu.Lock()
		for slot, st := range s.slotStep {
			if st == 1 {
				once.Do(func() { s.views[slot][0][5] ^= 0x5a })
			}
		}
		s.mu.Unlock()
	}
	t.Cleanup(func() { testHookSlotRead = nil })
	for _, er := range j.rs {
		er.protect(1, 0)
	}
	select {
	case f := <-j.c.failed:
		var ce *CorruptError
		if f.rank != torn || !errors.As(f.err, &ce) || ce.Step != 1 || !errors.Is(f.err, ckpt.ErrCorrupt) {
			t.Fatalf("failure %+v, want rank %d's step 1 corrupt", f, torn)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the torn slot was not found")
	}
	// The other members' shares are in; the torn rank's never: no row of
	// step 1 is complete, none is served.
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
	for row := range 2 {
		host, holder := j.rowHost(row)
		if _, err := j.c.hosts[host].parity.read(0, 0, row, 1, 0, make([]byte, 10)); err == nil {
			t.Fatalf("row %d of step 1 is complete", row)
		}
		from := (host + 1) % 4
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := j.c.hosts[from].links.ecGet(ctx, host, holder, 0, 0, row, 1, 0, make([]byte, 10))
		cancel()
		if !errors.Is(err, errNoRow) {
			t.Fatalf("ecGet of row %d of step 1: %v, want a refusal", row, err)
		}
	}
}

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
	testHookECCommit = func(h linkHdr, e ecHdr) {
		if e.row == 1 && h.step == 2 {
			held.Done()
			<-release
		}
	}
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(func() { free(); testHookECCommit = nil })
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

// FuzzParseECHdr: no sub-header panics the parser, and what it accepts
// is in range and encodes back to the same bytes.
func FuzzParseECHdr(f *testing.F) {
	var b [ecHdrSize]byte
	(&ecHdr{group: 1, stripe: 2, row: 1, member: 3, crc: 7, off: 64, n: 4096, epoch: 5}).put(b[:])
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < ecHdrSize {
			return
		}
		e, err := parseECHdr(in[:ecHdrSize])
		if err != nil {
			return
		}
		if e.off < 0 || e.n < 0 || e.off+e.n > maxShard || e.row >= 256 || e.member >= 256 {
			t.Fatalf("accepted %+v", e)
		}
		var out [ecHdrSize]byte
		e.put(out[:])
		if !bytes.Equal(out[:], in[:ecHdrSize]) {
			t.Fatalf("%x encodes back as %x", in[:ecHdrSize], out)
		}
	})
}

// FuzzReadMembers: no ecGet answer panics the members' reader, and what
// it accepts is consistent.
func FuzzReadMembers(f *testing.F) {
	f.Add(appendMembers(nil, []ecMember{{rank: 1, gen: 2, epoch: 3, length: 12, table: []tableEntry{{name: "optimizer", size: 12, sum: 9}}}}))
	f.Add(appendMembers(nil, []ecMember{{rank: 1, length: 0}, {rank: 2, length: 0}}))
	f.Fuzz(func(t *testing.T, in []byte) {
		ms, err := readMembers(bytes.NewReader(in))
		if err != nil {
			return
		}
		for _, m := range ms {
			if m.length < 0 || int64(tableBytes(m.table)) != m.length {
				t.Fatalf("accepted %+v", m)
			}
		}
		if !bytes.HasPrefix(in, appendMembers(nil, ms)) {
			t.Fatal("the members do not encode back to the input")
		}
	})
}

// BenchmarkECPipeline measures the owner's erasure-coding pipeline
// (ecSend: shares, CRC32Cs and the sends to M parity hosts over loopback
// links, each host checking and XORing its share into its row) of one
// rank of a 2+2 group against the code alone over the same bytes in the
// same run, on one core:
//
//   - raw-MiB/s: reedsolomon's Encode of a whole stripe (ckpt.Codec.Encode
//     of K shards as long as the rank's, 4 MiB at a time), in bytes of
//     data (K shards) per second: the reference;
//   - share-MiB/s: ckpt.Codec.Share of the rank's shard alone (4 MiB at a
//     time into M buffers), the owner's part of the code;
//   - pipeline-MiB/s and pipeline/raw: ecSend end to end;
//   - encode-MiB/s and encode/raw: the pipeline's encoder while it works
//     (shares and CRC32Cs, not waiting for the links): the pipeline
//     without the network.
//
// Over loopback TCP on a few shared cores the links, not the pipeline,
// bound pipeline/raw; encode/raw is the figure the issue's "pipeline at
// 80% of raw Encode" is judged on (make bench-ec). GORUN_BENCH_STATE_MIB
// sets the rank's state (default 64 MiB).
func BenchmarkECPipeline(b *testing.B) {
	mib := 64
	if s := os.Getenv("GORUN_BENCH_STATE_MIB"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			b.Fatalf("GORUN_BENCH_STATE_MIB=%q: want a positive number of MiB", s)
		}
		mib = v
	}
	const k, m = 2, 2
	hosts := make([]topology.Host, k+m)
	var assign []topology.Assignment
	ranks := make([][]int, k+m)
	for h := range hosts {
		hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: 1}
		assign = append(assign, topology.Assignment{Rank: h, Host: h})
		ranks[h] = []int{h}
	}
	groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: k, M: m})
	if err != nil {
		b.Fatal(err)
	}
	// Rank 0 runs on a data host (PlanEC's first data host is host 0 for
	// one rank per host): no clear copy, only the parity rows.
	owner := groups[0].DataGroups[0][0]
	c := newClusterWith(b, ranks, nil, nil, func(cfg *Config) { cfg.EC = groups })
	h := c.hosts[c.hostOf[owner]]
	sess := h.Session(owner)
	size := int64(mib) << 20
	hello := fmt.Sprintf(`{"v":1,"regions":[{"name":"optimizer","size":%d},{"name":"meta","size":64}]}`, size)
	ctx := context.Background()
	if _, ans, err := sess.Handle(ctx, protect.TypeProtectHello, []byte(hello)); err != nil || ans.(*protect.ProtectWelcome).Err != "" {
		b.Fatalf("ProtectHello: %+v, %v", ans, err)
	}
	if _, ans, err := sess.Handle(ctx, protect.TypeStage, []byte(`{"step":0}`)); err != nil || ans.(*protect.Staged).Err != "" {
		b.Fatalf("Stage: %+v, %v", ans, err)
	}
	s := h.svc(owner)
	s.mu.Lock()
	views := s.views[0]
	s.mu.Unlock()
	for i, v := range views {
		for j := range v {
			v[j] = byte(j*7 + i + j>>13)
		}
	}
	if _, ans, err := sess.Handle(ctx, protect.TypeCommit, []byte(`{"step":0}`)); err != nil || ans.(*protect.Committed).Err != "" {
		b.Fatalf("Commit: %+v, %v", ans, err)
	}
	c.waitFor("the owner's step 0 at its parity rows", func() bool { return c.progress(owner).Replicated == 0 })
	s.mu.Lock()
	var t []tableEntry
	var data [][]byte
	for _, i := range s.repl {
		t = append(t, tableEntry{name: s.regions[i].Name, size: s.regions[i].Size, sum: s.sums[0][i]})
		data = append(data, s.views[0][i])
	}
	s.mu.Unlock()
	to := h.place().ecTargets(owner)
	known := make([]bool, len(to))
	for i := range known {
		known[i] = true
	}
	codec := h.place().ec.codec
	x := h.place().ec.pos[owner].x
	shares := make([][]byte, m)
	for j := range shares {
		shares[j] = make([]byte, ecChunkSize)
	}
	stripe := make([][]byte, k+m)
	for j := range m {
		stripe[k+j] = make([]byte, ecChunkSize)
	}
	var raw, share, pipe time.Duration
	var encNS, encoded int64
	b.SetBytes(int64(tableBytes(t)))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		for _, d := range data {
			for o := 0; o < len(d); o += ecChunkSize {
				n := min(ecChunkSize, len(d)-o)
				for xi := range k {
					stripe[xi] = d[o : o+n] // K shards of the rank's bytes
				}
				for j := range m {
					stripe[k+j] = stripe[k+j][:n]
				}
				if err := codec.Encode(stripe); err != nil {
					b.Fatal(err)
				}
			}
		}
		raw += time.Since(start)
		start = time.Now()
		for _, d := range data {
			for o := 0; o < len(d); o += ecChunkSize {
				n := min(ecChunkSize, len(d)-o)
				sub := [][]byte{shares[0][:n], shares[1][:n]}
				if err := codec.Share(d[o:o+n], x, sub); err != nil {
					b.Fatal(err)
				}
			}
		}
		share += time.Since(start)
		ns0, n0 := s.rep.ec.encodeNS.Load(), s.rep.ec.encoded.Load()
		start = time.Now()
		// A new label each time: every parity host empties its row and
		// XORs the share in.
		if _, err, _ := s.rep.ecSend(ctx, 0, 0, h.Gen(), uint64(i+1), t, data, to, known); err != nil {
			b.Fatal(err)
		}
		pipe += time.Since(start)
		encNS += s.rep.ec.encodeNS.Load() - ns0
		encoded += s.rep.ec.encoded.Load() - n0
	}
	bytes := float64(tableBytes(t)) * float64(b.N)
	mibps := func(d time.Duration) float64 { return bytes / d.Seconds() / (1 << 20) }
	rawRate := k * mibps(raw) // the stripe's K shards per raw
	b.ReportMetric(rawRate, "raw-MiB/s")
	b.ReportMetric(mibps(share), "share-MiB/s")
	b.ReportMetric(mibps(pipe), "pipeline-MiB/s")
	b.ReportMetric(mibps(pipe)/rawRate, "pipeline/raw")
	if encoded != int64(bytes) {
		b.Fatalf("the encoder counted %d bytes of %.0f", encoded, bytes)
	}
	b.ReportMetric(mibps(time.Duration(encNS)), "encode-MiB/s")
	b.ReportMetric(mibps(time.Duration(encNS))/rawRate, "encode/raw")
}

// TestReadSum: readSum fills its buffer from reads of any size (more than
// readPiece, a byte at a time) and returns the CRC32C of all its bytes; a
// stream that ends early is an io.ErrUnexpectedEOF, a failed read that
// read's error.
func TestReadSum(t *testing.T) {
	data := make([]byte, 3*readPiece+123)
	for i := range data {
		data[i] = byte(i*31 + i>>9)
	}
	broken := errors.New("broken")
	for _, tc := range []struct {
		name string
		n    int // bytes to read
		r    io.Reader
		err  error
	}{
		{"whole", len(data), bytes.NewReader(data), nil},
		{"one byte at a time", readPiece + 5, iotest.OneByteReader(bytes.NewReader(data)), nil},
		{"half reads", len(data), iotest.HalfReader(bytes.NewReader(data)), nil},
		{"short", len(data), bytes.NewReader(data[:len(data)-1]), io.ErrUnexpectedEOF},
		{"failed", len(data), io.MultiReader(bytes.NewReader(data[:readPiece+7]), iotest.ErrReader(broken)), broken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := make([]byte, tc.n)
			sum, err := readSum(tc.r, d)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if want := crc32c.Checksum(data[:tc.n]); sum != want {
				t.Errorf("CRC32C %08x, want %08x", sum, want)
			}
			if !bytes.Equal(d, data[:tc.n]) {
				t.Error("the bytes read differ")
			}
		})
	}
}
