package ckpt

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func mkfifo(path string) error { return syscall.Mkfifo(path, 0o600) }

// fixLayoutCRC recomputes the layout's CRC of header b, as a hostile
// writer would, so that the checks behind it are reached.
func fixLayoutCRC(b []byte) {
	if len(b) >= layoutSize {
		ne.PutUint32(b[layoutCRCOff:], crc32.Checksum(b[:layoutCRCOff], castagnoli))
	}
}

// fixSlotCRC recomputes slot i's header CRC of header b (N regions).
func fixSlotCRC(b []byte, i, n int) {
	h := b[slotHdrOff+slotHdrSize*i:][:slotHdrSize]
	ne.PutUint32(h[4:], crc32.Checksum(h[8:entOff+entSize*n], castagnoli))
}

// editHeader applies edit to the header file in opt's directory.
func editHeader(t *testing.T, opt Options, edit func([]byte) []byte) {
	t.Helper()
	p := filepath.Join(opt.Dir, hdrName(testJob, 0))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, edit(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestOpenLayoutErrors(t *testing.T) {
	d0 := descOff // optimizer's descriptor
	d1 := descOff + descSize
	set32 := func(off int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { ne.PutUint32(b[off:], v); return b }
	}
	set64 := func(off int, v uint64) func([]byte) []byte {
		return func(b []byte) []byte { ne.PutUint64(b[off:], v); return b }
	}
	setByte := func(off int, v byte) func([]byte) []byte {
		return func(b []byte) []byte { b[off] = v; return b }
	}
	path := func(dir, name string) string { return filepath.Join(dir, name) }
	for _, tc := range []struct {
		name    string
		header  func([]byte) []byte // edits the header file
		fix     bool                // then recomputes the layout's CRC
		files   func(t *testing.T, dir string)
		regions []Region // Open's; nil takes the header's
		is      error
		msg     string
		// newest, if set: Open succeeds, Newest fails with ErrCorrupt
		// saying this
		newest string
	}{
		{name: "bad magic", header: setByte(0, 'X'), is: ErrLayout, msg: `bad magic "XRCK"`},
		{name: "version", header: setByte(4, 2), fix: true, is: ErrLayout, msg: "version 2, want 1"},
		{name: "layout CRC", header: setByte(d1+33, 1), is: ErrLayout, msg: "layout CRC32C"},
		{name: "reserved after the version", header: setByte(6, 1), fix: true, is: ErrLayout, msg: "reserved bytes 5-7"},
		{name: "no regions", header: set32(countOff, 0), fix: true, is: ErrLayout, msg: "region count 0"},
		{name: "seventeen regions", header: set32(countOff, 17), fix: true, is: ErrLayout, msg: "region count 17"},
		{name: "huge count", header: set32(countOff, 1<<31), fix: true, is: ErrLayout, msg: "region count 2147483648"},
		{name: "count too small", header: set32(countOff, 3), fix: true, is: ErrLayout, msg: "after the region descriptors are not zero"},
		{name: "count too large", header: set32(countOff, 5), fix: true, is: ErrLayout, msg: `region 4: invalid name ""`},
		{name: "other rank", header: set32(rankOff, 7), fix: true, is: ErrLayout, msg: "rank 7's, not rank 0's"},
		{name: "other job", header: setByte(jobOff, 'x'), fix: true, is: ErrLayout, msg: `job "xob0test"'s`},
		{name: "longer job", header: setByte(jobOff+len(testJob), 'x'), fix: true, is: ErrLayout, msg: `job "job0testx"'s`},
		{name: "job with junk after it", header: setByte(jobOff+40, 'x'), fix: true, is: ErrLayout, msg: "job id field has bytes after its end"},
		{name: "reserved after the job", header: setByte(100, 1), fix: true, is: ErrLayout, msg: "reserved bytes 80-127"},
		{name: "upper-case name", header: setByte(d0, 'O'), fix: true, is: ErrLayout, msg: `region 0: invalid name "Optimizer`},
		{name: "name with junk after it", header: setByte(d0+20, 'x'), fix: true, is: ErrLayout, msg: `region 0: name "optimizer" has bytes after its end`},
		{name: "name with a slash", header: setByte(d0+3, '/'), fix: true, is: ErrLayout, msg: "region 0: invalid name"},
		{name: "empty name", header: func(b []byte) []byte { clear(b[d1 : d1+maxNameLen]); return b }, fix: true, is: ErrLayout, msg: `region 1: invalid name ""`},
		{name: "duplicate name", header: func(b []byte) []byte { copy(b[d1:d1+maxNameLen], b[d0:d0+maxNameLen]); return b }, fix: true, is: ErrLayout, msg: `region "optimizer" named twice`},
		{name: "size over the limit", header: set64(d0+maxNameLen, 1<<41), fix: true, is: ErrLayout, msg: "size 2199023255552 over"},
		{name: "size of another stride", header: set64(d0+maxNameLen, 20_000), fix: true, is: ErrLayout, msg: "24576 bytes, the layout says 40960"},
		{name: "size within the stride", header: set64(d0+maxNameLen, 10_001), fix: true, newest: `size 10000, the layout says 10001`},
		{name: "size within the stride, regions given", header: set64(d0+maxNameLen, 10_001), fix: true, regions: testRegions, is: ErrLayout, msg: "the files hold regions [optimizer:10001"},
		{name: "bytes after the descriptors", header: setByte(1000, 1), fix: true, is: ErrLayout, msg: "bytes 288-1019 after the region descriptors"},
		{name: "truncated header", header: func(b []byte) []byte { return b[:100] }, is: ErrLayout, msg: "100 bytes, want 4096"},
		{name: "empty header", header: func(b []byte) []byte { return nil }, is: ErrLayout, msg: "0 bytes, want 4096"},
		{name: "long header", header: func(b []byte) []byte { return append(b, make([]byte, 4096)...) }, is: ErrLayout, msg: "8192 bytes, want 4096"},
		{name: "other regions", regions: []Region{{"optimizer", 10_000}, {"params", 3 * 4096}}, is: ErrLayout, msg: "the files hold regions"},
		{name: "regions in another order", regions: []Region{testRegions[1], testRegions[0], testRegions[2], testRegions[3]}, is: ErrLayout, msg: "the files hold regions"},
		{name: "truncated data file", files: func(t *testing.T, dir string) {
			if err := os.Truncate(path(dir, dataName(testJob, 0, "optimizer")), 12288); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "12288 bytes, the layout says 24576"},
		{name: "long data file", files: func(t *testing.T, dir string) {
			if err := os.Truncate(path(dir, dataName(testJob, 0, "empty")), 1); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "1 bytes, the layout says 0"},
		{name: "missing data file", files: func(t *testing.T, dir string) {
			if err := os.Remove(path(dir, dataName(testJob, 0, "params"))); err != nil {
				t.Fatal(err)
			}
		}, is: fs.ErrNotExist, msg: "gorun-job0test.r0.params"},
		{name: "data file a symbolic link", files: func(t *testing.T, dir string) {
			p := path(dir, dataName(testJob, 0, "meta"))
			if err := os.Rename(p, p+".real"); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(p+".real", p); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "symbolic link"},
		{name: "data file a directory", files: func(t *testing.T, dir string) {
			p := path(dir, dataName(testJob, 0, "meta"))
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "is a directory"},
		{name: "header writable by others", files: func(t *testing.T, dir string) {
			if err := os.Chmod(path(dir, hdrName(testJob, 0)), 0o622); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "writable by others"},
		{name: "header a FIFO", files: func(t *testing.T, dir string) {
			p := path(dir, hdrName(testJob, 0))
			os.Remove(p)
			if err := mkfifo(p); err != nil {
				t.Skip(err)
			}
		}, is: ErrLayout, msg: "not a regular file"},
		{name: "missing header", files: func(t *testing.T, dir string) {
			if err := os.Remove(path(dir, hdrName(testJob, 0))); err != nil {
				t.Fatal(err)
			}
		}, is: fs.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, opt := create(t, testRegions)
			commit(t, s, 1)
			commit(t, s, 2)
			if tc.header != nil {
				editHeader(t, opt, func(b []byte) []byte {
					b = tc.header(b)
					if tc.fix {
						fixLayoutCRC(b)
					}
					return b
				})
			}
			if tc.files != nil {
				tc.files(t, opt.Dir)
			}
			r, err := Open(testJob, 0, tc.regions, opt)
			if tc.newest != "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				defer r.Close()
				_, err := r.Newest()
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.newest) {
					t.Fatalf("Newest: %v, want ErrCorrupt saying %q", err, tc.newest)
				}
				return
			}
			if err == nil {
				r.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), "ckpt: ") {
				t.Fatalf("Open: %q, want an error wrapping %v saying %q", err, tc.is, tc.msg)
			}
			// The writer's mapping is untouched by a failed Open.
			if tc.header == nil && tc.files == nil {
				checkNewest(t, s, 2, 1, false)
			}
		})
	}
}

// TestCorruptSlotHeader corrupts the slots' headers (state words, steps,
// CRCs, entries) and checks that Newest falls back to the other slot, or
// fails with ErrCorrupt (ErrEmpty when neither slot claims a commit).
func TestCorruptSlotHeader(t *testing.T) {
	n := len(testRegions)
	slot := func(i int) int { return slotHdrOff + slotHdrSize*i }
	ent := func(i, r int) int { return slot(i) + entOff + entSize*r }
	type edit struct {
		off   int
		width int // 1, 4 or 8: the value is stored; 0: the byte is flipped
		v     uint64
		fix   bool // recompute the slot's header CRC
	}
	for _, tc := range []struct {
		name     string
		edits    []edit
		step     uint64 // 0: an error wrapping is
		fallback string
		is       error
		msg      string
	}{
		{name: "garbage state in the newest", edits: []edit{{slot(1), 4, 0x12345678, false}}, step: 1, fallback: "slot 1: state word 0x12345678"},
		{name: "one bit off committed", edits: []edit{{slot(1), 4, stateCommitted ^ 1, false}}, step: 1, fallback: "slot 1: state word"},
		{name: "garbage state in both", edits: []edit{{slot(0), 4, 7, false}, {slot(1), 4, 0xffffffff, false}}, is: ErrCorrupt, msg: "slot 0: state word 0x00000007"},
		{name: "newest staging", edits: []edit{{slot(1), 4, stateStaging, false}}, step: 1},
		{name: "newest empty", edits: []edit{{slot(1), 4, stateEmpty, false}}, step: 1},
		{name: "both empty", edits: []edit{{slot(0), 4, stateEmpty, false}, {slot(1), 4, stateEmpty, false}}, is: ErrEmpty},
		{name: "both staging", edits: []edit{{slot(0), 4, stateStaging, false}, {slot(1), 4, stateStaging, false}}, is: ErrEmpty},
		{name: "newest's step changed", edits: []edit{{slot(1) + 8, 0, 0, false}}, step: 1, fallback: "slot 1 (step 253): header CRC32C"},
		{name: "newest's header CRC changed", edits: []edit{{slot(1) + 4, 0, 0, false}}, step: 1, fallback: "slot 1 (step 2): header CRC32C"},
		{name: "newest's entry CRC changed", edits: []edit{{ent(1, 0) + 8, 0, 0, false}}, step: 1, fallback: "header CRC32C"},
		{name: "newest's entry CRC changed with its header CRC", edits: []edit{{ent(1, 2) + 8, 0, 0, true}}, step: 1, fallback: `region "meta": CRC32C`},
		{name: "newest's entry size", edits: []edit{{ent(1, 0), 8, 10_001, true}}, step: 1, fallback: `region "optimizer": size 10001, the layout says 10000`},
		{name: "newest's entry reserved word", edits: []edit{{ent(1, 3) + 12, 4, 1, true}}, step: 1, fallback: `region "empty": reserved word 0x1`},
		{name: "older's header CRC changed", edits: []edit{{slot(0) + 4, 0, 0, false}}, step: 2},
		{name: "both headers' CRCs changed", edits: []edit{{slot(0) + 4, 0, 0, false}, {slot(1) + 4, 0, 0, false}}, is: ErrCorrupt, msg: "slot 0 (step 1): header CRC32C"},
		{name: "older claims the newer step", edits: []edit{{slot(0) + 8, 8, 3, true}}, step: 3},
		{name: "both claim one step", edits: []edit{{slot(0) + 8, 8, 2, true}}, step: 2, fallback: "slots 0 and 1 both claim step 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, opt := create(t, testRegions)
			commit(t, s, 1)
			commit(t, s, 2)
			editHeader(t, opt, func(b []byte) []byte {
				for _, e := range tc.edits {
					switch e.width {
					case 0:
						b[e.off] ^= 0xff
					case 1:
						b[e.off] = byte(e.v)
					case 4:
						ne.PutUint32(b[e.off:], uint32(e.v))
					case 8:
						ne.PutUint64(b[e.off:], e.v)
					}
					if e.fix {
						fixSlotCRC(b, (e.off-slotHdrOff)/slotHdrSize, n)
					}
				}
				return b
			})
			for _, r := range []*Slots{s, reopen(t, opt)} {
				sn, err := r.Newest()
				if tc.name == "both claim one step" {
					// Slot 0 (step 1's bytes) is returned, and the
					// conflict reported.
					if err != nil || sn.Step != 2 || sn.Slot != 0 || sn.Fallback == nil ||
						!errors.Is(sn.Fallback, ErrCorrupt) || !strings.Contains(sn.Fallback.Error(), tc.fallback) {
						t.Fatalf("Newest = %+v, %v", sn, err)
					}
					continue
				}
				if tc.name == "older claims the newer step" {
					// Slot 0 now claims step 3 over step 1's bytes:
					// those bytes still verify (the CRCs are of the
					// data), so it is returned. This is what a forged
					// header can do; it cannot make Newest return
					// bytes that were not committed.
					if err != nil || sn.Step != 3 || sn.Slot != 0 {
						t.Fatalf("Newest = %+v, %v", sn, err)
					}
					continue
				}
				if tc.step == 0 {
					if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) {
						t.Fatalf("Newest: %v, want an error wrapping %v saying %q", err, tc.is, tc.msg)
					}
					continue
				}
				if tc.fallback == "" {
					checkNewest(t, r, tc.step, int(tc.step-1)%2, false)
					continue
				}
				sn = checkNewest(t, r, tc.step, int(tc.step-1)%2, true)
				if !strings.Contains(sn.Fallback.Error(), tc.fallback) {
					t.Fatalf("Fallback %q does not say %q", sn.Fallback, tc.fallback)
				}
			}
		})
	}
}

func TestBadArguments(t *testing.T) {
	dir := t.TempDir()
	opt := Options{Dir: dir}
	regs := func(n int) []Region {
		rs := make([]Region, n)
		for i := range rs {
			rs[i] = Region{Name: "r" + string(rune('a'+i)), Size: 1}
		}
		return rs
	}
	for _, tc := range []struct {
		name    string
		job     string
		rank    int
		regions []Region
		msg     string
		layout  bool // wraps ErrLayout
	}{
		{"empty job", "", 0, testRegions, "invalid job id", false},
		{"upper-case job", "Job0test", 0, testRegions, "invalid job id", false},
		{"job starting with a dash", "-job0", 0, testRegions, "invalid job id", false},
		{"job with a dot", "job.0", 0, testRegions, "invalid job id", false},
		{"job with an underscore", "job_0", 0, testRegions, "invalid job id", false},
		{"job with a space", "job 0", 0, testRegions, "invalid job id", false},
		{"non-ASCII job", "jöb", 0, testRegions, "invalid job id", false},
		{"job with a slash", "a/b", 0, testRegions, "invalid job id", false},
		{"job dot dot", "..", 0, testRegions, "invalid job id", false},
		{"job with dot dot", "../x", 0, testRegions, "invalid job id", false},
		{"long job", strings.Repeat("a", 65), 0, testRegions, "invalid job id", false},
		{"negative rank", testJob, -1, testRegions, "invalid rank -1", false},
		{"huge rank", testJob, math.MaxInt, testRegions, "invalid rank", false}, // on 64-bit machines
		{"no regions", testJob, 0, nil, "0 regions", true},
		{"seventeen regions", testJob, 0, regs(17), "17 regions", true},
		{"empty name", testJob, 0, []Region{{"", 1}}, `invalid name ""`, true},
		{"upper-case name", testJob, 0, []Region{{"Params", 1}}, "invalid name", true},
		{"name starting with a digit", testJob, 0, []Region{{"1params", 1}}, "invalid name", true},
		{"name with a dot", testJob, 0, []Region{{"a.hdr", 1}}, "invalid name", true},
		{"name hdr", testJob, 0, []Region{{"meta", 1}, {"hdr", 1}}, `invalid name "hdr"`, true},
		{"name with a slash", testJob, 0, []Region{{"a/b", 1}}, "invalid name", true},
		{"long name", testJob, 0, []Region{{strings.Repeat("a", 33), 1}}, "invalid name", true},
		{"non-ASCII name", testJob, 0, []Region{{"paräms", 1}}, "invalid name", true},
		{"duplicate", testJob, 0, []Region{{"a", 1}, {"b", 2}, {"a", 3}}, `region "a" given twice`, true},
		{"negative size", testJob, 0, []Region{{"a", -1}}, "size -1 outside", true},
		{"size over the limit", testJob, 0, []Region{{"a", MaxRegionSize + 1}}, "outside", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.rank > 0 && tc.rank <= maxRank {
				t.Skip("ranks this large are valid on this machine")
			}
			s, err := Create(tc.job, tc.rank, tc.regions, opt)
			if err == nil {
				s.Close()
				t.Fatal("Create succeeded")
			}
			if !strings.Contains(err.Error(), tc.msg) || errors.Is(err, ErrLayout) != tc.layout {
				t.Fatalf("Create: %v, want an error saying %q (ErrLayout: %v)", err, tc.msg, tc.layout)
			}
			if tc.regions == nil {
				return // nil means "take the header's" for Open
			}
			if _, err := Open(tc.job, tc.rank, tc.regions, opt); err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Open: %v, want an error saying %q", err, tc.msg)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed Creates left %d files", len(entries))
	}
}

// TestCreateReplaces checks that Create replaces a rank's old files (and
// only its own), whatever regions they had, and that a process still
// mapping the old files keeps their memory.
func TestCreateReplaces(t *testing.T) {
	s, opt := create(t, testRegions)
	commit(t, s, 1)
	other, err := Create(testJob, 1, testRegions, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	commit(t, other, 9)
	s2, err := Create(testJob, 0, []Region{{"params", 100}}, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := s2.Newest(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Newest of re-created slots: %v", err)
	}
	for _, r := range testRegions[:1] {
		if _, err := os.Stat(filepath.Join(opt.Dir, dataName(testJob, 0, r.Name))); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("old data file of %q: %v", r.Name, err)
		}
	}
	checkNewest(t, s, 1, 0, false) // the old mapping
	checkNewest(t, other, 9, 0, false)
	r, err := Open(testJob, 1, testRegions, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	checkNewest(t, r, 9, 0, false)
}

// TestHeaderBytes pins the header's encoding: the layout byte by byte as
// the package comment gives it, and a committed slot's header.
func TestHeaderBytes(t *testing.T) {
	regions := []Region{{"optimizer", 5}, {"meta", 0}}
	opt := Options{Dir: t.TempDir()}
	s, err := Create("abc123", 42, regions, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.Stage(7)
	if err != nil {
		t.Fatal(err)
	}
	copy(st.Region("optimizer"), "hello")
	if err := st.Commit(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(opt.Dir, "gorun-abc123.r42.hdr"))
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian // the byte order of amd64 and arm64
	want := make([]byte, hdrFileSize)
	copy(want, "GRCK\x01\x00\x00\x00")
	le.PutUint32(want[8:], 2)
	le.PutUint32(want[12:], 42)
	copy(want[16:], "abc123")
	copy(want[128:], "optimizer")
	le.PutUint64(want[160:], 5)
	copy(want[168:], "meta")
	le.PutUint32(want[1020:], crc32.Checksum(want[:1020], crc32.MakeTable(crc32.Castagnoli)))
	h := want[1024:]
	le.PutUint32(h[0:], 0x544D4F43)
	le.PutUint64(h[8:], 7)
	le.PutUint64(h[16:], 5)
	le.PutUint32(h[24:], crc32.Checksum([]byte("hello"), crc32.MakeTable(crc32.Castagnoli)))
	le.PutUint32(h[40:], crc32.Checksum(nil, crc32.MakeTable(crc32.Castagnoli)))
	le.PutUint32(h[4:], crc32.Checksum(h[8:48], crc32.MakeTable(crc32.Castagnoli)))
	for i := range want {
		if b[i] != want[i] {
			t.Fatalf("header byte %d is %#02x, want %#02x", i, b[i], want[i])
		}
	}
	var staging [4]byte
	le.PutUint32(staging[:], stateStaging)
	if string(h[:4]) != "COMT" || string(staging[:]) != "STAG" {
		t.Fatal("the state words do not spell their names")
	}
	d, err := os.ReadFile(filepath.Join(opt.Dir, "gorun-abc123.r42.optimizer"))
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 2*4096 || string(d[:5]) != "hello" {
		t.Fatalf("data file of %d bytes starting %q", len(d), d[:5])
	}
	for _, name := range []string{"gorun-abc123.r42.hdr", "gorun-abc123.r42.optimizer", "gorun-abc123.r42.meta"} {
		fi, err := os.Stat(filepath.Join(opt.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
}
