package durable

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSaveLoad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		writers int
		chunk   int
	}{
		{"1writer", 1, testChunk},
		{"4writers", 4, testChunk},
		{"bigchunk", 3, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := newDir(t, 4)
			s := openTest(t, dir, 3, Options{Writers: tc.writers, ChunkSize: tc.chunk, Concurrency: 2})
			save(t, s, 10)
			save(t, s, 20)
			checkLoad(t, dir, 3, 10)
			checkLoad(t, dir, 3, 20)
			if v, ok := s.Latest(); !ok || v.Step != 20 {
				t.Errorf("Latest = %+v, %v; want step 20", v, ok)
			}
			if err := Load(context.Background(), dir, 3, 30, buffers(testRegions)); !isNoVersion(err) {
				t.Errorf("Load of a step never saved: %v, want ErrNoVersion", err)
			}
			for _, step := range []int64{10, 20} {
				m, err := Markers(dir, 4, step)
				if err != nil || !slices.Equal(m, []bool{false, false, false, true}) {
					t.Errorf("Markers(%d) = %v, %v; want rank 3's only", step, m, err)
				}
			}
			checkVerify(t, dir)
		})
	}
}

// TestSaveChecksSource: a source that does not match its CRC32Cs (a slot
// overwritten while it was read) is never persisted.
func TestSaveChecksSource(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, 0, Options{})
	src, sums := testData(testRegions, 0, 5)
	src[1][7] ^= 1
	called := false
	err := s.Save(context.Background(), 5, src, sums, func() { called = true })
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Save of a changed source: %v, want ErrCorrupt", err)
	}
	if called {
		t.Error("copied was called for a source that did not match")
	}
	if err := Load(context.Background(), dir, 0, 5, buffers(testRegions)); !isNoVersion(err) {
		t.Errorf("Load after the failed save: %v, want ErrNoVersion", err)
	}
	save(t, s, 6)
	checkLoad(t, dir, 0, 6)
}

func TestSaveBusy(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, 0, Options{Concurrency: 1})
	release := make(chan struct{})
	blocked := make(chan struct{})
	s.hook = func(p string, _ int64) error {
		if p == "header" {
			close(blocked)
			<-release
		}
		return nil
	}
	done := make(chan error)
	go func() {
		src, sums := testData(testRegions, 0, 1)
		done <- s.Save(context.Background(), 1, src, sums, nil)
	}()
	<-blocked
	src, sums := testData(testRegions, 0, 2)
	if err := s.Save(context.Background(), 2, src, sums, nil); !errors.Is(err, ErrBusy) {
		t.Errorf("a second Save with concurrency 1: %v, want ErrBusy", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.hook = nil
	// Two files, step 1 in one: the next save takes the other; then
	// neither is free until Reclaim.
	save(t, s, 2)
	if err := s.Save(context.Background(), 3, src, sums, nil); !errors.Is(err, ErrBusy) {
		t.Errorf("a Save with both files complete: %v, want ErrBusy", err)
	}
	if n, err := s.Reclaim(2); n != 1 || err != nil {
		t.Errorf("Reclaim(2) = %d, %v; want 1 file freed", n, err)
	}
	save(t, s, 3)
	checkLoad(t, dir, 0, 2)
	checkLoad(t, dir, 0, 3)
}

// TestReopen: a store reopened finds its versions, its pointer and its
// counter, and keeps the files (no truncation).
func TestReopen(t *testing.T) {
	dir := newDir(t, 2)
	s := openTest(t, dir, 1, Options{Concurrency: 2})
	save(t, s, 1)
	save(t, s, 2)
	s.Close()
	s = openTest(t, dir, 1, Options{Concurrency: 2})
	if v, ok := s.Latest(); !ok || v.Step != 2 || v.Version != 2 {
		t.Errorf("Latest after reopening = %+v, %v; want step 2, version 2", v, ok)
	}
	if vs := s.Versions(); len(vs) != 2 {
		t.Errorf("Versions after reopening = %+v, want 2", vs)
	}
	save(t, s, 3)
	if v, _ := s.Latest(); v.Version != 3 {
		t.Errorf("the counter restarted: version %d, want 3", v.Version)
	}
	checkLoad(t, dir, 1, 1)
	checkLoad(t, dir, 1, 2)
	checkLoad(t, dir, 1, 3)
	// A store with a larger chunk size keeps the complete versions
	// readable and uses the new size for free files.
	s.Close()
	s = openTest(t, dir, 1, Options{Concurrency: 3, ChunkSize: 16384})
	save(t, s, 4)
	for _, step := range []int64{1, 2, 3, 4} {
		checkLoad(t, dir, 1, step)
	}
	checkVerify(t, dir)
}

func TestOpenBadArgs(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		rank    int
		regions []Region
		opt     Options
	}{
		{"negative rank", -1, testRegions, Options{}},
		{"no regions", 0, nil, Options{}},
		{"bad name", 0, []Region{{Name: "Bad", Size: 1}}, Options{}},
		{"duplicate", 0, []Region{{Name: "a", Size: 1}, {Name: "a", Size: 2}}, Options{}},
		{"concurrency", 0, testRegions, Options{Concurrency: MaxConcurrency + 1}},
		{"chunk", 0, testRegions, Options{ChunkSize: 1000}},
		{"writers", 0, testRegions, Options{Writers: -1}},
	} {
		if s, err := Open(dir, tc.rank, tc.regions, tc.opt); err == nil {
			s.Close()
			t.Errorf("%s: Open succeeded", tc.name)
		}
	}
	src, sums := testData(testRegions, 0, 1)
	s := openTest(t, dir, 0, Options{})
	if err := s.Save(context.Background(), 1, src[:2], sums, nil); err == nil {
		t.Error("Save with too few sources succeeded")
	}
	if err := s.Save(context.Background(), -1, src, sums, nil); err == nil {
		t.Error("Save of a negative step succeeded")
	}
	s.Close()
	if err := s.Save(context.Background(), 1, src, sums, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Save after Close: %v, want ErrClosed", err)
	}
}

