package launcher

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// outputMux writes the ranks' output: whole lines, tagged with the rank
// (and a timestamp) on the terminal, or raw into one directory per rank.
// Reports of the launcher itself go through it too, so nothing is ever
// interleaved mid-line.
//
// Nothing that posts to it waits for a write: each destination has a
// lane, a goroutine of its own that writes in the order things were posted
// (stdout, with the output files; stderr, with the launcher's reports). A
// reader that stops reading (a paused pager, a terminal stopped with
// Ctrl-S) holds back its own lane only, never the control-plane handler
// that posts frames, heartbeats or the job's loop, so a slow terminal
// cannot look like a lost host (DESIGN.md §4). What a stalled lane has
// not written waits in its queue, which flow control bounds: with flow
// set, each frame is acknowledged to its agent once written (outputFlow),
// and an agent sends at most wire.OutputWindow bytes ahead of that, so
// a stalled reader holds the ranks back in write(), not gorun's memory.
//
// When stdout and stderr are one destination (a terminal, or "> log
// 2>&1"), there is one lane and one buffer for both, so the ranks' stdout
// and stderr lines and the launcher's reports appear in the order they
// were posted, as they did when the ranks wrote them.
//
// frame, report and agentLine may be called from any goroutine; drain
// waits for what was posted; close ends the lanes.
type outputMux struct {
	tag, stamp bool
	dir        string
	world      int
	// owns, when not nil, says whether host runs rank: a host's frames
	// may carry only its own ranks' output. Set before the first frame.
	owns func(host, rank int) bool
	// flow, when not nil, acknowledges the frames written (flow control).
	// Set before the first frame.
	flow *outputFlow
	// failed receives the first error writing to stdout.
	failed chan error

	out, err *lane // stdout (and the output files), stderr; one lane if shared
	shared   bool  // stdout and stderr are one destination

	// Owned by the out lane's goroutine (by close's caller once it ended).
	stdout  *bufio.Writer
	outPre  []byte
	files   map[fileKey]*os.File
	fileErr error // first error opening or writing an output file
	broken  bool  // stdout failed; output is dropped
	outToks []*frameTok
	// Owned by the err lane's goroutine (by close's caller once it ended).
	stderr  *bufio.Writer
	errPre  []byte
	errToks []*frameTok

	// The agents' log lines queued and not written, in bytes, and those
	// dropped since the last written (agentLine).
	agentBacklog, agentDropped atomic.Int64

	closeOnce sync.Once
	abandoned bool // set before the lanes close, read after they end
	// reportsBy, set by abandon when reports of the launcher's own are
	// still to be written, is when close stops waiting for them.
	reportsBy time.Time
}

type fileKey struct {
	rank   int
	stream wire.Stream
}

func newOutputMux(stdout, stderr io.Writer, world int, tag, stamp bool, dir string) *outputMux {
	m := &outputMux{
		tag: tag, stamp: stamp, dir: dir, world: world,
		stdout: bufio.NewWriterSize(stdout, 64<<10),
		stderr: bufio.NewWriterSize(stderr, 64<<10),
		files:  map[fileKey]*os.File{},
		failed: make(chan error, 1),
	}
	m.out = newLane(func() {
		m.flushStdout()
		m.settle(&m.outToks)
	})
	if dir == "" && sameDestination(stdout, stderr) {
		m.shared, m.stderr, m.err = true, m.stdout, m.out
		return m
	}
	m.err = newLane(func() {
		m.stderr.Flush()
		m.settle(&m.errToks)
	})
	return m
}

