package agent

import (
	"os"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// BenchmarkStartRank measures starting and reaping one rank of `true`,
// the agent's per-rank cost at launch.
func BenchmarkStartRank(b *testing.B) {
	out := &batcher{frame: wire.NewOutputFrame(0)}
	out.closed = true
	exits := make(chan *rankProc, 1)
	spec := &wire.JobSpec{Prog: "true", Dir: b.TempDir()}
	env := baseEnv(os.Environ(), nil)
	t := &wire.EpochTable{Job: "bench", World: 64, MasterAddr: "127.0.0.1", Hosts: []wire.TableHost{{Name: "h", Ranks: wire.RankSet{{First: 0, Count: 64, Stride: 1}}}}}
	pl := wire.Placement{Rank: 3, LocalRank: 3, LocalSize: 64}
	for b.Loop() {
		p := &rankProc{place: pl}
		renv := rankEnv(env, &wire.JobSpec{}, t, pl, "/tmp/x.sock", "/tmp")
		if err := p.start(spec, renv, false, out, exits, nil, nil); err != nil {
			b.Fatal(err)
		}
		<-exits
	}
}
