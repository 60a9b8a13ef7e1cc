package durable

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// histRecord is the record of step of history h ("H" the old one, "N"
// the one a resume began).
func histRecord(h string, step int64) []byte { return fmt.Appendf(nil, "%s%d", h, step) }

func appendHist(t *testing.T, dir, h string, a, b int64) {
	t.Helper()
	var recs [][]byte
	for s := a; s <= b; s++ {
		recs = append(recs, histRecord(h, s))
	}
	if err := AppendBatch(dir, 0, a, b, recs); err != nil {
		t.Fatal(err)
	}
}

// TestTrimCrash: history H wrote batches 1-4 and 5-8; a resume at step
// 6 trims the log (5-8 is rewritten as 5-6, then removed) and is cut
// short by a crash at one of the trim's steps; then history N writes
// 7-10, either at once (a writer goes on after a trim that failed) or
// after the next run's trim to 6 completes. The log read back is H's
// steps up to 6 and N's after, or stops at 6 or before (saying why),
// never H's 7 and 8 followed by N's 9 and 10 (issue 17, review of
// 31c5b02). A trim record that cannot be written ("mark") makes the
// trim remove the straddling batch without its prefix: a gap at 5.
func TestTrimCrash(t *testing.T) {
	crash := errors.New("crash")
	for _, op := range []string{"mark", "rewrite", "remove", "unmark"} {
		for _, retrim := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/retrim=%v", op, retrim), func(t *testing.T) {
				dir := t.TempDir()
				appendHist(t, dir, "H", 1, 4)
				appendHist(t, dir, "H", 5, 8)
				trimFault = func(o string) error {
					if o == op {
						return crash
					}
					return nil
				}
				err := trimBatches(dir, 0, 6)
				trimFault = nil
				if err != nil && !errors.Is(err, crash) {
					t.Fatalf("trim: %v", err)
				}
				if retrim {
					if err := TrimBatches(dir, 0, 6); err != nil {
						t.Fatalf("the next trim: %v", err)
					}
				}
				appendHist(t, dir, "N", 7, 10)
				var got []string
				stop := ScanBatches(dir, 0, 0, math.MaxInt64, func(recs []Record) error {
					for _, r := range recs {
						got = append(got, string(r.Data))
					}
					return nil
				})
				want := []string{"H1", "H2", "H3", "H4", "H5", "H6", "N7", "N8", "N9", "N10"}
				if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
					t.Fatalf("the log reads %q (stop %v): a mix of histories", got, stop)
				}
				switch {
				case len(got) == len(want):
					if stop != nil {
						t.Errorf("the whole log read, stop %v", stop)
					}
				case retrim && op != "mark":
					t.Errorf("after a trim that completed the log reads %q (stop %v), want %q", got, stop, want)
				case op == "mark":
					if len(got) != 4 || !errors.Is(stop, ErrGap) {
						t.Errorf("the log reads %q, stop %v; want steps 1 to 4 and a gap", got, stop)
					}
				case len(got) != 6 || !errors.Is(stop, ErrGap) || !strings.Contains(stop.Error(), "trim"):
					t.Errorf("the log reads %q, stop %v; want steps 1 to 6 and a stop saying a trim cut it", got, stop)
				}
			})
		}
	}
}

// TestTrimAfterTrimCut: a trim that finds the record of one that did
// not complete trims to the lesser step (the batches after the record's
// step are of the history it cut, whatever they hold), and leaves no
// record.
func TestTrimAfterTrimCut(t *testing.T) {
	dir := t.TempDir()
	appendHist(t, dir, "H", 1, 4)
	appendHist(t, dir, "H", 5, 8)
	trimFault = func(op string) error {
		if op == "remove" {
			return errors.New("crash")
		}
		return nil
	}
	_ = trimBatches(dir, 0, 6)
	trimFault = nil
	appendHist(t, dir, "N", 7, 10) // a writer that went on
	if err := TrimBatches(dir, 0, 9); err != nil {
		t.Fatal(err)
	}
	bs, cut, trims, err := listBatches(rankDir(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, bf := range bs {
		names = append(names, bf.name)
	}
	if want := []string{"diff.1-4", "diff.5-6"}; !slices.Equal(names, want) || cut != math.MaxInt64 || len(trims) != 0 {
		t.Errorf("after the trim to 9: batches %q, trim records %q; want %q and none", names, trims, want)
	}
}

// TestTrimEverything: a trim to -1 (every step) cut short by a crash
// leaves a record that makes a scan read nothing, then completes.
func TestTrimEverything(t *testing.T) {
	dir := t.TempDir()
	appendHist(t, dir, "H", 0, 3)
	appendHist(t, dir, "H", 4, 7)
	trimFault = func(op string) error {
		if op == "remove" {
			return errors.New("crash")
		}
		return nil
	}
	_ = trimBatches(dir, 0, -1)
	trimFault = nil
	appendHist(t, dir, "N", 0, 2) // a writer that went on
	n := 0
	stop := ScanBatches(dir, 0, -1, math.MaxInt64, func(recs []Record) error { n += len(recs); return nil })
	if n != 0 || !errors.Is(stop, ErrGap) || !strings.Contains(stop.Error(), "trim.-1") {
		t.Errorf("after a trim of every step cut short: %d records, stop %v; want none and a stop naming trim.-1", n, stop)
	}
	if err := TrimBatches(dir, 0, -1); err != nil {
		t.Fatal(err)
	}
	if bs, cut, trims, err := listBatches(rankDir(dir, 0)); err != nil || len(bs) != 0 || cut != math.MaxInt64 || len(trims) != 0 {
		t.Errorf("after the trim: batches %v, records %q, %v; want none", bs, trims, err)
	}
}
