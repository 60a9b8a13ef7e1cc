package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
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
