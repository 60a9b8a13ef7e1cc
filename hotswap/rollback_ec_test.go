package hotswap

import (
	"strings"
	"testing"
)

// TestRollbackEC: under erasure coding (ec:2+2 over h0..h3, four
// spares) a loss of more than M hosts of a group rolls the job back to
// the durable tier when it has one with a commit record, and stops it as
// before otherwise. After the roll-back every clear copy and parity share
// is missing until its owner reports Replicated (encoded again from T),
// and the next loss within M is restored from memory (a decode), not
// rolled back. In diff mode under EC likewise: the base schedule
// restarts from T, and every log copy is missing at T too.
func TestRollbackEC(t *testing.T) {
	const hosts = "config hosts=h0,h1,h2,h3,s0,s1,s2,s3 spares=s0,s1,s2,s3 world=4 ec=2+2"
	lose3 := []string{
		"event g g=13 at=1s",
		"event agent-exited host=h0 why=lost at=2s",
		"event agent-exited host=h1 why=lost at=2s",
		"event agent-exited host=h2 why=lost at=2s",
	}
	type step struct {
		cmd     string
		want    []string // substrings of the output, in order
		wantNot []string
		check   func(t *testing.T, m *Machine) // the machine after cmd
	}
	tests := []struct {
		name  string
		setup string
		steps []step
	}{
		{
			name:  "durable: more than M lost rolls back",
			setup: hosts + " durable",
			steps: []step{
				{cmd: "event committed step=8 at=1s"},
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]},
				{cmd: lose3[3], want: []string{
					"rank 0's state at step 13 is lost with hosts h0, h1, h2 (fewer than 2 of the 4 shards of its stripe of erasure-coding group 0 left)",
					"rolling the job back to --ckpt-dir (commit record at step 8)",
					"splice lost=h2 with=s2 (spare) ranks=2",
					"gather-reach epoch=3 base=8",
				}, wantNot: []string{"abort"}},
				{cmd: "event disk-reach t=12 at=3s state", want: []string{
					"rolling the job back to step 12 from --ckpt-dir (1 step lost)",
					"rollback-to-disk gen=3 epoch=3 t=12 from=13",
					"restart gen=3 epoch=3 from=12",
					// The spares take the lost hosts' places.
					"publish epoch=3 g=12 table=s0:0 s1:1 s2:2 h3:3 holders=0:- 1:0 2:- 3:2 ec=0:d=s0+s2,p=s1+h3",
					"restore epoch=3 g=12 local=0-3",
					// The tolerance note a splice's report has.
					"under-protected: 4 optimizer shards have no clear copy or parity share (ec:2+2) of step 12 until they are encoded again; erasure-coding group 0 (hosts s0,s1,s2,h3) survives no more host loss, not 2",
					"under-protected owners=0-3",
				}},
				{cmd: "event recovery stage=resumed at=4s"},
				// h3's row 1 is of step 13: until the owners encode T
				// again no loss is survivable from memory.
				{cmd: "event replicated owner=-1 at=5s state", want: []string{
					"every optimizer shard has its clear copy and parity shares (ec:2+2) again", "protected",
				}},
				{cmd: "event g g=14 at=6s"},
				// One more loss, within M: restored from memory.
				{cmd: "event agent-exited host=s0 why=lost at=7s", want: []string{
					"moving ranks 0 to spare s3", "resuming from step 14", "r0<-decode",
				}, wantNot: []string{"gather-reach", "rolling the job back", "abort"}},
			},
		},
		{
			// Before the owners encode T again, no row counts: a loss
			// rolls back again instead of decoding from rows of step 13.
			name:  "durable: a loss before the shards of T are in rolls back again",
			setup: hosts + " durable",
			steps: []step{
				{cmd: "event committed step=8 at=1s"},
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]}, {cmd: lose3[3]},
				{cmd: "event disk-reach t=12 at=3s", want: []string{"rollback-to-disk gen=3 epoch=3 t=12 from=13"}},
				{cmd: "event recovery stage=resumed at=4s"},
				{cmd: "event agent-exited host=s0 why=lost at=5s", want: []string{
					"rank 0's state at step 12 is lost with host s0", "rolling the job back to --ckpt-dir", "gather-reach epoch=4 base=8",
				}, wantNot: []string{"decode", "abort"}},
			},
		},
		{
			// A further loss while the reach is gathered moves its
			// ranks and places too, and asks again.
			name:  "durable: a loss while gathering",
			setup: hosts + " durable",
			steps: []step{
				{cmd: "event committed step=8 at=1s"},
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]},
				{cmd: lose3[3], want: []string{"gather-reach epoch=3 base=8"}},
				{cmd: "event agent-exited host=h3 why=lost at=3s", want: []string{
					"splice lost=h3 with=s3 (spare) ranks=3", "gather-reach epoch=4 base=8",
				}, wantNot: []string{"abort"}},
				{cmd: "event disk-reach epoch=3 t=12 at=4s", want: []string{"(no action)"}},
				{cmd: "event disk-reach t=12 at=4s", want: []string{
					"rollback-to-disk gen=4 epoch=4 t=12 from=13",
					"publish epoch=4 g=12 table=s0:0 s1:1 s2:2 s3:3 holders=0:- 1:0 2:- 3:2 ec=0:d=s0+s2,p=s1+s3",
					"restore epoch=4 g=12 local=0-3",
				}},
			},
		},
		{
			name:  "durable: M lost decodes from memory",
			setup: hosts + " durable",
			steps: []step{
				{cmd: "event committed step=8 at=1s"},
				{cmd: lose3[0]}, {cmd: lose3[1]},
				{cmd: lose3[2], want: []string{"resuming from step 13", "r0<-decode"},
					wantNot: []string{"gather-reach", "abort"}},
			},
		},
		{
			name:  "no durable tier: stops",
			setup: hosts,
			steps: []step{
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]},
				{cmd: lose3[3], want: []string{
					"abort code=1: host h2 lost: its agent exited: lost; unrecoverable: rank 2's optimizer shard has no valid copy left in memory and cannot be decoded",
					"(I3); stopping the job",
				}, wantNot: []string{"gather-reach"}},
			},
		},
		{
			name:  "durable tier without a commit record: stops",
			setup: hosts + " durable",
			steps: []step{
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]},
				{cmd: lose3[3], want: []string{"abort code=1", "unrecoverable: rank 2's optimizer shard", "(I3); stopping the job"},
					wantNot: []string{"gather-reach"}},
			},
		},
		{
			name:  "durable, the reach fails: stops",
			setup: hosts + " durable",
			steps: []step{
				{cmd: "event committed step=8 at=1s"},
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]},
				{cmd: lose3[3], want: []string{"gather-reach"}},
				{cmd: "event disk-reach err=broken at=3s", want: []string{
					"abort code=1", "the job cannot roll back to --ckpt-dir: broken; stopping the job",
				}, wantNot: []string{"rollback-to-disk"}},
			},
		},
		{
			// Diff mode: the base schedule restarts from T; every
			// clear copy, share, log copy and retained snapshot is
			// missing until the caller reports Replicated (once H
			// reached T, every rank coded there).
			name:  "diff mode: more than M lost rolls back",
			setup: hosts + " durable diff",
			steps: []step{
				{cmd: "event committed step=8 at=1s"},
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]},
				{cmd: lose3[3], want: []string{
					"rank 0's state at step 13 is lost with hosts h0, h1, h2 (fewer than 2 of the 4 shards of its stripe of erasure-coding group 0 left)",
					"rolling the job back to --ckpt-dir (commit record at step 8)",
					"gather-reach epoch=3 base=8",
				}, wantNot: []string{"abort"}},
				{cmd: "event disk-reach t=12 at=3s state", want: []string{
					"rolling the job back to step 12 from --ckpt-dir (1 step lost)",
					"rollback-to-disk gen=3 epoch=3 t=12 from=13",
					"restart gen=3 epoch=3 from=12",
					"publish epoch=3 g=12 table=s0:0 s1:1 s2:2 h3:3 holders=0:- 1:0 2:- 3:2 ec=0:d=s0+s2,p=s1+h3 logs=0:1,3 1:2 2:1,3 3:0",
					"restore epoch=3 g=12 local=0-3",
					"under-protected: 4 optimizer shards have no coded base (ec:2+2) of step 12 until every rank codes it again (the base schedule restarts there); erasure-coding group 0 (hosts s0,s1,s2,h3) survives no more host loss, not 2 (ranks 0-3 keep their differentials on 0 hosts)",
					"under-protected owners=0-3",
				}, wantNot: []string{"abort"},
					// What a decode counts: no member's shard at H (a
					// retained snapshot of ranks 0 and 2, on their data
					// hosts, or a clear copy) and no log copy is of the
					// new schedule yet.
					check: diffRoles(false)},
				{cmd: "event recovery stage=resumed at=4s"},
				{cmd: "event replicated owner=-1 at=5s state", want: []string{
					"every optimizer shard has its clear copy and parity shares (ec:2+2) again", "protected",
				}, check: diffRoles(true)},
				{cmd: "event g g=14 at=6s"},
				// One more loss, within M: decoded from memory.
				{cmd: "event agent-exited host=s0 why=lost at=7s", want: []string{
					"moving ranks 0 to spare s3", "resuming from step 14", "r0<-decode",
				}, wantNot: []string{"gather-reach", "rolling the job back", "abort"}},
			},
		},
		{
			// Rank 0 stays on h0, its data host, through the roll-back
			// (h1, h2, h3 lost): its retained snapshot is of the old
			// schedule's H, not a shard of the new one at T, until the
			// caller reports Replicated. (A decode counts it only with a
			// valid parity row, whose shares come back in with
			// Replicated too: this checks the roles, which no decision
			// shows today.)
			name:  "diff mode: a rank left on its data host keeps no shard of T",
			setup: hosts + " durable diff",
			steps: []step{
				{cmd: "event committed step=8 at=1s"},
				{cmd: lose3[0]},
				{cmd: "event agent-exited host=h3 why=lost at=2s"}, {cmd: lose3[2]}, {cmd: lose3[3], want: []string{"gather-reach epoch=3 base=8"}},
				{cmd: "event disk-reach t=12 at=3s", want: []string{"rollback-to-disk gen=3 epoch=3 t=12 from=13", "restore epoch=3 g=12 local=0-3"},
					wantNot: []string{"abort"}, check: diffRoles(false)},
				{cmd: "event recovery stage=resumed at=4s"},
				{cmd: "event replicated owner=-1 at=5s", want: []string{"protected"}, check: diffRoles(true)},
			},
		},
		{
			// Until the caller reports Replicated (H reached T), a
			// loss memory cannot serve rolls back again.
			name:  "diff mode: a loss before the schedule is coded again rolls back again",
			setup: hosts + " durable diff",
			steps: []step{
				{cmd: "event committed step=8 at=1s"},
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]}, {cmd: lose3[3]},
				{cmd: "event disk-reach t=12 at=3s", want: []string{"rollback-to-disk gen=3 epoch=3 t=12 from=13"}},
				{cmd: "event recovery stage=resumed at=4s"},
				{cmd: "event g g=14 at=5s"},
				{cmd: "event agent-exited host=h3 why=lost at=6s", want: []string{
					"rank 3's state at step 14 is lost with host h3", "rolling the job back to --ckpt-dir", "gather-reach epoch=4 base=8",
				}, wantNot: []string{"decode", "abort"}},
				{cmd: "event disk-reach t=13 at=7s", want: []string{"rollback-to-disk gen=4 epoch=4 t=13 from=14", "restore epoch=4 g=13 local=0-3"}},
			},
		},
		{
			name:  "diff mode under EC without a durable tier: stops, no word of --ckpt-dir",
			setup: hosts + " diff",
			steps: []step{
				{cmd: lose3[0]}, {cmd: lose3[1]}, {cmd: lose3[2]},
				{cmd: lose3[3], want: []string{"abort code=1", "unrecoverable", "(I3); stopping the job"},
					wantNot: []string{"gather-reach", "--ckpt-dir"}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &driver{}
			if out := d.run(tc.setup); strings.HasPrefix(out, "error") {
				t.Fatalf("%s: %s", tc.setup, out)
			}
			for _, s := range tc.steps {
				out := d.run(s.cmd)
				rest := out
				for _, w := range s.want {
					i := strings.Index(rest, w)
					if i < 0 {
						t.Fatalf("%s: want %q (in order) in:\n%s", s.cmd, w, out)
					}
					rest = rest[i+len(w):]
				}
				for _, w := range s.wantNot {
					if strings.Contains(out, w) {
						t.Fatalf("%s: %q not wanted in:\n%s", s.cmd, w, out)
					}
				}
				if s.check != nil {
					s.check(t, d.m)
				}
			}
		})
	}
}

// diffRoles checks that every rank's shard at H (memberShard) and log
// copy (logCopy) count as valid for a decode (ok), or none does.
func diffRoles(ok bool) func(t *testing.T, m *Machine) {
	return func(t *testing.T, m *Machine) {
		t.Helper()
		for r := range m.rankHost {
			if got := m.memberShard(r); got != ok {
				t.Errorf("rank %d: its shard at H valid: %v, want %v (retained %v, holders %v)", r, got, ok, m.retained[r], m.holders[r])
			}
			if got := m.logCopy(r); got != ok {
				t.Errorf("rank %d: a valid copy of its log: %v, want %v", r, got, ok)
			}
		}
	}
}
