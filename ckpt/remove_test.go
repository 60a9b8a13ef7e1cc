package ckpt

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestRemoveJob(t *testing.T) {
	opt := Options{Dir: t.TempDir()}
	for _, id := range []struct {
		job  string
		rank int
	}{{"abc", 0}, {"abc", 1}, {"abc", 12}, {"abcd", 0}, {"xabc", 0}, {"ab", 3}, {"abc-r0", 0}, {"abc-x", 1}} {
		s, err := Create(id.job, id.rank, testRegions, opt)
		if err != nil {
			t.Fatal(err)
		}
		commit(t, s, 1)
		s.Close()
	}
	// Files that look like job abc's but are not (among them the names
	// of the old form gorun-<job>-r<rank>[-<region>|.hdr]), and one that
	// is not a regular file.
	others := []string{
		"gorun-abc.notes", "gorun-abc.r", "gorun-abc.r01.hdr", "gorun-abc.r1.hdr~",
		"gorun-abc.r1.", "gorun-abc.r1.Meta", "gorun-abc.r1_meta", "gorun-abc.r1-meta",
		"gorun-abc.r99999999999.hdr", "gorun-abc.r2147483648.hdr", "gorun-abc.r-1.hdr",
		"gorun-abc.r1.meta.tmp", "gorun-abc.r0.hdr.tmp", "gorun-abc", "gorun-abc.",
		"xgorun-abc.r0.hdr", "gorun-abc-r0.hdr", "gorun-abc-r1-meta", "gorun-abc.R0.hdr",
		"unrelated",
	}
	for _, n := range others {
		if err := os.WriteFile(filepath.Join(opt.Dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(opt.Dir, "gorun-abc.r7.meta"), 0o700); err != nil {
		t.Fatal(err)
	}
	others = append(others, "gorun-abc.r7.meta")

	// Remove takes one rank's files.
	if err := Remove("abc", 1, opt); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		entries, err := os.ReadDir(opt.Dir)
		if err != nil {
			t.Fatal(err)
		}
		var ns []string
		for _, e := range entries {
			ns = append(ns, e.Name())
		}
		return ns
	}
	for _, n := range names() {
		if strings.HasPrefix(n, "gorun-abc.r1.") && !slices.Contains(others, n) {
			t.Errorf("Remove(abc, 1) left %s", n)
		}
	}
	if _, err := Open("abc", 0, testRegions, opt); err != nil {
		t.Errorf("Remove(abc, 1) broke rank 0: %v", err)
	}

	if err := RemoveJob("abc", opt); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, id := range []string{"gorun-abcd.r0", "gorun-xabc.r0", "gorun-ab.r3", "gorun-abc-r0.r0", "gorun-abc-x.r1"} {
		want = append(want, id+".hdr")
		for _, r := range testRegions {
			want = append(want, id+"."+r.Name)
		}
	}
	want = append(want, others...)
	slices.Sort(want)
	if got := names(); !slices.Equal(got, want) {
		t.Errorf("after RemoveJob(abc) the directory holds\n%v\nwant\n%v", got, want)
	}
	for _, id := range []struct {
		job  string
		rank int
	}{{"abcd", 0}, {"xabc", 0}, {"abc-r0", 0}, {"abc-x", 1}} {
		r, err := Open(id.job, id.rank, testRegions, opt)
		if err != nil {
			t.Fatalf("RemoveJob(abc) broke job %s: %v", id.job, err)
		}
		checkNewest(t, r, 1, 0, false)
		r.Close()
	}
	// Removing what is not there is not an error.
	if err := RemoveJob("abc", opt); err != nil {
		t.Errorf("second RemoveJob: %v", err)
	}
	if err := Remove("abc", 5, opt); err != nil {
		t.Errorf("Remove of a rank without files: %v", err)
	}
	if err := RemoveJob("abc", Options{Dir: filepath.Join(opt.Dir, "nosuchdir")}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("RemoveJob in a missing directory: %v", err)
	}

	before := names()
	for _, job := range []string{
		"", "..", ".", "../abc", "a/b", "/", "abc/..", "ABC", "-abc", "-", "abc.r0", "abc.",
		"ab*", "abc\x00", "abc_d", "äbc", strings.Repeat("a", 65),
	} {
		if err := RemoveJob(job, opt); err == nil || !strings.Contains(err.Error(), "invalid job id") {
			t.Errorf("RemoveJob(%q): %v, want an invalid job id", job, err)
		}
		if err := Remove(job, 0, opt); err == nil {
			t.Errorf("Remove(%q, 0) succeeded", job)
		}
	}
	if err := Remove("abcd", -1, opt); err == nil {
		t.Error("Remove of rank -1 succeeded")
	}
	if got := names(); !slices.Equal(got, before) {
		t.Errorf("refused removals changed the directory: %v, was %v", got, before)
	}
}

// TestRemoveJobPrefix checks that jobs whose ids start with another's,
// followed by what the old file names used as separators ("a", "a-r0",
// "a-b", "a-r0-b"), do not remove each other's files, with Remove or
// RemoveJob, whichever is removed first.
func TestRemoveJobPrefix(t *testing.T) {
	jobs := []string{"a", "a-r0", "a-b", "a-r0-b", "a-r1", "r0"}
	for _, tc := range []struct {
		name   string
		remove string // the job removed
		rank   int    // the rank removed, -1 for RemoveJob
	}{
		{"RemoveJob a", "a", -1},
		{"Remove a rank 0", "a", 0},
		{"RemoveJob a-r0", "a-r0", -1},
		{"Remove a-r0 rank 0", "a-r0", 0},
		{"RemoveJob a-b", "a-b", -1},
		{"RemoveJob a-r0-b", "a-r0-b", -1},
		{"RemoveJob r0", "r0", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := Options{Dir: t.TempDir()}
			for j, job := range jobs {
				for rank := range 2 {
					s, err := Create(job, rank, testRegions, opt)
					if err != nil {
						t.Fatal(err)
					}
					commit(t, s, uint64(10*j+rank+1))
					s.Close()
				}
			}
			var err error
			if tc.rank < 0 {
				err = RemoveJob(tc.remove, opt)
			} else {
				err = Remove(tc.remove, tc.rank, opt)
			}
			if err != nil {
				t.Fatal(err)
			}
			for j, job := range jobs {
				for rank := range 2 {
					gone := job == tc.remove && (tc.rank < 0 || tc.rank == rank)
					for _, name := range append([]string{hdrName(job, rank)}, dataNames(job, rank)...) {
						_, err := os.Stat(filepath.Join(opt.Dir, name))
						if gone != errors.Is(err, fs.ErrNotExist) {
							t.Errorf("%s: %v (removed: %v)", name, err, gone)
						}
					}
					if gone {
						continue
					}
					r, err := Open(job, rank, testRegions, opt)
					if err != nil {
						t.Fatalf("job %s rank %d: %v", job, rank, err)
					}
					checkNewest(t, r, uint64(10*j+rank+1), 0, false)
					r.Close()
				}
			}
		})
	}
}

