package agent

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// pumpThrough writes input into a pipe in chunks of the given sizes (cycled)
// while pump reads the other end, and returns the records pump produced.
func pumpThrough(t *testing.T, s *outputSink, input []byte, chunks []int) []wire.OutputRecord {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	b := s.batcher(0, time.Hour)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.openStream(5, wire.Stderr, 0, newRankOutput()).pump(r)
	}()
	rest := input
	for i := 0; len(rest) > 0; i++ {
		n := min(chunks[i%len(chunks)], len(rest))
		if _, err := w.Write(rest[:n]); err != nil {
			t.Error(err)
			break
		}
		rest = rest[n:]
	}
	w.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("pump did not return after the pipe closed")
	}
	b.Close()
	recs := records(s.drain())
	for i, rec := range recs {
		if rec.Rank != 5 || rec.Stream != wire.Stderr {
			t.Fatalf("record %d: rank %d stream %d, want 5 %d", i, rec.Rank, rec.Stream, wire.Stderr)
		}
		if len(rec.Data) == 0 || rec.Data[len(rec.Data)-1] != '\n' {
			t.Fatalf("record %d does not end in a newline: %.40q…", i, rec.Data)
		}
		if len(rec.Data) > wire.MaxLine+1 {
			t.Fatalf("record %d is %d bytes, more than MaxLine+1", i, len(rec.Data))
		}
	}
	return recs
}

// reassemble undoes pump's splitting: a record of MaxLine+1 bytes is a
// piece of a longer line, whose last newline pump added.
func reassemble(recs []wire.OutputRecord) []byte {
	var out []byte
	for _, r := range recs {
		d := r.Data
		if len(d) == wire.MaxLine+1 {
			d = d[:len(d)-1]
		}
		out = append(out, d...)
	}
	return out
}

// checkWholeLines checks that every record is a run of whole lines of the
// input: its boundaries fall on line boundaries.
func checkWholeLines(t *testing.T, recs []wire.OutputRecord, input []byte) {
	t.Helper()
	off := 0
	for i, r := range recs {
		off += len(r.Data)
		if off > len(input) || input[off-1] != '\n' {
			t.Fatalf("record %d ends mid-line (offset %d)", i, off)
		}
	}
}

func TestPumpOddChunks(t *testing.T) {
	s := newOutputSink(t)
	var in bytes.Buffer
	for i := range 3000 {
		fmt.Fprintf(&in, "line %d %s\n", i, strings.Repeat("y", i*7%301))
	}
	in.WriteString("\n\n") // empty lines survive
	for _, chunks := range [][]int{{1}, {3, 7, 1, 13}, {4095, 1, 4097}, {65535, 2}, {1 << 20}} {
		t.Run(fmt.Sprint(chunks), func(t *testing.T) {
			recs := pumpThrough(t, s, in.Bytes(), chunks)
			if got := reassemble(recs); !bytes.Equal(got, in.Bytes()) {
				t.Fatalf("output differs from input: %d bytes, want %d", len(got), in.Len())
			}
			checkWholeLines(t, recs, in.Bytes())
		})
	}
}

func TestPumpFinalLineGetsNewline(t *testing.T) {
	s := newOutputSink(t)
	for _, tt := range []struct{ in, out string }{
		{"a\nb", "a\nb\n"},
		{"no newline at all", "no newline at all\n"},
		{"x", "x\n"},
		{"", ""},
		{"ends well\n", "ends well\n"},
	} {
		recs := pumpThrough(t, s, []byte(tt.in), []int{1, 2})
		if got := string(reassemble(recs)); got != tt.out {
			t.Errorf("pump(%q) = %q, want %q", tt.in, got, tt.out)
		}
	}
}

func TestPumpLongLines(t *testing.T) {
	s := newOutputSink(t)
	long := func(n int, c byte) string { return strings.Repeat(string(c), n) }
	tests := []struct {
		name   string
		in     string
		forced int // pieces cut at MaxLine bytes
	}{
		{"3.x times MaxLine", "before\n" + long(3*wire.MaxLine+100, 'a') + "\nafter\n", 3},
		{"MaxLine+1", long(wire.MaxLine+1, 'b') + "\n", 1},
		{"no newline at the end", "x\n" + long(2*wire.MaxLine+5, 'c'), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, chunks := range [][]int{{1 << 20}, {999, 17}} {
				recs := pumpThrough(t, s, []byte(tt.in), chunks)
				want := tt.in
				if !strings.HasSuffix(want, "\n") {
					want += "\n"
				}
				if got := reassemble(recs); string(got) != want {
					t.Fatalf("chunks %v: reassembled output differs from input: %d bytes, want %d", chunks, len(got), len(want))
				}
				forced := 0
				for _, r := range recs {
					if len(r.Data) == wire.MaxLine+1 {
						if bytes.IndexByte(r.Data, '\n') != wire.MaxLine {
							t.Errorf("chunks %v: a cut piece holds a newline before its end", chunks)
						}
						forced++
					}
				}
				if forced != tt.forced {
					t.Errorf("chunks %v: long line cut %d times, want %d", chunks, forced, tt.forced)
				}
			}
		})
	}
}

