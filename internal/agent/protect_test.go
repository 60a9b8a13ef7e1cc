package agent

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/rank"
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
			cerr := &rank.CorruptError{Rank: 3, Step: 5, Region: "optimizer", Sum: 1, Got: 2}
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
			h, err := rank.NewHost(rank.HostConfig{Job: "setg", Host: 1, Hosts: 2, HostOf: func(r int) int { return pl.HostOf[r] }, Log: a.log})
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
