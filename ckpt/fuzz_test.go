package ckpt

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpenHeader writes arbitrary header files beside valid data files
// and opens them: Open must fail with ErrLayout or succeed, never panic,
// and slots it opens must work (Newest fails only with ErrEmpty or
// ErrCorrupt, and a step committed on them reads back).
//
// Each input b is tried twice. First as the header file itself. Then as
// an edit of a valid header (of empty slots, or of steps 1 and 2
// committed): b[0] holds flags, and b[1:] is XORed onto the header's
// bytes in overlayOrder, slot headers and layout first, so that short
// inputs (which the fuzzer mutates and minimizes quickly) reach every
// check, behind the CRCs too when the flags say to recompute them. Every
// header of the right size is some edit of the valid one.
func FuzzOpenHeader(f *testing.F) {
	opt := Options{Dir: f.TempDir()}
	s, err := Create(testJob, 0, testRegions, opt)
	if err != nil {
		f.Fatal(err)
	}
	hp := filepath.Join(opt.Dir, hdrName(testJob, 0))
	empty, err := os.ReadFile(hp)
	if err != nil {
		f.Fatal(err)
	}
	commit(f, s, 1)
	commit(f, s, 2)
	s.Close()
	full, err := os.ReadFile(hp)
	if err != nil {
		f.Fatal(err)
	}
	// Each input starts from these data files, so that what happens
	// depends on the input alone (the fuzzer needs that to tell new
	// coverage from old), not on the steps earlier inputs committed.
	var paths []string
	var data [][]byte
	for _, r := range testRegions {
		p := filepath.Join(opt.Dir, dataName(testJob, 0, r.Name))
		d, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		paths, data = append(paths, p), append(data, d)
	}
	dirty := false

	f.Add([]byte{})
	f.Add([]byte("GRCK"))
	f.Add(full[:100])
	f.Add([]byte{0})
	f.Add([]byte{fuzzFixLayout | fuzzFixSlots})
	f.Add([]byte{fuzzEmptyBase})
	// Slot 1's state: committed → staging; and a state no writer uses.
	f.Add([]byte{0, 0x43 ^ 0x53, 0x4f ^ 0x54, 0x4d ^ 0x41, 0x54 ^ 0x47})
	f.Add([]byte{0, 1})
	// Slot 1's step raised, its CRC recomputed.
	f.Add([]byte{fuzzFixSlots, 0, 0, 0, 0, 0, 0, 0, 0, 9})
	// A region count of 3, the layout CRC recomputed.
	f.Add(append(append([]byte{fuzzFixLayout}, make([]byte, 2*(entOff+entSize*len(testRegions))+countOff)...), 7))
	f.Fuzz(func(t *testing.T, b []byte) {
		edited := full
		if len(b) > 0 && b[0]&fuzzEmptyBase != 0 {
			edited = empty
		}
		edited = bytes.Clone(edited)
		if len(b) > 0 {
			for i, c := range b[1:min(len(b), 1+len(overlayOrder))] {
				edited[overlayOrder[i]] ^= c
			}
			if b[0]&fuzzFixLayout != 0 {
				fixLayoutCRC(edited)
			}
			if b[0]&fuzzFixSlots != 0 {
				fixSlotCRC(edited, 0, len(testRegions))
				fixSlotCRC(edited, 1, len(testRegions))
			}
		}
		for _, h := range [][]byte{b, edited} {
			if dirty {
				for i, p := range paths {
					rewrite(t, p, data[i])
				}
				dirty = false
			}
			rewrite(t, hp, h)
			s, err := Open(testJob, 0, nil, opt)
			if err != nil {
				if !errors.Is(err, ErrLayout) {
					t.Fatalf("Open: %v, not wrapping ErrLayout", err)
				}
				continue
			}
			dirty = true
			exercise(t, s)
		}
	})
}

// The flags of FuzzOpenHeader's inputs (their first byte).
const (
	fuzzFixLayout = 1 << iota // recompute the layout's CRC after the edit
	fuzzFixSlots              // recompute both slot headers' CRCs
	fuzzEmptyBase             // edit the header of empty slots
)

// overlayOrder lists the header's offsets in the order FuzzOpenHeader's
// inputs edit them: the bytes the slot headers use, the layout's, then
// all the others.
var overlayOrder = func() []int {
	used := entOff + entSize*len(testRegions)
	var order []int
	seen := make([]bool, hdrFileSize)
	add := func(lo, hi int) {
		for o := lo; o < hi; o++ {
			if !seen[o] {
				seen[o] = true
				order = append(order, o)
			}
		}
	}
	add(slotHdrOff+slotHdrSize, slotHdrOff+slotHdrSize+used)
	add(slotHdrOff, slotHdrOff+used)
	add(0, descOff+descSize*len(testRegions))
	add(layoutCRCOff, layoutSize)
	add(0, hdrFileSize)
	return order
}()

