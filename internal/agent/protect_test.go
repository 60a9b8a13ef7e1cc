package agent

import (
	"log/slog"
	"strings"
	"testing"

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