// sameDestination reports whether writers a and b write to the same
// place: the same writer, or files that are the same file (a terminal,
// a pipe, a regular file).
func sameDestination(a, b io.Writer) bool {
	if a == b {
		return true
	}
	fa, ok1 := a.(*os.File)
	fb, ok2 := b.(*os.File)
	if !ok1 || !ok2 {
		return false
	}
	sa, err1 := fa.Stat()
	sb, err2 := fb.Stat()
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// frame posts one output frame from the agent of host from (the host of
// the subject it came on). A malformed frame, one that names another host,
// or one that carries a rank that is not from's, is refused whole, before
// any of it is posted.
func (m *outputMux) frame(from int, b []byte) error {
	if m.flow == nil {
		return m.post(from, b, nil)
	}
	m.flow.received(from, len(b))
	tok := &frameTok{host: from, n: uint64(len(b))}
	err := m.post(from, b, tok)
	if err != nil {
		m.flow.wrote(from, tok.n) // refused: dropped
	}
	return err
}

// settle counts the frames a lane has written and flushed (flow control).
func (m *outputMux) settle(toks *[]*frameTok) {
	if m.flow != nil {
		m.flow.settle(*toks)
	}
	clear(*toks)
	*toks = (*toks)[:0]
}

// post posts frame b of host from to the lanes; tok, if not nil, goes
// with each part.
func (m *outputMux) post(from int, b []byte, tok *frameTok) error {
	now := time.Now()
	var outs, errs []wire.OutputRecord
	host := -1
	err := wire.DecodeOutputFrame(b, m.world, func(h int, r wire.OutputRecord) {
		host = h
		if r.Stream == wire.Stderr && m.dir == "" && !m.shared {
			errs = append(errs, r)
		} else {
			outs = append(outs, r)
		}
	})
	if err != nil {
		return err
	}
	if host != from && host != -1 {
		return fmt.Errorf("output frame of host %d on host %d's subject", host, from)
	}
	if m.owns != nil {
		for _, rs := range [][]wire.OutputRecord{outs, errs} {
			for _, r := range rs {
				if !m.owns(from, r.Rank) {
					return fmt.Errorf("output frame of host %d carries rank %d, which is not its own", from, r.Rank)
				}
			}
		}
	}
	if tok != nil {
		if len(outs) > 0 {
			tok.parts.Add(1)
		}
		if len(errs) > 0 {
			tok.parts.Add(1)
		}
		if len(outs) == 0 && len(errs) == 0 {
			m.flow.wrote(from, tok.n)
		}
	}
	if len(outs) > 0 {
		m.out.post(func() {
			for _, r := range outs {
				if m.dir != "" {
					m.toFile(r)
				} else {
					m.outPre = m.record(m.stdout, m.outPre, now, r)
				}
			}
			if tok != nil {
				m.outToks = append(m.outToks, tok)
			}
		})
	}
	if len(errs) > 0 {
		m.err.post(func() {
			for _, r := range errs {
				m.errPre = m.record(m.stderr, m.errPre, now, r)
			}
			if tok != nil {
				m.errToks = append(m.errToks, tok)
			}
		})
	}
	return nil
}

// flushStdout flushes stdout; the first failure is reported on failed,
// after which stdout output is dropped.
func (m *outputMux) flushStdout() {
	if err := m.stdout.Flush(); err != nil && !m.broken {
		m.broken = true
		m.failed <- err
	}
	if m.broken {
		m.stdout.Reset(io.Discard)
	}
}

// record writes r's lines to w, each with its prefix (built in pre, which
// it returns for reuse).
func (m *outputMux) record(w *bufio.Writer, pre []byte, now time.Time, r wire.OutputRecord) []byte {
	p := pre[:0]
	if m.stamp {
		p = now.AppendFormat(p, "2006-01-02T15:04:05.000000")
		p = append(p, ' ')
	}
	if m.tag {
		p = append(p, '[')
		p = strconv.AppendInt(p, int64(r.Rank), 10)
		p = append(p, "] "...)
	}
	data := r.Data
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		line := data
		if i >= 0 {
			line = data[:i+1]
		}
		writeLine(w, p, line)
		data = data[len(line):]
	}
	return p
}

// writeLine writes prefix and line so that the writer never passes on part
// of a line: it flushes before a line that does not fit, and a line larger
// than the whole buffer goes out in one write of its own. Stdout and
// stderr often share a terminal; this keeps them from cutting each
// other's lines.
func writeLine(w *bufio.Writer, prefix, line []byte) {
	n := len(prefix) + len(line)
	if n > w.Available() {
		w.Flush()
	}
	if n > w.Available() {
		// With nothing buffered, bufio passes a large write straight through.
		w.Write(append(append(make([]byte, 0, n), prefix...), line...))
		return
	}
	w.Write(prefix)
	w.Write(line)
}

