package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// setLimit sets host h's replica-memory limit (0: the default) until the
// test ends.
func setLimit(t *testing.T, h *Keeper, limit uint64) {
	h.store.mu.Lock()
	h.store.limit = limit
	h.store.mu.Unlock()
	t.Cleanup(func() {
		h.store.mu.Lock()
		h.store.limit = 0
		h.store.mu.Unlock()
	})
}

// TestECGetOverwritten: an ecGet answer is written from the row's buffer
// itself, and a newer step whose shares take that buffer (the victim of
// the ping-pong pair) while the answer is being written never changes
// the bytes sent: the answer is the row of the step asked for, whole.
// The newer step's row is complete and right too, and once the answer
// ended the reserve holds what it held before (the answered array's
// bytes, reserved while it was sent, are given back). With the reserve
// full, the newer step's chunk is refused (failNoRoom) rather than
// written into the array being sent.
func TestECGetOverwritten(t *testing.T) {
	for _, full := range []bool{false, true} {
		name := "room"
		if full {
			name = "full"
		}
		t.Run(name, func(t *testing.T) { ecGetOverwritten(t, full) })
	}
}

func ecGetOverwritten(t *testing.T, full bool) {
	j := newECJob(t, 2, 2, 1, false)
	ws := rawMembers(j)
	members := stripeMembers(j.groups[0], 0)
	for _, step := range []int64{0, 1} {
		for _, w := range ws {
			if err := w.whole(step, 0); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	host, holder := j.rowHost(0)
	hk := j.c.hosts[host]
	want0 := wantRow(t, 2, 2, members, 0, noSalt)[0]
	if got, err := j.readRow(0, 0); err != nil || !bytes.Equal(got, want0) {
		t.Fatalf("row 0 of step 0 before the race: %v", err)
	}
	before := storeBytes(hk)

	pinned, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	hook := func(h linkHdr, e ecHdr) {
		if h.step == 0 {
			close(pinned)
			<-release
		}
	}
	testHookECGetPinned.Store(&hook)
	// Before the job's hosts close: a failure must not leave the answer held.
	t.Cleanup(func() { free(); testHookECGetPinned.Store(nil) })
	type answer struct {
		got []byte
		ms  []ecMember
		err error
	}
	done := make(chan answer, 1)
	from := j.c.hosts[(host+1)%4]
	go func() {
		got := make([]byte, len(want0)+100) // past the row's end: zeros
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ms, err := from.links.ecGet(ctx, host, holder, 0, 0, 0, 0, 0, got)
		done <- answer{got, ms, err}
	}()
	select {
	case <-pinned:
	case a := <-done:
		t.Fatalf("the ecGet of step 0 ended before it was pinned: %v", a.err)
	}
	// Step 2 takes the buffer of step 0 (the older complete one).
	if full {
		setLimit(t, hk, max(storeBytes(hk), 1))
		err := ws[0].chunk(2, 0, 0, len(ecShard(ws[0].owner, 2, 0)))
		if !refusedAs(err, failNoRoom) {
			t.Fatalf("a chunk of step 2 into the buffer being sent with the reserve full: %v, want failNoRoom", err)
		}
		if n := storeBytes(hk); n != before {
			t.Fatalf("the reserve holds %d bytes after the refusal, %d before", n, before)
		}
	} else {
		for _, w := range ws {
			if err := w.whole(2, 0); err != nil {
				t.Fatalf("step 2: %v", err)
			}
		}
	}
	free()
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if !bytes.Equal(a.got[:len(want0)], want0) {
		t.Fatal("the answer of step 0 holds other bytes than its row: torn by step 2")
	}
	if bytes.ContainsFunc(a.got[len(want0):], func(r rune) bool { return r != 0 }) {
		t.Fatal("the answer past the row's end is not zeros")
	}
	if len(a.ms) != 2 || a.ms[0].rank != members[0] || a.ms[1].rank != members[1] {
		t.Fatalf("members %+v, want ranks %v", a.ms, members)
	}
	// The answer's end (unpin) follows its last byte read.
	j.c.waitFor(fmt.Sprintf("the reserve to hold its %d bytes of before the answer", before), func() bool { return storeBytes(hk) == before })
	if full {
		return
	}
	if got, err := j.readRow(0, 2); err != nil || !bytes.Equal(got, wantRow(t, 2, 2, members, 2, noSalt)[0]) {
		t.Fatalf("row 0 of step 2: %v (or other bytes)", err)
	}
	if _, err := j.readRow(0, 0); err == nil {
		t.Fatal("step 0 is still held: step 2 did not take its buffer, the race was not run")
	}
}

// TestECGetRangeReserve: a getRange answer's buffer is reserved against
// the holder's replica-memory reserve while it is used: with the reserve
// full the request is refused (failNoRoom, the link kept: the next one
// is answered), and after every answer, refused or not, the reserve
// holds what it held before.
func TestECGetRangeReserve(t *testing.T) {
	j := newECJob(t, 2, 2, 1, true)
	for _, er := range j.rs {
		er.protect(0, 0)
	}
	j.waitReplicated(0)
	const r = 0
	hk, from := j.c.hosts[r], j.c.hosts[1]
	want := ecShard(r, 0, 0)
	get := func() ([]byte, error) {
		got := make([]byte, len(want))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := from.links.getRange(ctx, r, r, r, 0, 0, got)
		return got, err
	}
	before := storeBytes(hk)
	setLimit(t, hk, before+uint64(len(want))-1)
	if _, err := get(); !refusedAs(err, failNoRoom) {
		t.Fatalf("a getRange of %d bytes with %d bytes of room: %v, want failNoRoom", len(want), len(want)-1, err)
	}
	if n := storeBytes(hk); n != before {
		t.Fatalf("the reserve holds %d bytes after a refusal, %d before", n, before)
	}
	setLimit(t, hk, before+uint64(len(want)))
	got, err := get()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a getRange with room for its buffer: %v (or other bytes)", err)
	}
	// The buffer is given back once the answer's last byte was written.
	j.c.waitFor(fmt.Sprintf("the reserve to hold its %d bytes of before the answer", before), func() bool { return storeBytes(hk) == before })
}

// TestECGetAnswerAbandoned: an ecGet answer its reader does not take
// (a host that died mid-answer: its socket stays open until TCP gives
// up) is abandoned after ecAnswerWait, and its array unpinned, so that
// the row's buffers and their reserve are not held for minutes.
func TestECGetAnswerAbandoned(t *testing.T) {
	j := newECJob(t, 2, 2, 1, false)
	ws := rawMembers(j)
	for _, w := range ws {
		if err := w.whole(0, 0); err != nil {
			t.Fatal(err)
		}
	}
	host, holder := j.rowHost(0)
	ps := j.c.hosts[host].parity
	h := linkHdr{kind: kindECGet, owner: holder, holder: holder, step: 0}
	e := ecHdr{group: 0, stripe: 0, row: 0, n: 4096, hb: noStep}
	err := abandonedAnswer(t, func(c net.Conn) error { return ps.ecGet(c, h, e) })
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ecGet to a reader that reads nothing: %v, want a deadline error", err)
	}
	r := ps.row(ecRowKey{0, 0, 0}, false)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.bufs {
		if p := r.bufs[i].pin; p != nil {
			t.Fatalf("buffer %d still pinned by %d answers", i, p.answers)
		}
	}
}

