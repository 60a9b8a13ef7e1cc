package agent

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// TestFailRankCorruptState: a rank whose protected state the rank service
// found corrupt is killed, and its exit is reported as a failure (code 1)
// that says why; a failure of an earlier restart generation kills nothing.
func TestFailRankCorruptState(t *testing.T) {
	for _, tc := range []struct {
		name   string
		gen    uint64 // of the failure; the rank runs in generation 1
		killed bool
	}{
		{"same generation", 1, true},
		{"earlier generation", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, exits, err := startRank(t, "", "sleep", "60")
			if err != nil {
				t.Fatal(err)
			}
			p.gen = 1
			a := &agent{log: slog.New(slog.NewTextHandler(t.Output(), nil)), ranks: []*rankProc{p}}
			cerr := &keeper.CorruptError{Rank: 3, Step: 5, Region: "optimizer", Sum: 1, Got: 2}
			a.failRank(rankStateFailure{rank: 3, gen: tc.gen, err: cerr})
			if !tc.killed {
				// failRank marks a rank it kills before it signals it.
				if p.killedBy.Load() != nil {
					t.Fatal("a failure of an earlier generation killed the rank")
				}
				return
			}
			waitExit(t, exits)
			e := p.exitEvent(2)
			want := "killed by gorun: state of rank 3 corrupted in memory: step 5, CRC mismatch in region optimizer"
			if e.Code != 1 || e.Signal != 0 || e.Stopped || !strings.HasPrefix(e.Msg, want) {
				t.Errorf("exit event %+v, want code 1 and a message starting %q", *e, want)
			}
		})
	}
}

// TestSetTableG: a table's G reaches the state protection when it is newer
// than the host's and of its generation (a spare that joined after G was
// published learns it from the next table, whether or not that table
// changes the placement); an older or equal G, a table without one, or a
// table of another generation (a restart's G comes with Restart) changes
// nothing.
func TestSetTableG(t *testing.T) {
	// Host 1 is a spare in the first table, gets rank 1 in the second.
	table := func(gen uint64, g int64, spareRanks ...int) *wire.EpochTable {
		return &wire.EpochTable{Version: wire.Version, Job: "setg", World: 2, Gen: gen, G: g, Hosts: []wire.TableHost{
			{Name: "h0", Addr: "127.0.0.1", Ranks: wire.CompressRanks([]int{0, 1}[:2-len(spareRanks)])},
			{Name: "h1", Addr: "127.0.0.1", Ranks: wire.CompressRanks(spareRanks), Spare: len(spareRanks) == 0},
		}}
	}
	for _, tc := range []struct {
		name    string
		restart bool  // the host restarted in generation 1 from step 3 first
		known   int64 // G the host had from the launcher before the table (-1: none)
		table   *wire.EpochTable
		want    int64
	}{
		{"same placement, newer G", false, -1, table(0, 7), 7},
		{"new placement, newer G", false, -1, table(0, 7, 1), 7},
		{"older G", false, 9, table(0, 7), 9},
		{"equal G", false, 7, table(0, 7, 1), 7},
		{"no G", false, 4, table(0, -1, 1), 4},
		{"a later generation", false, -1, table(1, 7, 1), -1},
		{"an earlier generation", true, -1, table(0, 7, 1), 3},
		{"the host's generation after a restart", true, -1, table(1, 7, 1), 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := table(0, -1)
			a := &agent{cfg: Config{Job: "setg", Host: 1}, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
			pl := tablePlacement(first, 1)
			h, err := keeper.New(keeper.Config{Job: "setg", Host: 1, Hosts: 2, HostOf: func(r int) int { return pl.HostOf[r] }, Log: a.log})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			p := &protection{a: a, host: h, placed: pl}
			if tc.restart {
				if err := h.Restart(1, 3); err != nil {
					t.Fatal(err)
				}
			}
			if tc.known >= 0 {
				h.SetG(h.Gen(), tc.known)
			}
			if err := p.setTable(tc.table); err != nil {
				t.Fatal(err)
			}
			if got := h.G(); got != tc.want {
				t.Errorf("G after the table: %d, want %d", got, tc.want)
			}
		})
	}
}