// A line of up to MaxLine bytes with its newline is forwarded whole, however
// it arrives and wherever it starts in pump's buffer.
func TestPumpKeepsLinesUpToMaxLineWhole(t *testing.T) {
	s := newOutputSink(t)
	var in bytes.Buffer
	for i := range 5 {
		in.WriteString(strings.Repeat("s", i*1000) + "\n")
		in.WriteString(strings.Repeat("L", wire.MaxLine-1) + "\n")
	}
	for _, chunks := range [][]int{{1 << 20}, {1000, 3}, {wire.MaxLine - 1}} {
		recs := pumpThrough(t, s, in.Bytes(), chunks)
		if got := reassemble(recs); !bytes.Equal(got, in.Bytes()) {
			t.Fatalf("chunks %v: output differs from input", chunks)
		}
		checkWholeLines(t, recs, in.Bytes())
	}
}

func TestBatcherFlushesWhenFull(t *testing.T) {
	s := newOutputSink(t)
	b := s.batcher(7, time.Hour)
	defer b.Close()
	b.Add(1, wire.Stdout, []byte("first\n"), false)
	line := []byte(strings.Repeat("z", 1000) + "\n")
	n := 0
	for total := len("first\n"); total < flushSize; total += len(line) + 5 {
		b.Add(2, wire.Stderr, line, false)
		n++
	}
	f, ok := s.next(30 * time.Second)
	if !ok {
		t.Fatal("no frame sent after more than flushSize bytes (delay is an hour)")
	}
	if f.host != 7 {
		t.Errorf("frame of host %d, want 7", f.host)
	}
	if len(f.records) != n+1 {
		t.Fatalf("frame has %d records, want %d", len(f.records), n+1)
	}
	if r := f.records[0]; r.Rank != 1 || r.Stream != wire.Stdout || string(r.Data) != "first\n" {
		t.Errorf("first record %+v", r)
	}
	for _, r := range f.records[1:] {
		if r.Rank != 2 || r.Stream != wire.Stderr || !bytes.Equal(r.Data, line) {
			t.Fatalf("record %d %d %.20q", r.Rank, r.Stream, r.Data)
		}
	}
	// Nothing else was queued: the next frame is empty and not sent.
	b.Flush()
	if fs := s.drain(); len(fs) != 0 {
		t.Errorf("%d more frames after the full one", len(fs))
	}
}

func TestBatcherFlushesAfterDelay(t *testing.T) {
	s := newOutputSink(t)
	const delay = 30 * time.Millisecond
	b := s.batcher(0, delay)
	defer b.Close()
	for round := range 3 {
		start := time.Now()
		b.Add(0, wire.Stdout, []byte(fmt.Sprintf("round %d a\n", round)), false)
		b.Add(1, wire.Stdout, []byte(fmt.Sprintf("round %d b", round)), true)
		f, ok := s.next(30 * time.Second)
		if !ok {
			t.Fatalf("round %d: nothing sent without Flush", round)
		}
		if el := time.Since(start); el < delay {
			t.Errorf("round %d: sent after %v, before the delay of %v", round, el, delay)
		}
		if len(f.records) != 2 || string(f.records[0].Data) != fmt.Sprintf("round %d a\n", round) ||
			string(f.records[1].Data) != fmt.Sprintf("round %d b\n", round) {
			t.Fatalf("round %d: frame %+v", round, f.records)
		}
	}
}

func TestBatcherZeroDelaySendsEveryAdd(t *testing.T) {
	s := newOutputSink(t)
	b := s.batcher(0, 0)
	defer b.Close()
	for i := range 5 {
		b.Add(i, wire.Stdout, []byte("x\n"), false)
	}
	fs := s.drain()
	if len(fs) != 5 {
		t.Fatalf("%d frames for 5 records with no delay", len(fs))
	}
	for i, f := range fs {
		if len(f.records) != 1 || f.records[0].Rank != i {
			t.Errorf("frame %d: %+v", i, f.records)
		}
	}
}

func TestBatcherCloseFlushesAndDropsLaterAdds(t *testing.T) {
	s := newOutputSink(t)
	b := s.batcher(3, time.Hour)
	b.Add(0, wire.Stdout, []byte("kept\n"), false)
	b.Close()
	b.Add(0, wire.Stdout, []byte("dropped\n"), false)
	b.Add(0, wire.Stderr, []byte(strings.Repeat("d", flushSize)), true) // even a full frame
	b.Flush()
	b.Close() // twice is harmless
	fs := s.drain()
	if len(fs) != 1 || len(fs[0].records) != 1 || string(fs[0].records[0].Data) != "kept\n" || fs[0].host != 3 {
		t.Fatalf("frames after Close: %+v", fs)
	}
}

