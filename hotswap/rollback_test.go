package hotswap

import (
	"strings"
	"testing"
)

// TestRollbackCause: a roll-back to the durable tier says why memory
// cannot serve the loss. When every lost rank's optimizer state survives
// (a decode under EC, a copy at a holder) but the restore plan fails (no
// data-parallel peer holds a rank's parameters), the report carries the
// plan's reason, not a false "rank 0's state is lost (fewer than K
// shards / no replica left)" (the review of dc4c894 reproduced the EC
// case; before the fix lostState fell back to rank 0).
func TestRollbackCause(t *testing.T) {
	tests := []struct {
		name    string
		script  []string
		want    []string // substrings of the last two commands' output, in order
		wantNot []string
	}{
		{
			// Ranks 0 and 1 are each other's only data-parallel peer;
			// rank 0's shard decodes from h2's clear copy and h3's row.
			name: "ec:2+2 pp=2: no data-parallel peer",
			script: []string{
				"config hosts=h0,h1,h2,h3,s0,s1,s2,s3 spares=s0,s1,s2,s3 world=4 pp=2 ec=2+2 durable",
				"event committed step=8 at=1s",
				"event g g=13 at=1s",
				"event agent-exited host=h0 why=lost at=2s",
				"event agent-exited host=h1 why=lost at=2s",
				"event disk-reach t=12 at=3s",
			},
			want: []string{
				"host h1 lost: its agent exited: lost; the job's state at step 13 cannot be restored from memory with hosts h0, h1 lost (no data-parallel peer of rank 0 holds its parameters); moving ranks 1 to spare s1",
				"gather-reach epoch=2 base=8",
				"the job's state at step 13 cannot be restored from memory with hosts h0, h1 lost (no data-parallel peer of rank 0 holds its parameters): rolling the job back to step 12 from --ckpt-dir",
			},
			wantNot: []string{"shards of its stripe", "abort"},
		},
		{
			// h0 and h1 lost before any restore ended; the copies were
			// re-sent to their replacements (Replicated) while ranks 0
			// and 1 still restore: every rank keeps a copy at a live
			// holder, but the parameters of the data-parallel group
			// are on no restored rank once h2 goes.
			name: "replicas=2: no data-parallel peer",
			script: []string{
				"config hosts=h0,h1,h2,s0,s1,s2 spares=s0,s1,s2 world=3 replicas=2 durable",
				"event committed step=8 at=1s",
				"event g g=13 at=1s",
				"event agent-exited host=h0 why=lost at=2s",
				"event agent-exited host=h1 why=lost at=2s",
				"event replicated owner=-1 at=2s",
				"event agent-exited host=h2 why=lost at=2s",
				"event disk-reach t=12 at=3s",
			},
			want: []string{
				"host h2 lost: its agent exited: lost; the job's state at step 13 cannot be restored from memory with hosts h0, h1, h2 lost (no data-parallel peer of rank 0 holds its parameters); moving ranks 2 to spare s2",
				"gather-reach epoch=3 base=8",
				"the job's state at step 13 cannot be restored from memory with hosts h0, h1, h2 lost (no data-parallel peer of rank 0 holds its parameters): rolling the job back to step 12 from --ckpt-dir",
			},
			wantNot: []string{"no replica left", "abort"},
		},
		{
			// A state that is lost is still named as before.
			name: "replicas=1: no replica left",
			script: []string{
				"config hosts=h0,h1,h2,h3,s0,s1,s2,s3 spares=s0,s1,s2,s3 world=4 pp=2 replicas=1 durable",
				"event committed step=8 at=1s",
				"event g g=13 at=1s",
				"event agent-exited host=h0 why=lost at=2s",
				"event agent-exited host=h1 why=lost at=2s",
				"event disk-reach t=12 at=3s",
			},
			want: []string{
				"rank 0's state at step 13 is lost with hosts h0, h1 (no replica left); moving ranks 1 to spare s1",
				"rank 0's state at step 13 is lost with hosts h0, h1 (no replica left): rolling the job back to step 12",
			},
			wantNot: []string{"abort"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &driver{}
			var out string
			for i, c := range tc.script {
				o := d.run(c)
				if strings.HasPrefix(o, "error") {
					t.Fatalf("%s: %s", c, o)
				}
				if i >= len(tc.script)-2 {
					out += o + "\n"
				}
			}
			rest := out
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("want %q (in order) in:\n%s", w, out)
				}
				rest = rest[i+len(w):]
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out, w) {
					t.Fatalf("%q not wanted in:\n%s", w, out)
				}
			}
		})
	}
}