// TestParseProtect: the spec's protect mode and diff settings become
// keeper.Config's Mode and Diff, the codec parsed from its flag form;
// what the agent cannot use is refused with ErrJobSpec, saying what.
func TestParseProtect(t *testing.T) {
	int8x64, err := protect.ParseDiffCodec("int8:64")
	if err != nil {
		t.Fatal(err)
	}
	topk, err := protect.ParseDiffCodec("topk:0.25")
	if err != nil {
		t.Fatal(err)
	}
	raw := replay.Options{Lossless: true}
	tests := []struct {
		name string
		spec wire.JobSpec
		want protectSettings
		err  string // the error's text after ErrJobSpec's, if any
	}{
		{"none is full", wire.JobSpec{}, protectSettings{mode: protect.ModeFull}, ""},
		{"full", wire.JobSpec{ProtectMode: "full"}, protectSettings{mode: protect.ModeFull}, ""},
		{"diff, raw", wire.JobSpec{ProtectMode: "diff", DiffFold: 16, BaseEvery: 100, DiffCodec: "raw"},
			protectSettings{mode: protect.ModeDiff, diff: keeper.DiffConfig{Fold: 16, BaseEvery: 100, Codec: raw}}, ""},
		{"diff, no codec is raw", wire.JobSpec{ProtectMode: "diff"}, protectSettings{mode: protect.ModeDiff, diff: keeper.DiffConfig{Codec: raw}}, ""},
		{"diff, int8", wire.JobSpec{ProtectMode: "diff", DiffFold: 1, BaseEvery: 1 << 31, DiffCodec: "int8:64"},
			protectSettings{mode: protect.ModeDiff, diff: keeper.DiffConfig{Fold: 1, BaseEvery: 1 << 31, Codec: int8x64}}, ""},
		{"diff, topk", wire.JobSpec{ProtectMode: "diff", DiffFold: 4096, BaseEvery: 7, DiffCodec: "topk:0.25"},
			protectSettings{mode: protect.ModeDiff, diff: keeper.DiffConfig{Fold: 4096, BaseEvery: 7, Codec: topk}}, ""},
		{"unknown mode", wire.JobSpec{ProtectMode: "delta"}, protectSettings{}, `protect mode "delta": want full or diff`},
		{"unknown codec", wire.JobSpec{ProtectMode: "diff", DiffCodec: "zstd"}, protectSettings{}, `diff codec "zstd": want raw, int8[:B] or topk:K`},
		{"bad topk", wire.JobSpec{ProtectMode: "diff", DiffCodec: "topk:0"}, protectSettings{}, `diff codec "topk:0": want topk:K with 0 < K ≤ 1 (the fraction of entries kept)`},
		{"codec in full mode", wire.JobSpec{DiffCodec: "raw"}, protectSettings{}, `diff settings (fold 0, base every 0, codec "raw") with protect mode full`},
		{"fold in full mode", wire.JobSpec{ProtectMode: "full", DiffFold: 16}, protectSettings{}, `diff settings (fold 16, base every 0, codec "") with protect mode full`},
		{"fold out of range", wire.JobSpec{ProtectMode: "diff", DiffFold: wire.MaxDiffFold + 1}, protectSettings{}, "diff fold 4097 or base every 0 out of range"},
		{"negative base-every", wire.JobSpec{ProtectMode: "diff", BaseEvery: -1}, protectSettings{}, "diff fold 0 or base every -1 out of range"},
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
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestProtectSpecReachesHost: an agent given a job spec in diff mode
// starts its state protection with HostConfig.Mode ModeDiff and the
// spec's fold, base period and parsed codec; given a codec it cannot
// parse, it reports an agent error saying so and exits with ErrJobSpec,
// before it starts a rank or its state protection.
func TestProtectSpecReachesHost(t *testing.T) {
	t.Run("diff", func(t *testing.T) {
		got := make(chan keeper.Config, 1)
		with := func(c *Config) {
			c.newHost = func(hc keeper.Config) (*keeper.Keeper, error) {
				got <- hc
				return keeper.New(hc)
			}
		}
		diff := func(s *wire.JobSpec) {
			s.ProtectMode, s.DiffFold, s.BaseEvery, s.DiffCodec = "diff", 7, 50, "int8:128"
		}
		f := startFakeLauncherSpec(t, "protspec", []int{0}, with, diff, "sleep", "3600")
		var hc keeper.Config
		select {
		case hc = <-got:
		case err := <-f.agentErr:
			f.agentErr <- err // for the cleanup
			t.Fatalf("the agent ended (%v) before starting its state protection", err)
		case <-f.ctx.Done():
			t.Fatal("the agent did not start its state protection")
		}
		codec, err := protect.ParseDiffCodec("int8:128")
		if err != nil {
			t.Fatal(err)
		}
		if want := (keeper.DiffConfig{Fold: 7, BaseEvery: 50, Codec: codec}); hc.Mode != protect.ModeDiff || hc.Diff != want {
			t.Errorf("HostConfig Mode %q Diff %+v, want %q %+v", hc.Mode, hc.Diff, protect.ModeDiff, want)
		}
	})
	t.Run("bad codec", func(t *testing.T) {
		started := make(chan struct{}, 1)
		with := func(c *Config) {
			c.newHost = func(hc keeper.Config) (*keeper.Keeper, error) {
				started <- struct{}{}
				return keeper.New(hc)
			}
		}
		bad := func(s *wire.JobSpec) { s.ProtectMode, s.DiffCodec = "diff", "zstd" }
		f := startFakeLauncherSpec(t, "protbad", []int{0}, with, bad, "sleep", "3600")
		const want = `agent: unusable job spec: diff codec "zstd": want raw, int8[:B] or topk:K`
		// The event first (f.next would take the agent's end instead).
		for done := false; !done; {
			select {
			case e := <-f.events:
				switch e.Kind {
				case wire.EventStarted:
					t.Error("the agent started a rank")
				case wire.EventAgentError:
					if e.Msg != want {
						t.Errorf("agent error event says %q, want %q", e.Msg, want)
					}
					done = true
				}
			case <-f.ctx.Done():
				t.Fatal("no agent error event")
			}
		}
		var err error
		select {
		case err = <-f.agentErr:
			f.agentErr <- err // for the cleanup
		case <-f.ctx.Done():
			t.Fatal("the agent did not exit")
		}
		if !errors.Is(err, ErrJobSpec) || err.Error() != want {
			t.Errorf("agent's error %v, want ErrJobSpec saying %q", err, want)
		}
		select {
		case <-started:
			t.Error("the agent started its state protection")
		default:
		}
	})
}
