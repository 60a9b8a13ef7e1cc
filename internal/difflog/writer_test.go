package difflog_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/gorun/gorun/internal/difflog"
)

// disk is a fake Append: it records every batch, and can fail or block.
type disk struct {
	mu      sync.Mutex
	batches []string // "first-last:step,step,..." as appended
	fail    func(first, last int64) error
	entered chan int64    // if not nil, gets each batch's first step as Append begins
	gate    chan struct{} // if not nil, Append waits for a value on it
}

func (d *disk) append(first, last int64, recs [][]byte) error {
	if d.entered != nil {
		d.entered <- first
	}
	if d.gate != nil {
		<-d.gate
	}
	if d.fail != nil {
		if err := d.fail(first, last); err != nil {
			return err
		}
	}
	s := fmt.Sprintf("%d-%d:", first, last)
	for i, r := range recs {
		if i > 0 {
			s += ","
		}
		s += string(r)
	}
	d.mu.Lock()
	d.batches = append(d.batches, s)
	d.mu.Unlock()
	return nil
}

func (d *disk) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.batches)
}

// item is a step whose record is its number, and which counts its
// releases.
func item(step int64, released *sync.Map) difflog.Item {
	return difflog.Item{Step: step,
		Encode:  func(dst []byte) ([]byte, error) { return fmt.Appendf(dst, "%d", step), nil },
		Release: func() { n, _ := released.LoadOrStore(step, new(int)); *n.(*int)++ }}
}

// checkReleased fails unless each of steps was released exactly once.
func checkReleased(t *testing.T, released *sync.Map, steps ...int64) {
	t.Helper()
	for _, s := range steps {
		n, ok := released.Load(s)
		if !ok || *n.(*int) != 1 {
			t.Errorf("step %d released %v times, want once", s, n)
		}
	}
}