// TestOpenRemovesTemporaries: a crash inside an atomic replacement
// leaves a temporary file, which Open removes and nothing reads.
func TestOpenRemovesTemporaries(t *testing.T) {
	dir := newDir(t, 1)
	s := openTest(t, dir, 0, Options{})
	save(t, s, 1)
	s.Close()
	tmp := filepath.Join(rankDir(dir, 0), tempName(latestName))
	if err := os.WriteFile(tmp, []byte("half a pointer"), 0o600); err != nil {
		t.Fatal(err)
	}
	checkVerify(t, dir)
	openTest(t, dir, 0, Options{})
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary file is still there: %v", err)
	}
}

func TestDefaultConcurrency(t *testing.T) {
	const s = 1e9
	for _, tc := range []struct {
		tw, t    float64 // seconds
		every    int
		overhead float64
		want     int
	}{
		{10, 1, 10, 0.03, 1},   // 10 s to write, 10.3 s between bases: one at a time
		{20, 1, 10, 0.03, 2},   // 20 s: two in flight
		{20.5, 1, 10, 0.03, 2}, // just under q·every·t·2
		{20.7, 1, 10, 0.03, 3},
		{1000, 1, 1, 0.03, MaxConcurrency},
		{0, 1, 10, 0.03, 1},
		{10, 0, 10, 0.03, 1},
		{10, 1, 0, 0.03, 1},
		{10, 1, 10, -1, 1},
	} {
		got := DefaultConcurrency(durationOf(tc.tw*s), durationOf(tc.t*s), tc.every, tc.overhead)
		if got != tc.want {
			t.Errorf("DefaultConcurrency(%vs, %vs, %d, %v) = %d, want %d", tc.tw, tc.t, tc.every, tc.overhead, got, tc.want)
		}
	}
}

func durationOf(ns float64) time.Duration { return time.Duration(ns) }