// Add copies data: pump reuses its buffer right after Add returns.
func TestBatcherCopiesData(t *testing.T) {
	s := newOutputSink(t)
	b := s.batcher(0, time.Hour)
	buf := []byte("abc\n")
	b.Add(0, wire.Stdout, buf, false)
	copy(buf, "XYZ\n")
	nl := make([]byte, 3, 10)
	copy(nl, "def")
	b.Add(0, wire.Stdout, nl, true)
	if got := nl[:4]; string(got[:3]) != "def" || got[3] != 0 {
		t.Errorf("Add with a newline wrote into the caller's spare capacity: %q", got)
	}
	b.Close()
	recs := records(s.drain())
	if len(recs) != 2 || string(recs[0].Data) != "abc\n" || string(recs[1].Data) != "def\n" {
		t.Fatalf("records %+v", recs)
	}
}

// Many ranks adding at once, with the timer flushing concurrently: every
// line arrives once, in order per rank and stream.
func TestBatcherConcurrentAdds(t *testing.T) {
	s := newOutputSink(t)
	b := s.batcher(1, time.Millisecond)
	const ranks, lines = 8, 2000
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			for i := range lines {
				st := wire.Stdout
				if i%3 == 0 {
					st = wire.Stderr
				}
				b.Add(r, st, []byte(fmt.Sprintf("%d %d %d", r, st, i)), true)
			}
		})
	}
	wg.Wait()
	b.Close()
	next := map[[2]int]int{}
	for _, rec := range records(s.drain()) {
		var r, st, i int
		if _, err := fmt.Sscanf(string(rec.Data), "%d %d %d\n", &r, &st, &i); err != nil {
			t.Fatalf("record %q: %v", rec.Data, err)
		}
		k := [2]int{r, st}
		if r != rec.Rank || st != int(rec.Stream) {
			t.Fatalf("record %q under rank %d stream %d", rec.Data, rec.Rank, rec.Stream)
		}
		for next[k] < lines && (next[k]%3 == 0) != (st == int(wire.Stderr)) {
			next[k]++
		}
		if i != next[k] {
			t.Fatalf("rank %d stream %d: line %d, want %d", r, st, i, next[k])
		}
		next[k]++
	}
	for r := range ranks {
		for _, st := range []wire.Stream{wire.Stdout, wire.Stderr} {
			k := [2]int{r, int(st)}
			for next[k] < lines && (next[k]%3 == 0) != (st == wire.Stderr) {
				next[k]++
			}
			if next[k] != lines {
				t.Errorf("rank %d stream %d: lines end at %d, want %d", r, st, next[k], lines)
			}
		}
	}
}

// TestPumpSmallOutputSmallStack: a rank that writes a line costs its
// pump a small read buffer, not a whole MaxLine's. The buffer is on the
// pump goroutine's stack: a MaxLine one grew every pump's stack to 128
// KiB, at a launch of many ranks most of the launcher's memory, its page
// faults and its garbage collections. Several pumps run, so that what
// other goroutines do meanwhile is small beside what is measured.
func TestPumpSmallOutputSmallStack(t *testing.T) {
	if raceEnabled {
		// The race detector's build moves even the old MaxLine buffer to
		// the heap: the stacks measured here would not tell the two apart.
		t.Skip("the buffer's place on the stack is measured only without -race")
	}
	const pumps = 8
	s := newOutputSink(t)
	b := s.batcher(0, time.Hour)
	defer b.Close()
	var rs, ws []*os.File
	for range pumps {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		rs, ws = append(rs, r), append(ws, w)
	}
	var before, during runtime.MemStats
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for i, r := range rs {
		st := b.openStream(i, wire.Stdout, 0, newRankOutput())
		wg.Go(func() { st.pump(r) })
	}
	for _, w := range ws {
		if _, err := w.WriteString("hello\n"); err != nil {
			t.Fatal(err)
		}
	}
	// Once every line is forwarded, every pump runs (blocked in its next
	// read) with its whole buffer on its stack.
	var got []byte
	for deadline := time.Now().Add(30 * time.Second); len(got) < pumps*len("hello\n"); {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes forwarded, want %d", len(got), pumps*len("hello\n"))
		}
		b.Flush()
		if f, ok := s.next(50 * time.Millisecond); ok {
			for _, rec := range f.records {
				got = append(got, rec.Data...)
			}
		}
	}
	runtime.ReadMemStats(&during)
	for _, w := range ws {
		w.Close()
	}
	wg.Wait()
	if want := strings.Repeat("hello\n", pumps); string(got) != want {
		t.Errorf("pumped %q, want %q", got, want)
	}
	if grew := int64(during.StackInuse) - int64(before.StackInuse); grew >= pumps*wire.MaxLine/2 {
		t.Errorf("the stacks in use grew by %d bytes while %d pumps read a line each, want less than %d", grew, pumps, pumps*wire.MaxLine/2)
	}
}
