package ckpt

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRemoveOwned: RemoveOwned removes the files a Create made while
// their names still lead to them, and leaves, naming them, those another
// process made since (a second agent of the job sharing the directory,
// as a spare that took the rank over on network namespace hosts does).
func TestRemoveOwned(t *testing.T) {
	for _, tc := range []struct {
		name string
		// then changes the directory after the first Create; it returns
		// the names that must stay.
		then func(t *testing.T, opt Options, first []OwnedFile) (stay []string)
	}{
		{"untouched", func(*testing.T, Options, []OwnedFile) []string { return nil }},
		{"made again by another Create", func(t *testing.T, opt Options, first []OwnedFile) []string {
			s, err := Create("abc", 1, testRegions, opt)
			if err != nil {
				t.Fatal(err)
			}
			commit(t, s, 4)
			s.Close()
			return ownedNames(first)
		}},
		{"one name made again by hand", func(t *testing.T, opt Options, first []OwnedFile) []string {
			p := first[0].Path
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("another's"), 0o600); err != nil {
				t.Fatal(err)
			}
			return ownedNames(first[:1])
		}},
		{"removed already", func(t *testing.T, opt Options, first []OwnedFile) []string {
			if err := Remove("abc", 1, opt); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := Options{Dir: t.TempDir()}
			s, err := Create("abc", 1, testRegions, opt)
			if err != nil {
				t.Fatal(err)
			}
			commit(t, s, 3)
			s.Close()
			first := s.Owned()
			if len(first) != len(testRegions)+1 {
				t.Fatalf("Create owns %d files, want %d (a data file per region and the header)", len(first), len(testRegions)+1)
			}
			// Another rank's files are no business of rank 1's.
			o, err := Create("abc", 2, testRegions, opt)
			if err != nil {
				t.Fatal(err)
			}
			o.Close()
			stay := tc.then(t, opt, first)
			left, err := RemoveOwned(first)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(left)
			if want := inDir(opt.Dir, stay); !slices.Equal(left, want) {
				t.Errorf("left %v, want %v", left, want)
			}
			var have []string
			for _, f := range first {
				if _, err := os.Lstat(f.Path); err == nil {
					have = append(have, filepath.Base(f.Path))
				}
			}
			slices.Sort(have)
			if !slices.Equal(have, stay) {
				t.Errorf("rank 1's files after RemoveOwned: %v, want %v", have, stay)
			}
			if n := len(o.Owned()); n == 0 {
				t.Fatal("rank 2 owns nothing")
			}
			for _, f := range o.Owned() {
				if _, err := os.Lstat(f.Path); err != nil {
					t.Errorf("rank 2's file: %v", err)
				}
			}
		})
	}
}

// TestOpenOwnsNothing: slots mapped by Open, not made, own no files.
func TestOpenOwnsNothing(t *testing.T) {
	opt := Options{Dir: t.TempDir()}
	s, err := Create("abc", 0, testRegions, opt)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	o, err := Open("abc", 0, nil, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if got := o.Owned(); len(got) != 0 {
		t.Errorf("Open's slots own %v", got)
	}
}

func ownedNames(fs []OwnedFile) []string {
	var ns []string
	for _, f := range fs {
		ns = append(ns, filepath.Base(f.Path))
	}
	slices.Sort(ns)
	return ns
}

func inDir(dir string, names []string) []string {
	var ps []string
	for _, n := range names {
		ps = append(ps, filepath.Join(dir, n))
	}
	return ps
}