func newWriter(t *testing.T, cfg difflog.WriterConfig) *difflog.Writer {
	t.Helper()
	w, err := difflog.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestWriterBatches(t *testing.T) {
	d := &disk{}
	var released sync.Map
	w := newWriter(t, difflog.WriterConfig{Batch: 4, Queue: 16, Append: d.append})
	for s := int64(1); s <= 10; s++ {
		if !w.Add(item(s, &released)) {
			t.Fatalf("step %d refused", s)
		}
	}
	w.Close(context.Background())
	want := []string{"1-4:1,2,3,4", "5-8:5,6,7,8", "9-10:9,10"}
	if got := d.got(); !slices.Equal(got, want) {
		t.Errorf("batches %q, want %q", got, want)
	}
	st := w.Stats()
	if st.Steps != 10 || st.Batches != 3 || st.Dropped != 0 || st.Newest != 10 {
		t.Errorf("stats %+v", st)
	}
	checkReleased(t, &released, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	if w.Add(item(11, &released)) {
		t.Error("a closed writer took a step")
	}
	checkReleased(t, &released, 11)
}

// TestWriterNeverBlocks: with the disk stuck in an Append, Add still
// returns at once: it queues up to Queue steps, then drops (and counts)
// the rest; once the disk moves again the queued steps are written, and
// the dropped step ends the batch before it.
func TestWriterNeverBlocks(t *testing.T) {
	d := &disk{entered: make(chan int64, 16), gate: make(chan struct{})}
	var released sync.Map
	w := newWriter(t, difflog.WriterConfig{Batch: 2, Queue: 3, Append: d.append})
	w.Add(item(1, &released))
	w.Add(item(2, &released))
	if first := <-d.entered; first != 1 {
		t.Fatalf("Append of a batch from step %d, want 1", first)
	}
	// The goroutine is in Append (blocked): nothing leaves the queue.
	for s := int64(3); s <= 5; s++ {
		if !w.Add(item(s, &released)) {
			t.Fatalf("step %d refused with the queue not full", s)
		}
	}
	for s := int64(6); s <= 8; s++ {
		if w.Add(item(s, &released)) {
			t.Fatalf("step %d queued past the queue's bound", s)
		}
	}
	checkReleased(t, &released, 6, 7, 8) // dropped: released at once
	if st := w.Stats(); st.Full != 3 || st.Dropped != 3 {
		t.Errorf("stats %+v, want 3 refused and dropped", st)
	}
	close(d.gate) // the disk moves again
	for s := int64(9); s <= 10; s++ {
		if !w.Add(item(s, &released)) {
			// The queue may still be full if the goroutine has not taken
			// from it yet: that is a drop, counted, never a wait.
			t.Logf("step %d dropped", s)
		}
	}
	w.Close(context.Background())
	got := d.got()
	if len(got) < 2 || got[0] != "1-2:1,2" || got[1] != "3-4:3,4" {
		t.Fatalf("batches %q, want 1-2 and 3-4 first", got)
	}
	// Step 5 is alone: step 6 was dropped.
	if got[2] != "5-5:5" {
		t.Errorf("batch %q after 3-4, want 5-5 (the gap at 6 ends it)", got[2])
	}
	checkReleased(t, &released, 1, 2, 3, 4, 5, 9, 10)
}

// TestWriterAppendFails: a batch whose Append fails is lost (counted,
// its steps dropped); the next ones are written.
func TestWriterAppendFails(t *testing.T) {
	errDisk := errors.New("disk full")
	d := &disk{fail: func(first, last int64) error {
		if first == 3 {
			return errDisk
		}
		return nil
	}}
	var released sync.Map
	w := newWriter(t, difflog.WriterConfig{Batch: 2, Queue: 8, Append: d.append})
	for s := int64(1); s <= 6; s++ {
		w.Add(item(s, &released))
	}
	w.Close(context.Background())
	if got, want := d.got(), []string{"1-2:1,2", "5-6:5,6"}; !slices.Equal(got, want) {
		t.Errorf("batches %q, want %q", got, want)
	}
	st := w.Stats()
	if st.Failed != 1 || st.Dropped != 2 || st.Steps != 4 || st.LastErr != nil {
		t.Errorf("stats %+v, want one failed batch of 2 steps, 4 written, no error left", st)
	}
	checkReleased(t, &released, 1, 2, 3, 4, 5, 6)
}

// TestWriterEncodeFails: a step whose encoding fails is dropped and ends
// the batch in progress.
func TestWriterEncodeFails(t *testing.T) {
	d := &disk{}
	var released sync.Map
	w := newWriter(t, difflog.WriterConfig{Batch: 4, Queue: 8, Append: d.append})
	for s := int64(1); s <= 6; s++ {
		it := item(s, &released)
		if s == 3 {
			it.Encode = func([]byte) ([]byte, error) { return nil, errors.New("bad") }
		}
		w.Add(it)
	}
	w.Close(context.Background())
	if got, want := d.got(), []string{"1-2:1,2", "4-6:4,5,6"}; !slices.Equal(got, want) {
		t.Errorf("batches %q, want %q", got, want)
	}
	if st := w.Stats(); st.Dropped != 1 || st.Failed != 1 {
		t.Errorf("stats %+v", st)
	}
	checkReleased(t, &released, 1, 2, 3, 4, 5, 6)
}

// TestWriterReset: a restart to step 4 discards the steps after it that
// were added before (queued, or in the batch being collected), waits
// for an Append in progress, and the steps trained again follow step 4
// in the same batch.
func TestWriterReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &disk{entered: make(chan int64, 16), gate: make(chan struct{})}
		var released sync.Map
		w := newWriter(t, difflog.WriterConfig{Batch: 3, Queue: 8, Append: d.append})
		for s := int64(1); s <= 8; s++ {
			w.Add(item(s, &released))
		}
		if first := <-d.entered; first != 1 {
			t.Fatalf("first Append from step %d", first)
		}
		synctest.Wait() // the goroutine is in Append of 1-3, steps 4 to 8 queued
		reset := make(chan struct{})
		go func() {
			w.Reset(4)
			close(reset)
		}()
		synctest.Wait()
		select {
		case <-reset:
			t.Fatal("Reset returned while an Append was in progress")
		default:
		}
		d.gate <- struct{}{} // 1-3 is written
		<-reset
		for s := int64(5); s <= 7; s++ { // trained again after the restart
			w.Add(difflog.Item{Step: s, Encode: func(dst []byte) ([]byte, error) { return fmt.Appendf(dst, "%d'", s), nil }})
		}
		close(d.gate)
		w.Close(context.Background())
		if got, want := d.got(), []string{"1-3:1,2,3", "4-6:4,5',6'", "7-7:7'"}; !slices.Equal(got, want) {
			t.Errorf("batches %q, want %q", got, want)
		}
		checkReleased(t, &released, 1, 2, 3, 4, 5, 6, 7, 8)
		if st := w.Stats(); st.Dropped != 0 {
			t.Errorf("stats %+v: steps discarded by a restart are not lost", st)
		}
	})
}

