package keeper

import (
	"bytes"
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/gorun/gorun/replay"
)

// poisonBuffers has the pools poison every buffer they take back for the
// rest of the test.
func poisonBuffers(t *testing.T) {
	testPoisonBuffers.Store(true)
	t.Cleanup(func() { testPoisonBuffers.Store(false) })
}

// TestBufPool: get returns a kept buffer of the capacity asked (the most
// recently put first) or nil; put keeps at most max (dropping the
// oldest), and poisons in tests; a refBuf's buffer goes back only at the
// last release, and a release too many panics.
func TestBufPool(t *testing.T) {
	poisonBuffers(t)
	p := &bufPool{max: 2}
	if b := p.get(0); b != nil {
		t.Fatalf("empty pool gave %d bytes", cap(b))
	}
	a, b, c := make([]byte, 10, 100), make([]byte, 5, 50), make([]byte, 1, 200)
	p.put(a)
	p.put(b)
	p.put(c) // a goes: max 2
	if kept, _ := p.stats(); kept != 2 {
		t.Fatalf("kept %d, want 2", kept)
	}
	if !bytes.Equal(c[:cap(c)], bytes.Repeat([]byte{poisonByte}, cap(c))) {
		t.Error("put did not poison the buffer")
	}
	for _, tt := range []struct {
		n       int
		wantCap int // 0: nil
	}{
		{300, 0},
		{60, 200}, // the most recent that fits
		{0, 50},
		{0, 0},
	} {
		got := p.get(tt.n)
		if cap(got) != tt.wantCap || len(got) != 0 {
			t.Errorf("get(%d): len %d cap %d, want len 0 cap %d", tt.n, len(got), cap(got), tt.wantCap)
		}
	}
	if _, hits := p.stats(); hits != 2 {
		t.Errorf("hits %d, want 2", hits)
	}

	var rb refBuf
	buf := make([]byte, 64)
	rb.own(p, buf)
	rb.retain() // a send
	rb.release()
	if kept, _ := p.stats(); kept != 0 || buf[0] == poisonByte {
		t.Fatalf("the buffer went back with a reference left (kept %d)", kept)
	}
	rb.release()
	if kept, _ := p.stats(); kept != 1 || buf[0] != poisonByte {
		t.Fatalf("the last release did not give the buffer back (kept %d)", kept)
	}
	// Each misuse on a buffer of its own, released (a map's order would
	// let one misuse undo the other's count).
	for _, tc := range []struct {
		name string
		f    func(*refBuf)
	}{{"release", (*refBuf).release}, {"retain", (*refBuf).retain}} {
		var rb refBuf
		rb.own(p, make([]byte, 8))
		rb.release()
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s after the last release did not panic", tc.name)
				}
			}()
			tc.f(&rb)
		}()
	}
}