// TestECSweepPinned: a spare row swept while an ecGet answer is written
// from one of its arrays gives back the bytes of its other array at
// once, and the pinned array's only when the answer ends (unpin): the
// array stays allocated, and reserved, as long as it is being sent.
func TestECSweepPinned(t *testing.T) {
	j := newECJob(t, 2, 2, 1, false)
	ws := rawMembers(j)
	for _, step := range []int64{0, 1} {
		for _, w := range ws {
			if err := w.whole(step, 0); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	host, _ := j.rowHost(0)
	hk := j.c.hosts[host]
	ps := hk.parity
	r := ps.row(ecRowKey{0, 0, 0}, false)
	if r == nil {
		t.Fatal("no row 0 here")
	}
	ans, err := ps.pinRange(0, 0, 0, 0, 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	rowBytes, pinned := r.bytes(), uint64(len(ans.b.data))
	r.spare = true // the placement moved it elsewhere
	r.mu.Unlock()
	before := storeBytes(hk)
	ps.sweep(nil, 1<<40)
	if got, want := storeBytes(hk), before-(rowBytes-pinned); got != want {
		t.Fatalf("while pinned, after the sweep: %d bytes reserved, want %d (%d of the row's %d still sent)", got, want, pinned, rowBytes)
	}
	if ps.row(ecRowKey{0, 0, 0}, false) != nil {
		t.Fatal("the swept row is still kept")
	}
	ps.unpin(ans)
	if got, want := storeBytes(hk), before-rowBytes; got != want {
		t.Fatalf("after the answer: %d bytes reserved, want %d", got, want)
	}
}