// dataNames returns the names of the data files of job's rank of
// testRegions.
func dataNames(job string, rank int) []string {
	var ns []string
	for _, r := range testRegions {
		ns = append(ns, dataName(job, rank, r.Name))
	}
	return ns
}

func TestParseName(t *testing.T) {
	for _, tc := range []struct {
		name, job string
		rank      int
		region    string
		ok        bool
	}{
		{"gorun-abc.r0.hdr", "abc", 0, "", true},
		{"gorun-abc.r0.meta", "abc", 0, "meta", true},
		{"gorun-abc.r12.opt_1-x", "abc", 12, "opt_1-x", true},
		{"gorun-abc.r2147483647.hdr", "abc", 2147483647, "", true},
		{"gorun-a-r0.r0.hdr", "a-r0", 0, "", true},
		{"gorun-a-r0.r0.hdr", "a", 0, "", false},
		{"gorun-a-b.r0.meta", "a", 0, "", false},
		{"gorun-a-b.r0.meta", "a-b", 0, "meta", true},
		{"gorun-a.r0.meta", "a-b", 0, "", false},
		{"gorun-a.r0.meta", "a", 0, "meta", true},
		{"gorun-abc-r0.hdr", "abc", 0, "", false},     // the old form
		{"gorun-abc-r0-meta", "abc", 0, "", false},    // the old form
		{"gorun-abc-r0-meta", "abc-r0", 0, "", false}, // the old form
		{"gorun-abc.r2147483648.hdr", "abc", 0, "", false},
		{"gorun-abc.r99999999999.hdr", "abc", 0, "", false},
		{"gorun-abc.r01.hdr", "abc", 0, "", false},
		{"gorun-abc.r.hdr", "abc", 0, "", false},
		{"gorun-abc.r-1.hdr", "abc", 0, "", false},
		{"gorun-abc.r+1.hdr", "abc", 0, "", false},
		{"gorun-abc.r0", "abc", 0, "", false},
		{"gorun-abc.r0.", "abc", 0, "", false},
		{"gorun-abc.r0.hdr.x", "abc", 0, "", false},
		{"gorun-abc.r0.Meta", "abc", 0, "", false},
		{"gorun-abc.r0.1meta", "abc", 0, "", false},
		{"gorun-abc.r0-meta", "abc", 0, "", false},
		{"gorun-abc.r0." + strings.Repeat("m", 33), "abc", 0, "", false},
		{"gorun-abc.r0." + strings.Repeat("m", 32), "abc", 0, strings.Repeat("m", 32), true},
		{"gorun-abcd.r0.hdr", "abc", 0, "", false},
		{"gorun-xabc.r0.hdr", "abc", 0, "", false},
		{"xgorun-abc.r0.hdr", "abc", 0, "", false},
		{"gorun-abc.R0.hdr", "abc", 0, "", false},
	} {
		rank, region, ok := parseName(tc.name, tc.job)
		if ok != tc.ok || ok && (rank != tc.rank || region != tc.region) {
			t.Errorf("parseName(%q, %q) = %d, %q, %v; want %d, %q, %v", tc.name, tc.job, rank, region, ok, tc.rank, tc.region, tc.ok)
		}
	}
	// The names ckpt makes parse back.
	for _, job := range []string{"a", "a-r0", "0", "x-", strings.Repeat("z", 64)} {
		for _, rank := range []int{0, 7, maxRank} {
			if r, reg, ok := parseName(hdrName(job, rank), job); !ok || r != rank || reg != "" {
				t.Errorf("header file of %s rank %d: %d %q %v", job, rank, r, reg, ok)
			}
			for _, name := range []string{"a", "meta", "opt-1_x"} {
				if r, reg, ok := parseName(dataName(job, rank, name), job); !ok || r != rank || reg != name {
					t.Errorf("data file %q of %s rank %d: %d %q %v", name, job, rank, r, reg, ok)
				}
			}
		}
	}
}

// TestDefaultDir uses /dev/shm, the default, and cleans up after itself.
func TestDefaultDir(t *testing.T) {
	if fi, err := os.Stat(DefaultDir); err != nil || !fi.IsDir() {
		t.Skipf("no %s: %v", DefaultDir, err)
	}
	var b [8]byte
	rand.Read(b[:])
	job := "cktest" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if err := RemoveJob(job, Options{}); err != nil {
			t.Error(err)
		}
		if m, _ := filepath.Glob(filepath.Join(DefaultDir, "gorun-"+job+".*")); len(m) != 0 {
			t.Errorf("left in %s: %v", DefaultDir, m)
		}
	})
	s, err := Create(job, 3, testRegions, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit(t, s, 1)
	if _, err := os.Stat(filepath.Join(DefaultDir, "gorun-"+job+".r3.hdr")); err != nil {
		t.Fatal(err)
	}
	r, err := Open(job, 3, testRegions, Options{Dir: DefaultDir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	checkNewest(t, r, 1, 0, false)
}
