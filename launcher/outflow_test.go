package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// ackLog records the acks an outputFlow sends.
type ackLog struct {
	mu   sync.Mutex
	acks []string // "host:bytes"
	sent chan struct{}
}

func newAckLog() *ackLog { return &ackLog{sent: make(chan struct{}, 1<<10)} }

func (a *ackLog) send(host int, n uint64) {
	a.mu.Lock()
	a.acks = append(a.acks, fmt.Sprintf("%d:%d", host, n))
	a.mu.Unlock()
	a.sent <- struct{}{}
}

func (a *ackLog) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.acks, " ")
}

// TestOutputAckCoalescing: acks are cumulative per host and sent only
// once at least every bytes more are written since the last.
func TestOutputAckCoalescing(t *testing.T) {
	type w struct {
		host int
		n    uint64
	}
	tests := []struct {
		name   string
		every  uint64
		writes []w
		want   string
	}{
		{"below the threshold", 100, []w{{0, 40}, {0, 59}}, ""},
		{"at the threshold", 100, []w{{0, 40}, {0, 60}}, "0:100"},
		{"cumulative", 100, []w{{0, 150}, {0, 50}, {0, 99}, {0, 1}}, "0:150 0:299"},
		{"per host", 100, []w{{0, 60}, {1, 60}, {0, 60}, {1, 30}, {1, 10}}, "0:120 1:100"},
		{"one ack for many frames", 1000, []w{{2, 100}, {2, 100}, {2, 100}, {2, 100}, {2, 100}, {2, 100}, {2, 100}, {2, 100}, {2, 100}, {2, 100}}, "2:1000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := newAckLog()
			f := newOutputFlow(3, tt.every, log.send)
			for _, x := range tt.writes {
				f.received(x.host, int(x.n))
				f.wrote(x.host, x.n)
			}
			if got := log.String(); got != tt.want {
				t.Errorf("acks %q, want %q", got, tt.want)
			}
		})
	}
}

// TestOutputFlowEnd: a host's output is complete for a generation once
// its end marker for that generation (or a later one) has come; a marker
// counting bytes that never arrived is an error, but ends it all the same.
func TestOutputFlowEnd(t *testing.T) {
	f := newOutputFlow(2, 10, nil)
	f.received(1, 50)
	ch := f.changes()
	if f.complete(1, 0) {
		t.Fatal("complete before the end marker")
	}
	if err := f.ended(1, 0, 50); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Error("the end marker did not signal a change")
	}
	if !f.complete(1, 0) || f.complete(1, 1) || f.complete(0, 0) {
		t.Error("complete: want host 1 generation 0 only")
	}
	if err := f.ended(1, 1, 60); err == nil {
		t.Error("a marker counting 60 bytes of 50 received is not an error")
	}
	if !f.complete(1, 1) {
		t.Error("host 1 generation 1 not complete after its marker")
	}
}

// TestOutputMuxAcksWhatIsWritten: the mux acknowledges a frame only once
// every part of it (stdout and stderr) is written and flushed, and a
// refused frame at once, so that no agent waits for ever.
func TestOutputMuxAcksWhatIsWritten(t *testing.T) {
	out := &stalledWriter{release: make(chan struct{}), started: make(chan struct{})}
	var stderr bytes.Buffer
	m := newOutputMux(out, &stderr, 4, true, false, "")
	log := newAckLog()
	m.flow = newOutputFlow(2, 1, log.send) // every write acknowledged
	m.owns = func(host, rank int) bool { return rank/2 == host }

	both := frameOf(1, rec{2, wire.Stdout, "out\n"}, rec{3, wire.Stderr, "err\n"})
	if err := m.frame(1, both); err != nil {
		t.Fatal(err)
	}
	<-out.started // stdout is stalled: the frame is half written
	bad := frameOf(0, rec{3, wire.Stdout, "not host 0's rank\n"})
	if err := m.frame(0, bad); err == nil {
		t.Fatal("a frame with another host's rank was taken")
	}
	select {
	case <-log.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the refused frame was not acknowledged")
	}
	if got, want := log.String(), fmt.Sprintf("0:%d", len(bad)); got != want {
		t.Fatalf("acks %q while stdout is stalled, want only the refused frame's %q", got, want)
	}
	close(out.release)
	select {
	case <-log.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the frame was not acknowledged once written")
	}
	if got, want := log.String(), fmt.Sprintf("0:%d 1:%d", len(bad), len(both)); got != want {
		t.Errorf("acks %q, want %q", got, want)
	}
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
}

// TestOutputMuxAcksAfterStdoutBreaks: once stdout fails, output is
// dropped, and acknowledged all the same.
func TestOutputMuxAcksAfterStdoutBreaks(t *testing.T) {
	out := &failingWriter{err: errors.New("broken pipe")}
	m := newOutputMux(out, &bytes.Buffer{}, 1, false, false, "")
	log := newAckLog()
	m.flow = newOutputFlow(1, 1, log.send)
	var total int
	for i := range 3 {
		b := frameOf(0, rec{0, wire.Stdout, fmt.Sprintf("line %d %s\n", i, strings.Repeat("x", 100<<10))})
		total += len(b)
		if err := m.frame(0, b); err != nil {
			t.Fatal(err)
		}
	}
	if !m.drain(nil) {
		t.Fatal("drain did not finish")
	}
	m.close()
	if got := log.String(); !strings.HasSuffix(got, fmt.Sprintf("0:%d", total)) {
		t.Errorf("acks %q, want the last to be of all %d bytes", got, total)
	}
}
