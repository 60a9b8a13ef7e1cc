package durable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
)

// TestIOErrors injects ENOSPC and EIO at every write and sync of a save
// of step 20 (step 10 committed, concurrency 1: two base files). Before
// the header is durable, the version is abandoned: Save returns the
// error, step 20 is not there, Verify finds nothing wrong, and the next
// Save (with the disk healthy again) uses the file. After it, the
// version is complete but not marked: the next Save marks it, the
// launcher commits it, and the save after the reclamation works.
func TestIOErrors(t *testing.T) {
	for _, tc := range []struct {
		point     string
		arg       int64
		errno     syscall.Errno
		published bool // the fault comes after the header is durable
	}{
		{"free", 0, syscall.ENOSPC, false},
		{"chunk", 0, syscall.EIO, false},
		{"chunk", 4, syscall.ENOSPC, false},
		{"table", 0, syscall.ENOSPC, false},
		{"datasync", 0, syscall.EIO, false},
		{"header", 0, syscall.ENOSPC, false},
		{"headersync", 0, syscall.EIO, false},
		{"latest.write", 0, syscall.ENOSPC, true},
		{"latest.sync", 0, syscall.EIO, true},
		{"latest.rename", 0, syscall.EIO, true},
		{"latest.syncdir", 0, syscall.EIO, true},
		{"marker.write", 0, syscall.ENOSPC, true},
		{"marker.sync", 0, syscall.EIO, true},
		{"marker.syncdir", 0, syscall.EIO, true},
	} {
		t.Run(fmt.Sprintf("%s%d-%v", tc.point, tc.arg, tc.errno), func(t *testing.T) {
			dir := newDir(t, 1)
			s := openTest(t, dir, 0, Options{Concurrency: 1, Writers: 2})
			save(t, s, 10)
			if err := Commit(dir, 10); err != nil {
				t.Fatal(err)
			}
			s.hook = hookAt(tc.point, tc.arg, tc.errno)
			src, sums := testData(testRegions, 0, 20)
			err := s.Save(context.Background(), 20, src, sums, nil)
			if !errors.Is(err, tc.errno) {
				t.Fatalf("Save with %v at %s: %v", tc.errno, tc.point, err)
			}
			s.hook = nil
			if m, _ := Markers(dir, 1, 20); m[0] && tc.point != "marker.syncdir" {
				t.Errorf("step 20 is marked after a failure at %s", tc.point)
			}
			checkVerify(t, dir)
			checkLoad(t, dir, 0, 10)
			if !tc.published {
				if err := Load(context.Background(), dir, 0, 20, buffers(testRegions)); !isNoVersion(err) {
					t.Errorf("Load of the abandoned step 20: %v, want ErrNoVersion", err)
				}
				save(t, s, 21) // the file is free again
				checkLoad(t, dir, 0, 21)
				return
			}
			checkLoad(t, dir, 0, 20) // complete, not yet marked
			src, sums = testData(testRegions, 0, 30)
			if err := s.Save(context.Background(), 30, src, sums, nil); !errors.Is(err, ErrBusy) {
				t.Errorf("Save(30) with both files held: %v, want ErrBusy", err)
			}
			// That Save marked step 20 first.
			m, _ := Markers(dir, 1, 20)
			if !slices.Equal(m, []bool{true}) {
				t.Fatalf("step 20 is still not marked after the next Save: %v", m)
			}
			if v, _ := s.Latest(); v.Step != 20 {
				t.Errorf("Latest = %+v, want step 20", v)
			}
			if err := Commit(dir, 20); err != nil {
				t.Fatal(err)
			}
			if n, err := s.Reclaim(20); n != 1 || err != nil {
				t.Fatalf("Reclaim(20) = %d, %v", n, err)
			}
			save(t, s, 30)
			checkLoad(t, dir, 0, 20)
			checkLoad(t, dir, 0, 30)
			checkVerify(t, dir)
		})
	}
}
