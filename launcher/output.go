package launcher

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// outputMux writes the ranks' output: whole lines, tagged with the rank
// (and a timestamp) on the terminal, or raw into one directory per rank.
// Reports of the launcher itself go through it too, so nothing is ever
// interleaved mid-line.
type outputMux struct {
	tag, stamp bool
	dir        string
	world      int
	// owns, when not nil, says whether host runs rank: a host's frames
	// may carry only its own ranks' output. Set before the first frame.
	owns func(host, rank int) bool

	mu     sync.Mutex // guards the fields below
	stdout *bufio.Writer
	stderr *bufio.Writer
	files  map[fileKey]*os.File
	err    error // first error opening or writing an output file
	prefix []byte
	// failed receives the first error writing to stdout.
	failed chan error
	broken bool // stdout failed; output is dropped
}

type fileKey struct {
	rank   int
	stream wire.Stream
}

func newOutputMux(stdout, stderr io.Writer, world int, tag, stamp bool, dir string) *outputMux {
	return &outputMux{
		tag: tag, stamp: stamp, dir: dir, world: world,
		stdout: bufio.NewWriterSize(stdout, 64<<10),
		stderr: bufio.NewWriterSize(stderr, 64<<10),
		files:  map[fileKey]*os.File{},
		failed: make(chan error, 1),
	}
}

// frame writes one output frame from the agent of host from (the host of
// the subject it came on). A frame that names another host, or carries a
// rank that is not from's, is refused whole.
func (m *outputMux) frame(from int, b []byte) error {
	var recs []wire.OutputRecord
	host := -1
	if err := wire.DecodeOutputFrame(b, m.world, func(h int, r wire.OutputRecord) {
		host = h
		recs = append(recs, r)
	}); err != nil {
		return err
	}
	if host != from && host != -1 {
		return fmt.Errorf("output frame of host %d on host %d's subject", host, from)
	}
	for _, r := range recs {
		if m.owns != nil && !m.owns(from, r.Rank) {
			return fmt.Errorf("output frame of host %d carries rank %d, which is not its own", from, r.Rank)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for _, r := range recs {
		m.record(now, r)
	}
	m.flush()
	return nil
}

// flush flushes both streams; the first stdout failure is reported on
// failed, after which stdout output is dropped.
func (m *outputMux) flush() {
	if err := m.stdout.Flush(); err != nil && !m.broken {
		m.broken = true
		m.failed <- err
	}
	if m.broken {
		m.stdout.Reset(io.Discard)
	}
	m.stderr.Flush()
}

func (m *outputMux) record(now time.Time, r wire.OutputRecord) {
	if m.dir != "" {
		m.toFile(r)
		return
	}
	w := m.stdout
	if r.Stream == wire.Stderr {
		w = m.stderr
	}
	p := m.prefix[:0]
	if m.stamp {
		p = now.AppendFormat(p, "2006-01-02T15:04:05.000000")
		p = append(p, ' ')
	}
	if m.tag {
		p = append(p, '[')
		p = strconv.AppendInt(p, int64(r.Rank), 10)
		p = append(p, "] "...)
	}
	m.prefix = p
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
			if m.err == nil {
				m.err = err
				fmt.Fprintf(m.stderr, "gorun: cannot write output of rank %d: %v\n", r.Rank, err)
			}
			return
		}
		m.files[k] = f
	}
	if _, err := f.Write(r.Data); err != nil && m.err == nil {
		m.err = err
		fmt.Fprintf(m.stderr, "gorun: cannot write output of rank %d: %v\n", r.Rank, err)
	}
}

// report writes a line of the launcher's own to stderr.
func (m *outputMux) report(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(m.stderr, "gorun: "+format+"\n", args...)
	m.stderr.Flush()
}

// agentLine writes a line an agent printed on its stderr.
func (m *outputMux) agentLine(host string, line []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(m.stderr, "gorun agent %s: %s\n", host, bytes.TrimRight(line, "\n"))
	m.stderr.Flush()
}

// close flushes and closes the output files.
func (m *outputMux) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stdout.Flush()
	m.stderr.Flush()
	for _, f := range m.files {
		if err := f.Close(); err != nil && m.err == nil {
			m.err = err
		}
	}
	return m.err
}
