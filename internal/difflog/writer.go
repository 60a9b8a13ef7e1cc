package difflog

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
)

// The Writer: a rank's differentials go to disk in batches of
// WriterConfig.Batch consecutive steps, off the training path.
//
// The rank service hands each committed step to Add, which never waits:
// it puts the step in a bounded queue, or, when the queue is full (the
// disk is slower than training), drops it and counts it. The Writer's
// goroutine encodes the queued steps (Item.Encode, the copy of the
// gradient and regions into a record), collects consecutive steps into a
// batch and appends each full batch (WriterConfig.Append, in gorun
// durable.AppendBatch). A step that does not follow the batch in progress
// (one was dropped, or a restart went back) ends that batch: what it holds
// is appended as it is, consecutive, and a new batch begins. An Append that
// fails loses its batch (counted, logged); the next batches go on. The log
// on disk then simply stops being contiguous there, and a recovery that
// reads it (durable.ScanBatches) stops at the gap: a lost batch costs the
// steps a resume could have replayed, never a wrong state.
//
// Memory: the queue holds at most Queue items (their encodings not done
// yet: whatever Item holds, in gorun a reference to the step's record
// buffer), the goroutine one batch of Batch encoded records while it
// collects or appends it, and the buffers of the last batch appended,
// which the next encodings reuse.

// Item is one step handed to a Writer.
type Item struct {
	Step int64
	// Encode appends the step's record (Encode's format) to dst and
	// returns it. It runs on the Writer's goroutine.
	Encode func(dst []byte) ([]byte, error)
	// Release, if not nil, is called once when the Writer is done with
	// the item: after Encode, or when the item is dropped without it.
	Release func()
}

func (it Item) release() {
	if it.Release != nil {
		it.Release()
	}
}

// WriterConfig configures a Writer.
type WriterConfig struct {
	// Batch is the number of consecutive steps per batch (gorun
	// --diff-batch), at least 1.
	Batch int
	// Queue bounds the steps waiting to be encoded (0: 2×Batch, so that
	// the steps of one batch queue up while the one before is appended,
	// with as much again to spare).
	Queue int
	// Append writes one batch: records[i] is step first+i's record,
	// last = first+len(records)-1. It owns nothing of records after it
	// returns.
	Append func(first, last int64, records [][]byte) error
	// Trim, if not nil, removes the records of the steps after its
	// argument from disk (TrimBatches): the goroutine calls it when it
	// applies a Reset, between Appends, before Reset returns. An error
	// is logged, and the batches go on: with TrimBatches, a trim that
	// failed leaves its trim record (durable.TrimBatches), and readers
	// end the log at its step, never reading the history the restart
	// discarded, nor what is appended after, until a trim completes.
	Trim func(after int64) error
	// Log gets a warning per lost batch, at most one in a row until a
	// batch is written again (nil: discarded).
	Log *slog.Logger
}

// WriterStats are a Writer's counters.
type WriterStats struct {
	Steps   int64 // steps appended to disk
	Batches int64 // batches appended
	// Dropped are the steps lost: dropped at Add (the queue was full),
	// in a batch whose Append failed, whose encoding failed, or queued
	// when Close gave up.
	Dropped int64
	// Full counts the Adds refused because the queue was full;
	// Failed the batches whose Append (or a step's Encode) failed.
	Full    int64
	Failed  int64
	LastErr error // the last Append or Encode error, or nil
	// Newest is the newest step appended to disk, or -1.
	Newest int64
}

// Writer appends one rank's differential records to disk in batches.
// Make one with NewWriter; it runs a goroutine until Close, which waits
// for it. Its methods are safe for concurrent use.
type Writer struct {
	cfg  WriterConfig
	log  *slog.Logger
	q    chan queued
	kick chan struct{} // a Reset waits for the goroutine
	done chan struct{} // closed when the goroutine ends

	mu sync.Mutex // guards the fields below
	// gen counts Resets; resets are those the goroutine has not seen
	// every queued item of older generations for (see cutOf).
	gen     uint64
	applied uint64 // the newest generation whose Reset the goroutine applied
	resets  []reset
	closed  bool
	stop    context.Context // Close's: once it ends, the goroutine drops what is left
	stats   WriterStats
	cond    *sync.Cond // signalled when applied grows

	// free are buffers of records appended already, for the next
	// encodings (owned by the goroutine; at most Batch of them).
	free [][]byte
}