// rewrite makes the file at p hold b. It does not truncate the file to
// zero first, which on ext4 would make closing it flush it to disk.
func rewrite(t *testing.T, p string, b []byte) {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(len(b))); err != nil {
		t.Fatal(err)
	}
}

// exercise uses slots opened from a fuzzed header.
func exercise(t *testing.T, s *Slots) {
	defer s.Close()
	regions := s.Regions()
	steps, ok := s.Committed()
	sn, err := s.Newest()
	switch {
	case err == nil:
		if !ok[sn.Slot] || steps[sn.Slot] != sn.Step {
			t.Fatalf("Newest is step %d in slot %d, Committed says %v %v", sn.Step, sn.Slot, steps, ok)
		}
		for i, v := range sn.Views() {
			if int64(len(v)) != regions[i].Size {
				t.Fatalf("view of %q has %d bytes, want %d", regions[i].Name, len(v), regions[i].Size)
			}
		}
	case errors.Is(err, ErrEmpty), errors.Is(err, ErrCorrupt):
	default:
		t.Fatalf("Newest: %v", err)
	}
	// At of a step a slot claims committed returns it or ErrCorrupt;
	// the step Newest returned without a fallback, At returns too.
	for i := range 2 {
		if !ok[i] {
			continue
		}
		at, aerr := s.At(steps[i])
		switch {
		case aerr == nil:
			if at.Step != steps[i] || at.Slot != i || at.Fallback != nil {
				t.Fatalf("At(%d) is step %d in slot %d (Fallback %v), Committed says slot %d", steps[i], at.Step, at.Slot, at.Fallback, i)
			}
		case !errors.Is(aerr, ErrCorrupt):
			t.Fatalf("At(%d): %v", steps[i], aerr)
		case err == nil && sn.Fallback == nil && sn.Slot == i:
			t.Fatalf("At(%d): %v, but Newest returned it", steps[i], aerr)
		}
	}
	next := max(steps[0], steps[1]) + 1
	if next == 0 {
		return // a forged step of 2^64-1: nothing can follow it
	}
	st, err := s.Stage(next)
	if err != nil {
		t.Fatalf("Stage(%d) with %v %v committed: %v", next, steps, ok, err)
	}
	for i, v := range st.Views() {
		fill(next, i, v)
	}
	if err := st.Commit(); err != nil {
		t.Fatal(err)
	}
	sn, err = s.Newest()
	if err != nil || sn.Step != next || sn.Slot != st.Slot() {
		t.Fatalf("after committing step %d: Newest = %+v, %v", next, sn, err)
	}
	for i, v := range sn.Views() {
		if !bytes.Equal(v, want(next, i, regions[i].Size)) {
			t.Fatalf("region %q of step %d differs from what was committed", regions[i].Name, next)
		}
	}
}

// FuzzParseName checks parseName on arbitrary names and job ids: a name
// it accepts is exactly the name ckpt gives that job's rank's header or
// data file, and no name is two valid jobs' files.
func FuzzParseName(f *testing.F) {
	f.Add("gorun-a.r0.hdr", "a", "a-r0")
	f.Add("gorun-a-r0.r0.hdr", "a", "a-r0")
	f.Add("gorun-a-b.r12.meta", "a-b", "a")
	f.Add("gorun-a.r0.meta", "a", "a.r0")
	f.Add("gorun-x.r2147483647.p_-", "x", "x-")
	f.Add("gorun-x.r01.hdr", "x", "")
	f.Fuzz(func(t *testing.T, name, job, other string) {
		rank, region, ok := parseName(name, job)
		if !ok {
			return
		}
		if !validJob(job) {
			// The callers check job first; parseName of an invalid job
			// only has to be harmless (no path separators in names
			// from ReadDir).
			return
		}
		want := hdrName(job, rank)
		if region != "" {
			if !validName(region) {
				t.Fatalf("parseName(%q, %q) gives the invalid region %q", name, job, region)
			}
			want = dataName(job, rank, region)
		}
		if name != want || rank < 0 || rank > maxRank {
			t.Fatalf("parseName(%q, %q) = %d, %q: that file is named %q", name, job, rank, region, want)
		}
		if other != job && validJob(other) {
			if r, g, ok := parseName(name, other); ok {
				t.Fatalf("%q is both job %q's (rank %d, %q) and job %q's (rank %d, %q)", name, job, rank, region, other, r, g)
			}
		}
	})
}