// TestDiffRecordNotRecycledWhileSent: the holder is slow to take rank 0's
// differential of step 4 (its send is held just before the write) while
// the rank commits steps 5 to 12, so that the queue drops step 4 and the
// rank's later records are encoded into pooled buffers. The record of
// step 4 must stay intact until its send ends: the bytes written are
// those of step 4's gradient (the pool poisons every buffer it takes
// back, so a buffer recycled while the send held it would show the
// poison or another step's record), and the holder restores step 4
// bitwise from them. Run it with -race as well.
func TestDiffRecordNotRecycledWhileSent(t *testing.T) {
	poisonBuffers(t)
	const held = 4
	entered, release, checked, wrote := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	openRelease, openChecked := sync.OnceFunc(func() { close(release) }), sync.OnceFunc(func() { close(checked) })
	var once sync.Once
	var before, atWrite []byte // step 4's record when its send began, and when it wrote (before wrote is closed)
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if h.owner != 0 {
			return bufs
		}
		mine := false
		if h.kind == kindDiff && h.step == held {
			once.Do(func() { mine = true })
		}
		if mine {
			b := slices.Clone(bufs[1])
			close(entered)
			<-release
			before, atWrite = b, slices.Clone(bufs[1])
			close(wrote)
			return bufs
		}
		select {
		case <-entered:
			// What follows step 4 waits until the test has checked the
			// holder's copy of it.
			if h.kind == kindDiff || h.kind == kindBase || h.kind == kindBaseChunk {
				<-checked
			}
		default:
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	c, _ := twoHostDiff(t, 100, 1000)
	t.Cleanup(func() { openRelease(); openChecked() }) // before the cluster closes, should the test fail
	dr, err := newDiffRank(t, c.hosts[0], 0, 31, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	if _, err := dr.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	stepsG(t, c, dr, 0, 0, held-1)
	ctx := context.Background()
	if err := dr.step(ctx, held); err != nil {
		t.Fatal(err)
	}
	for _, h := range c.hosts {
		h.SetG(0, held) // the test is the launcher: the stages go on
	}
	<-entered
	s := c.hosts[0].svc(0)
	r := &s.rep
	const last = 12
	for st := int64(held + 1); st <= last; st++ {
		if err := dr.step(ctx, st); err != nil {
			t.Fatal(err)
		}
		for _, h := range c.hosts {
			h.SetG(0, st)
		}
	}
	r.mu.Lock()
	first := r.dq[0].step
	r.mu.Unlock()
	_, hits := s.recs.stats()
	if first <= held || hits == 0 {
		t.Fatalf("the queue starts at step %d and the record pool served %d buffers: the test did not drop step %d's record while it was sent, nor reuse records", first, hits, held)
	}
	openRelease()
	<-wrote
	want := recordOf(t, held, dr.gradient(held))
	if !bytes.Equal(before, want) {
		t.Errorf("the record of step %d at the start of its send is not its gradient's", held)
	}
	if !bytes.Equal(atWrite, want) {
		poisoned := bytes.Count(atWrite, []byte{poisonByte})
		t.Fatalf("the record of step %d changed while its send held it (%d of %d bytes are the pool's poison): recycled too early", held, poisoned, len(atWrite))
	}
	c.waitFor("the holder to take step 4", func() bool { return stillHeld(c.hosts[1], 0, held) })
	copyOutEq(t, c.hosts[1], 0, held, dr.want(held))
	openChecked()
	c.waitFor("step 12 replicated", func() bool { return c.progress(0).Replicated >= last })
	copyOutEq(t, c.hosts[1], 0, last, dr.want(last))
}

// recordOf is the record of step with gradient g and the default (raw)
// codec, encoded the old way.
func recordOf(t *testing.T, step int64, g []float32) []byte {
	t.Helper()
	var tn replay.Tensor
	if err := replay.CompressInto(&tn, 0, g, replay.Options{Lossless: true}); err != nil {
		t.Fatal(err)
	}
	r := replay.Record{Step: uint64(step), Tensors: []*replay.Tensor{&tn}}
	b, err := r.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDiffRefreshBufferReused: base refreshes every few steps, with the
// pools poisoning what they take back: each refresh after the first
// writes its snapshot over the previous one's buffer once the holders
// have it (no new buffer), and the holder, which verifies each refresh
// against the owner's committed CRC32Cs, installs them and restores the
// committed states bitwise.
func TestDiffRefreshBufferReused(t *testing.T) {
	poisonBuffers(t)
	var mu sync.Mutex
	bufs := map[uintptr]bool{}
	c, _ := twoHostDiff(t, 4, 3)
	s := c.hosts[0].svc(0)
	testHookLinkFrame = func(h linkHdr, b net.Buffers) net.Buffers {
		if h.owner == 0 && h.kind == kindBaseChunk {
			s.rep.mu.Lock()
			if ref := s.rep.ref; ref != nil {
				mu.Lock()
				bufs[uintptr(unsafe.Pointer(unsafe.SliceData(ref.buf)))] = true
				mu.Unlock()
			}
			s.rep.mu.Unlock()
		}
		return b
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	rs := startDiffRanks(t, c, 2, 40)
	runSteps(t, c, rs, 0, 30)
	o := holderOf(c.hosts[1], 0)
	o.mu.Lock()
	st := o.cur.Stats()
	o.mu.Unlock()
	if st.Refreshes < 2 {
		t.Fatalf("the holder installed %d refreshes, want several: %+v", st.Refreshes, st)
	}
	_, hits := s.rep.refPool.stats()
	mu.Lock()
	n := len(bufs)
	mu.Unlock()
	if hits == 0 || n > 2 {
		t.Errorf("%d refreshes used %d snapshot buffers (the pool served %d): want them reused", st.Refreshes, n, hits)
	}
	g := c.publishG()
	checkTier2(t, c.hosts[0], c.hosts[1], 1, rs[0], g)
	checkTier2(t, c.hosts[1], c.hosts[0], 0, rs[1], g)
}