// TestLateSaveAfterWatermark: a save that finishes after Reclaim moved
// the watermark past its step gives its file back at once, unmarked:
// kept, it would hold a file no commit can ever free (the commit record
// only moves forward), and with every file held so the rank's saves
// would all fail ErrBusy.
func TestLateSaveAfterWatermark(t *testing.T) {
	dir := newDir(t, 1)
	s := openTest(t, dir, 0, Options{Concurrency: 2})
	atHeader := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	s.hook = func(p string, _ int64) error {
		if p == "header" {
			first := false
			once.Do(func() { first = true })
			if first {
				close(atHeader)
				<-release
			}
		}
		return nil
	}
	late := make(chan error)
	go func() {
		src, sums := testData(testRegions, 0, 10)
		late <- s.Save(context.Background(), 10, src, sums, nil)
	}()
	<-atHeader
	save(t, s, 20)
	if err := Commit(dir, 20); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reclaim(20); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-late; err != nil {
		t.Fatal(err)
	}
	if vs := s.Versions(); len(vs) != 1 || vs[0].Step != 20 {
		t.Errorf("Versions = %+v, want step 20 only", vs)
	}
	if m, _ := Markers(dir, 1, 10); m[0] {
		t.Error("the superseded step 10 was marked")
	}
	save(t, s, 30)
	save(t, s, 40) // two free files: the superseded one came back
	checkVerify(t, dir)
}

// TestMarked: Marked lists the steps of the rank's complete versions
// whose marker names them exactly, reading the rank's own markers only:
// a marker naming another file or version (left by a version since
// freed and saved again), a missing marker or another rank's do not
// count.
func TestMarked(t *testing.T) {
	dir := newDir(t, 3)
	s := openTest(t, dir, 2, Options{Concurrency: 3})
	for _, st := range []int64{1, 2, 3} {
		save(t, s, st)
	}
	rd := rankDir(dir, 2)
	var v2 Version
	for _, v := range s.Versions() {
		if v.Step == 2 {
			v2 = v
		}
	}
	i, _ := parseBase(filepath.Base(v2.File))
	stale := encodePointer(magicMarker, pointer{rank: 2, file: i, step: 2, version: v2.Version + 7, hdrCRC: 1})
	if err := os.WriteFile(filepath.Join(rd, doneName(2)), stale, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(rd, doneName(3))); err != nil {
		t.Fatal(err)
	}
	// Rank 0 has no directory at all: it is never read.
	if got := s.Marked(); !slices.Equal(got, []int64{1}) {
		t.Errorf("Marked = %v, want [1]", got)
	}
}

// TestSaveSourceReleased: once Save called copied the caller may
// overwrite its source (a rank's stage reuses the slot at once): the
// version persisted is still the source's bytes as they were, whether
// the chunks are written with O_DIRECT, through the page cache, or
// through the page cache after the file system refused direct writes
// (from the first, or midway through the save, mixing both ways in one
// version; with EINVAL or "not supported"; or by refusing to open the
// files with O_DIRECT at all).
func TestSaveSourceReleased(t *testing.T) {
	for _, tc := range []struct {
		name       string
		buffered   bool  // the store writes through the page cache from the start
		openRefuse bool  // opening the base files with O_DIRECT fails
		refuseFrom int32 // direct writes from this one on (counted from 1) fail with refuse; 0: none
		refuse     error
		direct     bool // some chunks are written with O_DIRECT
	}{
		{name: "direct", direct: true},
		{name: "buffered", buffered: true},
		{name: "open refused", openRefuse: true},
		{name: "refused", refuseFrom: 1, refuse: unix.EINVAL},
		{name: "refused midway", refuseFrom: 3, refuse: unix.EINVAL, direct: true},
		{name: "not supported", refuseFrom: 1, refuse: unix.EOPNOTSUPP},
		{name: "not supported midway", refuseFrom: 2, refuse: unix.ENOTSUP, direct: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := newDir(t, 1)
			if tc.openRefuse {
				open := openDirectFile
				openDirectFile = func(string) (*os.File, error) { return nil, &fs.PathError{Op: "open", Path: "base", Err: unix.EINVAL} }
				t.Cleanup(func() { openDirectFile = open })
			}
			s := openTest(t, dir, 0, Options{Writers: 2})
			if !tc.openRefuse && s.files[0].direct == nil {
				t.Skip("the test directory's file system refuses O_DIRECT")
			}
			s.buffered.Store(tc.buffered)
			var tries, refused atomic.Int32
			s.hook = func(p string, _ int64) error {
				if p != "direct" {
					return nil
				}
				if n := tries.Add(1); tc.refuseFrom > 0 && n >= tc.refuseFrom {
					refused.Add(1)
					return tc.refuse
				}
				return nil
			}
			src, sums := testData(testRegions, 0, 7)
			err := s.Save(context.Background(), 7, src, sums, func() {
				for _, b := range src {
					for j := range b {
						b[j] ^= 0xa5
					}
				}
			})
			if err != nil {
				t.Fatalf("Save: %v", err)
			}
			checkLoad(t, dir, 0, 7)
			if direct := tries.Load() - refused.Load(); tc.direct != (direct > 0) {
				t.Errorf("%d chunks written with O_DIRECT, want some: %v", direct, tc.direct)
			}
			// Each writer may try a direct write before any sees the first
			// refusal: one refusal at least, one per writer at most.
			if n := refused.Load(); tc.refuseFrom > 0 && (n < 1 || n > int32(s.writers) || !s.buffered.Load()) {
				t.Errorf("%d direct writes refused, buffered %v: want 1 to %d (one per writer at most), then every write through the page cache", n, s.buffered.Load(), s.writers)
			}
			if tc.openRefuse && (s.files[0].direct != nil || tries.Load() != 0) {
				t.Errorf("O_DIRECT refused at open: the store tried %d direct writes", tries.Load())
			}
			checkVerify(t, dir)
		})
	}
}

