package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/ckpt"
)

// TestECDiffCorruptSlotsRestart: --redundancy ec:2+1 --protect-mode diff
// on three namespace hosts, --recovery restart and in-place (issue 21's
// chaos run, make chaos SEED=2026 ONLY=32). A rank of a data host (no
// clear copy on another host) has a byte flipped in each of its committed
// slots while it is stopped, then is killed. The job restarts the ranks
// in place (every rank, or the failed one) under a new epoch with the
// same layout; the rank's slots fail their CRC32C, so it decodes its
// state from its stripe at the new table's H and replays its log to G.
// The job must end as a run without the failure: exit 0, the same final
// hashes. Before the fix the rank's service decoded at the H of the job's
// first table (-1): "no coded base at or before step G (H is -1)", and
// the job stopped "again with no progress".
func TestECDiffCorruptSlotsRestart(t *testing.T) {
	c := newHSCluster(t, 3, 0)
	batch := []string{"--batch", "48"} // six ranks divide it
	wantP, wantO := hsReference(t, c, batch...)
	victim := dataRank(t, c)
	for _, mode := range []string{"restart", "in-place"} {
		t.Run(mode, func(t *testing.T) {
			flags := []string{"--redundancy", "ec:2+1", "--protect-mode", "diff", "--base-every", "8",
				"--recovery", mode, "--max-restarts", "3"}
			r := c.start(t, flags, append([]string{"--protect"}, batch...)...)
			// Past the second base (H 8 once every rank coded it): the
			// decode has differentials to replay.
			r.waitStep(t, 14)
			t.Log(flipCommittedSlots(t, r, victim))
			res := r.finish(t, 0)
			defer func() {
				if t.Failed() {
					t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
				}
			}()
			checkHashes(t, res, wantP, wantO)
			for _, want := range []string{"restoring from other hosts", "decoded from the erasure-coded stripe"} {
				if !strings.Contains(res.stderr, want) {
					t.Errorf("gorun -v does not say %q: the corrupt slots were not restored from the stripe", want)
				}
			}
		})
	}
}

// dataRank returns the lowest rank of the first data host of c's one
// ec:2+1 group as the launcher plans it (c.ecGroup's plan with M 1): its
// clear copy is kept on its own host only.
func dataRank(t *testing.T, c *hsCluster) int {
	t.Helper()
	g, asg := c.ecGroup(t, 1)
	for _, a := range asg {
		if a.Host == g.Data[0] {
			t.Logf("rank %d of data host %d", a.Rank, a.Host)
			return a.Rank
		}
	}
	t.Fatalf("no rank on data host %d", g.Data[0])
	return -1
}

// flipCommittedSlots stops rank's trainer (nothing is staged for it any
// more), flips the first byte of its optimizer region in every slot its
// header says is committed, checks the header still says so (the flip
// came after the commit's CRC32C), and kills the trainer. It returns what
// it did.
func flipCommittedSlots(t *testing.T, r *hsRun, rank int) string {
	t.Helper()
	pid := rankPid(t, r.mark, rank, "dptrain")
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	s, err := ckpt.Open(r.jobID(), rank, nil, ckpt.Options{})
	if err != nil {
		t.Fatalf("opening rank %d's slots: %v", rank, err)
	}
	defer s.Close()
	var file ckpt.RegionFile
	for _, f := range s.Files() {
		if f.Name == "optimizer" {
			file = f
		}
	}
	if file.Path == "" {
		t.Fatalf("rank %d has no optimizer region", rank)
	}
	fh, err := os.OpenFile(file.Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	before, ok := s.Committed()
	note := fmt.Sprintf("rank %d (pid %d) stopped", rank, pid)
	flipped := 0
	for i := range 2 {
		if !ok[i] {
			continue
		}
		var b [1]byte
		off := int64(i) * file.Stride
		if _, err := fh.ReadAt(b[:], off); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x5a
		if _, err := fh.WriteAt(b[:], off); err != nil {
			t.Fatal(err)
		}
		if after, okAfter := s.Committed(); !okAfter[i] || after[i] != before[i] {
			t.Fatalf("rank %d's slot %d: committed step %d before the flip, %d (%v) after: the rank was not stopped", rank, i, before[i], after[i], okAfter[i])
		}
		flipped++
		note += fmt.Sprintf("; flipped byte 0 of slot %d (committed step %d)", i, before[i])
	}
	if flipped == 0 {
		t.Fatalf("rank %d has no committed slot", rank)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return note + "; killed"
}