// toFile runs on the out lane.
func (m *outputMux) toFile(r wire.OutputRecord) {
	k := fileKey{r.Rank, r.Stream}
	f, ok := m.files[k]
	if !ok {
		name := "stdout"
		if r.Stream == wire.Stderr {
			name = "stderr"
		}
		dir := filepath.Join(m.dir, "rank."+strconv.Itoa(r.Rank))
		var err error
		if err = os.MkdirAll(dir, 0o755); err == nil {
			f, err = os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		}
		if err != nil {
			if m.fileErr == nil {
				m.fileErr = err
				m.report("cannot write output of rank %d: %v", r.Rank, err)
			}
			return
		}
		m.files[k] = f
	}
	if _, err := f.Write(r.Data); err != nil && m.fileErr == nil {
		m.fileErr = err
		m.report("cannot write output of rank %d: %v", r.Rank, err)
	}
}

// report posts a line of the launcher's own for stderr. Unlike the
// ranks' output, it is written even if the lane is abandoned after the
// post (abandon).
func (m *outputMux) report(format string, args ...any) {
	line := fmt.Appendf(nil, "gorun: "+format+"\n", args...)
	m.err.postOwn(func() { m.stderr.Write(line) })
}

// maxAgentBacklog bounds the agents' log lines waiting for a stalled
// stderr, in bytes: past it, lines are dropped and counted. Agents' stderr
// is read all the time (an agent blocked writing its log would stop its
// loop, and so its heartbeats), and nothing else bounds it.
const maxAgentBacklog = 8 << 20

// agentLine posts a line an agent printed on its stderr (line is copied).
// While stderr is stalled with maxAgentBacklog bytes of agent lines
// queued, a line is dropped; the next line written says how many were.
func (m *outputMux) agentLine(host string, line []byte) {
	b := fmt.Appendf(nil, "gorun agent %s: %s\n", host, bytes.TrimRight(line, "\n"))
	if m.agentBacklog.Add(int64(len(b))) > maxAgentBacklog {
		m.agentBacklog.Add(-int64(len(b)))
		m.agentDropped.Add(1)
		return
	}
	m.err.post(func() {
		if n := m.agentDropped.Swap(0); n > 0 {
			fmt.Fprintf(m.stderr, "gorun: %d lines of the agents' logs dropped: stderr did not keep up\n", n)
		}
		m.stderr.Write(b)
		m.agentBacklog.Add(-int64(len(b)))
	})
}

// drain waits until everything posted before the call is written and
// flushed, or until stop is closed; it reports whether it got there.
func (m *outputMux) drain(stop <-chan struct{}) bool {
	return m.out.wait(stop) && m.err.wait(stop)
}

// abandonWait bounds how long, counted from abandon, close waits for the
// launcher's own reports posted before the abandon: time enough for a
// lane not scheduled yet, or in a write about to return, to write them;
// too little for a stalled reader to hold gorun.
const abandonWait = 500 * time.Millisecond

// abandon gives up on what is not written yet: the lanes take nothing
// more, drop the ranks' output and the agents' lines they hold, and close
// returns without waiting for them. The launcher's own reports posted
// before (report) stay queued: the lane writes them after the write under
// way, if any, and close waits up to abandonWait for that. A lane blocked
// in a write ends with that write, or with the process.
func (m *outputMux) abandon() {
	m.closeOnce.Do(func() {
		m.abandoned = true
		owes := m.out.close(true)
		if !m.shared {
			owes = m.err.close(true)
		}
		if owes {
			m.reportsBy = time.Now().Add(abandonWait)
		}
	})
}

