package agent

import (
	"errors"
	"log/slog"
	"reflect"
	"testing"

	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/nats-io/nats.go"
)

// TestParsePersist: the spec's durable settings become
// keeper.Config.Persist (and the differential batch and resume
// settings are kept for the durable tier's log and resume); a batch
// outside diff mode is refused with ErrJobSpec.
func TestParsePersist(t *testing.T) {
	dir := func(s wire.JobSpec) wire.JobSpec {
		s.CkptDir, s.CkptEvery, s.CkptOverhead = "/ckpt", 10, 0.03
		return s
	}
	tests := []struct {
		name      string
		spec      wire.JobSpec
		persist   keeper.PersistConfig
		batch     int
		resume    bool
		err       string
		diffWants bool
	}{
		{"none", wire.JobSpec{}, keeper.PersistConfig{}, 0, false, "", false},
		{"full mode", dir(wire.JobSpec{}), keeper.PersistConfig{Dir: "/ckpt", Every: 10, Overhead: 0.03}, 0, false, "", false},
		{"every setting", dir(wire.JobSpec{ProtectMode: "diff", CkptConcurrency: 3, DiffBatch: 5, Resume: true}),
			keeper.PersistConfig{Dir: "/ckpt", Every: 10, Concurrency: 3, Overhead: 0.03}, 5, true, "", true},
		{"batch in full mode", dir(wire.JobSpec{DiffBatch: 5}), keeper.PersistConfig{}, 0, false, "a differential batch of 5 steps with protect mode full", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseProtect(&tt.spec)
			if tt.err != "" {
				if !errors.Is(err, ErrJobSpec) || err.Error() != ErrJobSpec.Error()+": "+tt.err {
					t.Fatalf("error %v, want ErrJobSpec saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.persist != tt.persist || got.diffBatch != tt.batch || got.resume != tt.resume || (got.mode == protect.ModeDiff) != tt.diffWants {
				t.Errorf("got %+v, want persist %+v, batch %d, resume %v", got, tt.persist, tt.batch, tt.resume)
			}
		})
	}
}

// TestPersistSpecReachesHost: an agent given a job spec with a
// checkpoint directory starts its state protection with it as
// HostConfig.Persist.
func TestPersistSpecReachesHost(t *testing.T) {
	dir := t.TempDir()
	got := make(chan keeper.Config, 1)
	with := func(c *Config) {
		c.newHost = func(hc keeper.Config) (*keeper.Keeper, error) {
			got <- hc
			return keeper.New(hc)
		}
	}
	spec := func(s *wire.JobSpec) {
		s.CkptDir, s.CkptEvery, s.CkptConcurrency, s.CkptOverhead = dir, 4, 2, 0.05
	}
	f := startFakeLauncherSpec(t, "persistspec", []int{0}, with, spec, "sleep", "3600")
	var hc keeper.Config
	select {
	case hc = <-got:
	case err := <-f.agentErr:
		f.agentErr <- err // for the cleanup
		t.Fatalf("the agent ended (%v) before starting its state protection", err)
	case <-f.ctx.Done():
		t.Fatal("the agent did not start its state protection")
	}
	if want := (keeper.PersistConfig{Dir: dir, Every: 4, Concurrency: 2, Overhead: 0.05}); hc.Persist != want {
		t.Errorf("HostConfig.Persist %+v, want %+v", hc.Persist, want)
	}
}

// TestGWatermarkReachesHost: the durable watermark and resolved step on
// G reach the host's state protection (keeper.Keeper.D and X); a G without
// them leaves them, an older one is ignored.
func TestGWatermarkReachesHost(t *testing.T) {
	a := &agent{cfg: Config{Job: "gwm", Host: 0}, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	h, err := keeper.New(keeper.Config{Job: "gwm", Host: 0, Hosts: 1, HostOf: func(int) int { return 0 }, Log: a.log,
		Persist: keeper.PersistConfig{Dir: t.TempDir(), Every: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p := &protection{a: a, host: h}
	d := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		g     wire.GlobalStep
		wantD int64
		wantX int64
	}{
		{wire.GlobalStep{G: 5}, -1, -1},
		{wire.GlobalStep{G: 5, D: d(4)}, 4, -1},
		{wire.GlobalStep{G: 9}, 4, -1},
		{wire.GlobalStep{G: 9, D: d(2)}, 4, -1}, // older: ignored
		{wire.GlobalStep{G: 9, D: d(8)}, 8, -1},
		{wire.GlobalStep{G: 9, X: d(3)}, 8, 3},
		{wire.GlobalStep{G: 12, D: d(8), X: d(12)}, 8, 12},
		{wire.GlobalStep{G: 12, D: d(8), X: d(10)}, 8, 12}, // older: ignored
		{wire.GlobalStep{G: 16, D: d(16), X: d(16)}, 16, 16},
	} {
		p.onG(&nats.Msg{Data: wire.Marshal(&tc.g)})
		if d, x := h.D(), h.X(); d != tc.wantD || x != tc.wantX {
			t.Fatalf("after G %d with D %v, X %v: host's D = %d, X = %d; want %d and %d", tc.g.G, tc.g.D, tc.g.X, d, x, tc.wantD, tc.wantX)
		}
	}
}

// TestExitAppliesLastWatermark: the end of a job (issue 17's flaky
// e2e): the launcher's last D and X come on OpExit, and the agent hands
// them to its host as it exits, though it never handled the G that
// carried them (injected: no G here); the host's Close then applies them
// (rank: TestDurableCloseAppliesLastWatermark). An exit without them
// leaves the host's alone.
func TestExitAppliesLastWatermark(t *testing.T) {
	a := &agent{cfg: Config{Job: "exitwm", Host: 0}, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	h, err := keeper.New(keeper.Config{Job: "exitwm", Host: 0, Hosts: 1, HostOf: func(int) int { return 0 }, Log: a.log,
		Persist: keeper.PersistConfig{Dir: t.TempDir(), Every: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a.prot = &protection{a: a, host: h}
	d := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		c            wire.Control
		wantD, wantX int64
	}{
		{wire.Control{Op: wire.OpExit}, -1, -1},
		{wire.Control{Op: wire.OpExit, D: d(32), X: d(33)}, 32, 33},
		{wire.Control{Op: wire.OpExit, D: d(36), X: d(36)}, 36, 36},
		{wire.Control{Op: wire.OpExit}, 36, 36},
	} {
		if !a.onControl(&nats.Msg{Data: wire.Marshal(&tc.c)}) {
			t.Fatalf("OpExit %+v: the agent does not exit", tc.c)
		}
		if d, x := h.D(), h.X(); d != tc.wantD || x != tc.wantX {
			t.Fatalf("after OpExit with D %d, X %d: host's D = %d, X = %d; want %d and %d", stepOr(tc.c.D), stepOr(tc.c.X), d, x, tc.wantD, tc.wantX)
		}
	}
}

// TestDurableReport: a rank's durable progress reaches the launcher
// whole.
func TestDurableReport(t *testing.T) {
	if durableReport(nil) != nil {
		t.Fatal("a report without a durable tier")
	}
	d := &keeper.DurableProgress{Markers: []int64{4, 8}, Resolved: 7, Saves: 2, Skipped: 1, Failed: 3, WriteNS: 40, Bytes: 50, HoldNS: 60, N: 2,
		Regions: []protect.Region{{Name: "optimizer", Size: 12}, {Name: "meta", Size: 4}}, Off: "no disk",
		Log: &difflog.WriterStats{Steps: 9, Batches: 3, Dropped: 4, Full: 1, Failed: 1, LastErr: errors.New("disk full"), Newest: 12}}
	want := &wire.RankDurable{Markers: []int64{4, 8}, Resolved: 7, Saves: 2, Skipped: 1, Failed: 3, WriteNS: 40, Bytes: 50, HoldNS: 60, N: 2,
		Regions: []wire.DurableRegion{{Name: "optimizer", Size: 12}, {Name: "meta", Size: 4}}, Off: "no disk",
		Log: &wire.DiffLogStats{Steps: 9, Dropped: 4, Failed: 1, LastErr: "disk full"}}
	if got := durableReport(d); !reflect.DeepEqual(got, want) {
		t.Fatalf("report %+v, want %+v", got, want)
	}
}
