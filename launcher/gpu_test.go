package launcher

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// TestGPUReportsOfAFlappingGPU: the first report of a (host, GPU, kind,
// XID) is printed and kept; its repeats are printed only every 100th, with
// the count, and not kept again; another XID is a report of its own.
func TestGPUReportsOfAFlappingGPU(t *testing.T) {
	var stderr bytes.Buffer
	j := &job{log: slog.New(slog.DiscardHandler), out: newOutputMux(io.Discard, &stderr, 4, false, false, "")}
	h := &hostAgent{name: "node7"}
	ev := func(xid uint64) *wire.Event {
		return &wire.Event{Kind: wire.EventGPU, Msg: "XID n", GPU: &wire.GPUReport{Index: 1, UUID: "GPU-1", Kind: "xid", XID: xid, Class: wire.GPUTransient, Ranks: []int{3}}}
	}
	for range 250 {
		j.onGPUEvent(h, ev(13))
	}
	j.onGPUEvent(h, ev(79))
	j.out.close()
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d report lines, want 4 (first, 100th, 200th, another XID):\n%s", len(lines), stderr.String())
	}
	for i, want := range []string{"used by rank 3: transient failure: XID n", "(100 times)", "(200 times)", "GPU 1 (GPU-1) on host node7"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d %q does not say %q", i, lines[i], want)
		}
	}
	if len(j.gpuFailures) != 2 {
		t.Errorf("%d reports kept, want 2 (one per XID)", len(j.gpuFailures))
	}
}