type reset struct {
	after int64  // steps after it are discarded
	gen   uint64 // the generation the Reset began
}

// queued is an item and the generation it was added in.
type queued struct {
	Item
	gen uint64
}

// NewWriter starts a Writer. cfg.Append must not be nil.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if cfg.Batch < 1 || cfg.Append == nil {
		return nil, fmt.Errorf("difflog: a writer needs batches of at least 1 step (not %d) and an Append function", cfg.Batch)
	}
	cfg.Queue = cmp.Or(max(cfg.Queue, 0), 2*cfg.Batch)
	w := &Writer{cfg: cfg, log: cfg.Log, q: make(chan queued, cfg.Queue), kick: make(chan struct{}, 1), done: make(chan struct{})}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	w.cond = sync.NewCond(&w.mu)
	w.stats.Newest = -1
	go w.run()
	return w, nil
}

// Add hands step it.Step to the writer and returns at once: true if it
// was queued, false if it was dropped (the queue is full, or the writer
// is closed), in which case it.Release was called.
func (w *Writer) Add(it Item) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		it.release()
		return false
	}
	select {
	case w.q <- queued{it, w.gen}:
		return true
	default:
		w.stats.Full++
		w.stats.Dropped++
		it.release()
		return false
	}
}

// Reset discards the steps after after that were added before it (a
// restart resumes from after: its later steps are trained again, and
// their old records must not reach the disk). When it returns, no batch
// holding such a step is being appended or will be: the caller may then
// remove the batches on disk after after (durable.Store.Truncate). It
// waits for an Append in progress.
func (w *Writer) Reset(after int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		for !w.doneLocked() {
			w.cond.Wait()
		}
		return
	}
	w.gen++
	gen := w.gen
	w.resets = append(w.resets, reset{after: after, gen: gen})
	select {
	case w.kick <- struct{}{}:
	default:
	}
	for w.applied < gen && !w.doneLocked() {
		w.cond.Wait()
	}
}

// doneLocked reports whether the goroutine ended. w.mu is held.
func (w *Writer) doneLocked() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// Close stops taking steps, appends what is queued and collected (a
// last batch shorter than Batch too) until ctx ends, drops the rest
// (counted), and waits for the goroutine.
func (w *Writer) Close(ctx context.Context) {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		w.stop = ctx
		close(w.q)
	}
	w.mu.Unlock()
	<-w.done
}

// Stats returns the writer's counters.
func (w *Writer) Stats() WriterStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// cutOf returns the newest step an item of generation gen may be of:
// the least after of the Resets since gen (MaxStep without any). w.mu is
// held.
func (w *Writer) cutOf(gen uint64) int64 {
	cut := int64(MaxStep)
	for _, r := range w.resets {
		if r.gen > gen {
			cut = min(cut, r.after)
		}
	}
	return cut
}

// entry is a step of the batch being collected.
type entry struct {
	step int64
	gen  uint64
	rec  []byte
}