// TestWriterResetCutsBatch: the steps after the restart's step already
// in the batch being collected go too.
func TestWriterResetCutsBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &disk{}
		var released sync.Map
		w := newWriter(t, difflog.WriterConfig{Batch: 10, Queue: 10, Append: d.append})
		for s := int64(1); s <= 5; s++ {
			w.Add(item(s, &released))
		}
		synctest.Wait() // all five collected, the batch not full
		w.Reset(2)
		w.Add(difflog.Item{Step: 3, Encode: func(dst []byte) ([]byte, error) { return append(dst, "3'"...), nil }})
		w.Close(context.Background())
		if got, want := d.got(), []string{"1-3:1,2,3'"}; !slices.Equal(got, want) {
			t.Errorf("batches %q, want %q", got, want)
		}
	})
}

// TestWriterCloseGivesUp: once Close's context ends, what is left is
// dropped, counted, and released.
func TestWriterCloseGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &disk{entered: make(chan int64, 16), gate: make(chan struct{})}
		var released sync.Map
		w := newWriter(t, difflog.WriterConfig{Batch: 1, Queue: 4, Append: d.append})
		for s := int64(1); s <= 4; s++ {
			w.Add(item(s, &released))
		}
		<-d.entered
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		closed := make(chan struct{})
		go func() {
			w.Close(ctx)
			close(closed)
		}()
		synctest.Wait()
		close(d.gate) // the Append in progress (step 1) ends
		<-closed
		if got, want := d.got(), []string{"1-1:1"}; !slices.Equal(got, want) {
			t.Errorf("batches %q, want %q", got, want)
		}
		if st := w.Stats(); st.Dropped != 3 {
			t.Errorf("stats %+v, want 3 dropped", st)
		}
		checkReleased(t, &released, 1, 2, 3, 4)
	})
}

func TestNewWriterRefuses(t *testing.T) {
	if _, err := difflog.NewWriter(difflog.WriterConfig{Batch: 0, Append: (&disk{}).append}); err == nil {
		t.Error("a batch of 0 steps accepted")
	}
	if _, err := difflog.NewWriter(difflog.WriterConfig{Batch: 1}); err == nil {
		t.Error("no Append accepted")
	}
}

// TestWriterResetTrims: a Reset has the disk trimmed after its step
// before it returns, between Appends.
func TestWriterResetTrims(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &disk{}
		var trims []int64
		w := newWriter(t, difflog.WriterConfig{Batch: 2, Queue: 8, Append: d.append,
			Trim: func(after int64) error {
				d.mu.Lock()
				defer d.mu.Unlock()
				trims = append(trims, after)
				d.batches = append(d.batches, fmt.Sprintf("trim %d", after))
				return nil
			}})
		var released sync.Map
		for s := int64(1); s <= 4; s++ {
			w.Add(item(s, &released))
		}
		synctest.Wait()
		w.Reset(3)
		w.Reset(1)
		w.Close(context.Background())
		if got, want := d.got(), []string{"1-2:1,2", "3-4:3,4", "trim 3", "trim 1"}; !slices.Equal(got, want) {
			t.Errorf("disk: %q, want %q", got, want)
		}
	})
}
