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
	}{{"abc", 0}, {"abc", 1}, {"abc", 12}, {"abcd", 0}, {"xabc", 0}, {"ab", 3}} {
		s, err := Create(id.job, id.rank, testRegions, opt)
		if err != nil {
			t.Fatal(err)
		}
		commit(t, s, 1)
		s.Close()
	}
	// Files that look like job abc's but are not, and one that is not a
	// regular file.
	others := []string{
		"gorun-abc-notes", "gorun-abc-r", "gorun-abc-r01.hdr", "gorun-abc-r1.hdrx",
		"gorun-abc-r1-", "gorun-abc-r1-Meta", "gorun-abc-r1_meta", "gorun-abc-r99999999999.hdr",
		"gorun-abc", "xgorun-abc-r0.hdr", "gorun-abc-r0.hdr.tmp", "unrelated",
	}
	for _, n := range others {
		if err := os.WriteFile(filepath.Join(opt.Dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(opt.Dir, "gorun-abc-r7-meta"), 0o700); err != nil {
		t.Fatal(err)
	}
	others = append(others, "gorun-abc-r7-meta")

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
		if strings.HasPrefix(n, "gorun-abc-r1-") && !slices.Contains(others, n) || n == "gorun-abc-r1.hdr" {
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
	for _, id := range []string{"gorun-abcd-r0", "gorun-xabc-r0", "gorun-ab-r3"} {
		want = append(want, id+".hdr")
		for _, r := range testRegions {
			want = append(want, id+"-"+r.Name)
		}
	}
	want = append(want, others...)
	slices.Sort(want)
	if got := names(); !slices.Equal(got, want) {
		t.Errorf("after RemoveJob(abc) the directory holds\n%v\nwant\n%v", got, want)
	}
	for _, id := range []string{"abcd", "xabc"} {
		r, err := Open(id, 0, testRegions, opt)
		if err != nil {
			t.Fatalf("RemoveJob(abc) broke job %s: %v", id, err)
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
	for _, job := range []string{"", "..", "../abc", "a/b", "/", "abc/..", "ABC", "abc-r0", "ab*", "abc\x00", strings.Repeat("a", 65)} {
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
		if m, _ := filepath.Glob(filepath.Join(DefaultDir, "gorun-"+job+"-*")); len(m) != 0 {
			t.Errorf("left in %s: %v", DefaultDir, m)
		}
	})
	s, err := Create(job, 3, testRegions, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit(t, s, 1)
	if _, err := os.Stat(filepath.Join(DefaultDir, "gorun-"+job+"-r3.hdr")); err != nil {
		t.Fatal(err)
	}
	r, err := Open(job, 3, testRegions, Options{Dir: DefaultDir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	checkNewest(t, r, 1, 0, false)
}