// run is the writer's goroutine: it takes the queued steps in order,
// applies the Resets, collects batches and appends them.
func (w *Writer) run() {
	defer func() {
		w.mu.Lock()
		close(w.done)
		w.cond.Broadcast()
		w.mu.Unlock()
	}()
	var batch []entry
	for {
		var it queued
		var ok, kicked bool
		select {
		case it, ok = <-w.q:
			if !ok {
				w.applyResets(&batch)
				w.flush(&batch)
				return
			}
		case <-w.kick:
			kicked = true
		}
		w.applyResets(&batch)
		if kicked {
			continue
		}
		w.mu.Lock()
		cut := w.cutOf(it.gen)
		// FIFO: no item older than it is left, so the Resets it has
		// seen concern nothing queued any more.
		w.resets = slices.DeleteFunc(w.resets, func(r reset) bool { return r.gen <= it.gen })
		w.mu.Unlock()
		if it.Step > cut {
			it.release() // discarded by a restart
			continue
		}
		if w.stopped() {
			it.release()
			w.count(func(s *WriterStats) { s.Dropped++ })
			continue
		}
		if n := len(batch); n > 0 && it.Step != batch[n-1].step+1 {
			w.flush(&batch) // a gap, or a restart went back: the batch ends here
		}
		var dst []byte
		if n := len(w.free); n > 0 {
			dst, w.free = w.free[n-1][:0], w.free[:n-1]
		}
		rec, err := it.Encode(dst)
		it.release()
		if err != nil {
			w.flush(&batch)
			w.count(func(s *WriterStats) { s.Dropped++; s.Failed++; s.LastErr = err })
			w.log.Warn("the differential log on disk lost a step: its record could not be encoded", "step", it.Step, "err", err)
			continue
		}
		batch = append(batch, entry{step: it.Step, gen: it.gen, rec: rec})
		if len(batch) >= w.cfg.Batch {
			w.flush(&batch)
		}
	}
}

// applyResets applies the Resets not applied yet to the batch being
// collected (its steps after a Reset's step, of older generations, go)
// and to the disk (Trim), then tells Reset.
func (w *Writer) applyResets(batch *[]entry) {
	w.mu.Lock()
	if w.applied == w.gen {
		w.mu.Unlock()
		return
	}
	gen := w.gen
	trim := int64(MaxStep)
	for _, r := range w.resets {
		if r.gen > w.applied {
			trim = min(trim, r.after)
		}
	}
	b := *batch
	for len(b) > 0 {
		e := b[len(b)-1]
		if e.step <= w.cutOf(e.gen) {
			break
		}
		b = b[:len(b)-1]
	}
	*batch = b
	w.mu.Unlock()
	if w.cfg.Trim != nil && trim < MaxStep {
		if err := w.cfg.Trim(trim); err != nil {
			w.log.Warn("cannot remove the differentials a restart discarded from disk", "after step", trim, "err", err)
		}
	}
	w.mu.Lock()
	w.applied = gen
	w.cond.Broadcast()
	w.mu.Unlock()
}

// stopped reports whether Close's context ended.
func (w *Writer) stopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stop != nil && w.stop.Err() != nil
}

// count changes the counters under w.mu.
func (w *Writer) count(f func(*WriterStats)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.stats)
}

// flush appends the batch collected, if any, and empties it.
func (w *Writer) flush(batch *[]entry) {
	b := *batch
	*batch = b[:0]
	if len(b) == 0 {
		return
	}
	first, last := b[0].step, b[len(b)-1].step
	if w.stopped() {
		w.count(func(s *WriterStats) { s.Dropped += int64(len(b)) })
		return
	}
	recs := make([][]byte, len(b))
	for i, e := range b {
		recs[i] = e.rec
	}
	err := w.cfg.Append(first, last, recs)
	w.mu.Lock()
	lastErr := w.stats.LastErr
	if err != nil {
		w.stats.Dropped += int64(len(b))
		w.stats.Failed++
		w.stats.LastErr = err
	} else {
		w.stats.Steps += int64(len(b))
		w.stats.Batches++
		w.stats.Newest = max(w.stats.Newest, last)
		w.stats.LastErr = nil
	}
	w.mu.Unlock()
	switch {
	case err != nil && lastErr == nil:
		w.log.Warn("the differential log on disk lost a batch: a resume from disk cannot replay past its first step until the next base", "steps", fmt.Sprintf("%d-%d", first, last), "err", err)
	case err == nil && lastErr != nil:
		w.log.Info("the differential log on disk is written again", "steps", fmt.Sprintf("%d-%d", first, last))
	}
	for _, r := range recs {
		if len(w.free) < w.cfg.Batch {
			w.free = append(w.free, r)
		}
	}
	clear(b)
}