// close writes what was posted, ends the lanes and closes the output
// files. After abandon it waits only for the launcher's reports, and
// not past abandonWait from the abandon.
func (m *outputMux) close() error {
	m.closeOnce.Do(func() {
		// The out lane reports on the err lane: it ends first.
		m.out.close(false)
		<-m.out.exited
		if !m.shared {
			m.err.close(false)
		}
	})
	if m.abandoned {
		if !m.reportsBy.IsZero() {
			t := time.NewTimer(time.Until(m.reportsBy))
			defer t.Stop()
			select {
			case <-m.err.exited:
			case <-t.C:
			}
		}
		return nil
	}
	<-m.err.exited
	for _, f := range m.files {
		if err := f.Close(); err != nil && m.fileErr == nil {
			m.fileErr = err
		}
	}
	clear(m.files)
	return m.fileErr
}

// lane runs the writes to one destination on a goroutine of its own, in
// the order they were posted, a batch at a time (what was queued when
// the last batch was done), and flushes after each batch. Posting never
// blocks.
type lane struct {
	flush  func()
	exited chan struct{} // closed when the goroutine has ended

	mu       sync.Mutex // guards the fields below
	queue    []laneWrite
	posted   uint64 // writes posted
	done     uint64 // writes done and flushed
	ownBusy  int    // writes of the launcher's own in the batch under way
	closed   bool
	wake     chan struct{} // holds a token when there is news for the goroutine
	progress chan struct{} // closed, and replaced, when done grows
}

// laneWrite is one write posted to a lane.
type laneWrite struct {
	do  func()
	own bool // the launcher's own report: close(true) keeps it
}

func newLane(flush func()) *lane {
	l := &lane{flush: flush, exited: make(chan struct{}), wake: make(chan struct{}, 1), progress: make(chan struct{})}
	go l.run()
	return l
}

// post queues w; it reports false once the lane is closed.
func (l *lane) post(w func()) bool { return l.postWrite(laneWrite{do: w}) }

// postOwn queues w, a report of the launcher's own, which close(true)
// does not drop; it reports false once the lane is closed.
func (l *lane) postOwn(w func()) bool { return l.postWrite(laneWrite{do: w, own: true}) }

func (l *lane) postWrite(w laneWrite) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.queue = append(l.queue, w)
	l.posted++
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return true
}

func (l *lane) run() {
	defer close(l.exited)
	var batch []laneWrite
	for {
		l.mu.Lock()
		for len(l.queue) == 0 {
			if l.closed {
				l.mu.Unlock()
				return
			}
			l.mu.Unlock()
			<-l.wake
			l.mu.Lock()
		}
		batch, l.queue = l.queue, batch[:0]
		for _, w := range batch {
			if w.own {
				l.ownBusy++
			}
		}
		l.mu.Unlock()
		for i, w := range batch {
			w.do()
			batch[i] = laneWrite{}
		}
		l.flush()
		l.mu.Lock()
		l.ownBusy = 0
		l.done += uint64(len(batch))
		close(l.progress)
		l.progress = make(chan struct{})
		l.mu.Unlock()
	}
}

// wait waits until every write posted before the call is done (written and
// flushed), or until stop is closed; it reports whether it got there.
func (l *lane) wait(stop <-chan struct{}) bool {
	l.mu.Lock()
	target := l.posted
	l.mu.Unlock()
	for {
		l.mu.Lock()
		done, progress := l.done, l.progress
		l.mu.Unlock()
		if done >= target {
			return true
		}
		select {
		case <-progress:
		case <-l.exited:
			l.mu.Lock()
			done = l.done
			l.mu.Unlock()
			return done >= target
		case <-stop:
			return false
		}
	}
}

// close takes no more writes; the goroutine ends once it has done those
// queued, or, with drop, once the write under way (if any) returns and it
// has done those of the launcher's own queued (postOwn), the others
// dropped. It reports whether writes of the launcher's own are still to
// be done, queued or in the batch under way.
func (l *lane) close(drop bool) (owes bool) {
	l.mu.Lock()
	l.closed = true
	if drop {
		kept := l.queue[:0]
		for _, w := range l.queue {
			if w.own {
				kept = append(kept, w)
			}
		}
		clear(l.queue[len(kept):])
		l.queue = kept
	}
	owes = l.ownBusy > 0 || slices.ContainsFunc(l.queue, func(w laneWrite) bool { return w.own })
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return owes
}