// TestDirectWriteFails: a direct write that fails for another reason
// than O_DIRECT itself (a full disk, an I/O error) abandons the version,
// as a write through the page cache would: it is not written again
// through the page cache, and the store keeps writing with O_DIRECT.
func TestDirectWriteFails(t *testing.T) {
	for _, errno := range []error{unix.ENOSPC, unix.EIO} {
		t.Run(errno.Error(), func(t *testing.T) {
			dir := newDir(t, 1)
			s := openTest(t, dir, 0, Options{Writers: 2})
			if s.files[0].direct == nil {
				t.Skip("the test directory's file system refuses O_DIRECT")
			}
			s.hook = func(p string, _ int64) error {
				if p == "direct" {
					return errno
				}
				return nil
			}
			src, sums := testData(testRegions, 0, 7)
			if err := s.Save(context.Background(), 7, src, sums, nil); !errors.Is(err, errno) {
				t.Fatalf("Save with direct writes failing with %v: %v", errno, err)
			}
			if v := s.Versions(); len(v) != 0 || s.buffered.Load() {
				t.Errorf("after a failed direct write: versions %+v, buffered %v; want none, false", v, s.buffered.Load())
			}
			s.hook = nil
			save(t, s, 8)
			checkLoad(t, dir, 0, 8)
			if d, c := s.Written(); d != 2 || c != 0 {
				t.Errorf("%d saves began with O_DIRECT, %d through the page cache; want 2, 0", d, c)
			}
		})
	}
}

// TestCopyWaited: after a caller waited for a save's copy the next
// PageCacheSaves saves write their chunks through the page cache (their
// copy ends with the page cache's, not the device's writes); then the
// store goes back to O_DIRECT. A wait during the page-cache saves starts
// their count again.
func TestCopyWaited(t *testing.T) {
	dir := newDir(t, 1)
	s := openTest(t, dir, 0, Options{})
	if s.files[0].direct == nil {
		t.Skip("the test directory's file system refuses O_DIRECT")
	}
	var tries atomic.Int32
	s.hook = func(p string, _ int64) error {
		if p == "direct" {
			tries.Add(1)
		}
		return nil
	}
	step := int64(0)
	saveHow := func(want string) {
		t.Helper()
		step++
		before := tries.Load()
		save(t, s, step)
		checkLoad(t, dir, 0, step)
		if _, err := s.Reclaim(step); err != nil {
			t.Fatal(err)
		}
		if got := map[bool]string{true: "direct", false: "cached"}[tries.Load() > before]; got != want {
			t.Fatalf("save %d written %s, want %s", step, got, want)
		}
	}
	saveHow("direct")
	s.CopyWaited()
	for range PageCacheSaves - 1 {
		saveHow("cached")
	}
	s.CopyWaited()
	for range PageCacheSaves {
		saveHow("cached")
	}
	saveHow("direct")
	saveHow("direct")
	if d, c := s.Written(); d != 3 || c != 2*PageCacheSaves-1 {
		t.Errorf("Written = %d direct, %d cached; want 3, %d", d, c, 2*PageCacheSaves-1)
	}
}
