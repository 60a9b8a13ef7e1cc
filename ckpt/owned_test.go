package ckpt

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// TestClaimNames: Names holds an exclusive lock on its rank's byte of the
// job's lock file while fn runs, which another process's claim (here
// another open file description) cannot take, on that rank only; it
// lets go when fn returns, also with an error, and a nil Claim runs fn.
func TestClaimNames(t *testing.T) {
	a, b := twoClaims(t)
	// try reports whether b could take rank's lock now (and lets it go).
	try := func(rank int) bool {
		lk := unix.Flock_t{Type: unix.F_WRLCK, Start: int64(rank), Len: 1}
		err := unix.FcntlFlock(b.f.Fd(), unix.F_OFD_SETLK, &lk)
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
				t.Fatal(err)
			}
			return false
		}
		lk.Type = unix.F_UNLCK
		if err := unix.FcntlFlock(b.f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatal(err)
		}
		return true
	}
	for _, tc := range []struct {
		name string
		err  error
	}{{"fn succeeds", nil}, {"fn fails", errors.New("fn failed")}} {
		t.Run(tc.name, func(t *testing.T) {
			ran := false
			err := a.Names(7, func() error {
				ran = true
				if try(7) {
					t.Error("another claim took rank 7's names lock while Names held it")
				}
				if !try(6) || !try(8) {
					t.Error("another claim could not take the names lock of ranks 6 and 8")
				}
				return tc.err
			})
			if !ran || !errors.Is(err, tc.err) {
				t.Fatalf("Names: ran %v, err %v, want %v", ran, err, tc.err)
			}
			if !try(7) {
				t.Error("rank 7's names lock is still held after Names returned")
			}
		})
	}
	var none *Claim
	ran := false
	if err := none.Names(3, func() error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("a nil Claim's Names: ran %v, err %v", ran, err)
	}
}

// TestClaimNamesLockFails: where fcntl(2) cannot take the names lock
// (old kernels and some file systems: EINVAL; ENOLCK; ENOSYS), Names
// runs fn without it, saying so with ErrNoNamesLock, and stops trying;
// an EINTR is tried again; another error fails Names without running
// fn.
func TestClaimNamesLockFails(t *testing.T) {
	fnErr := errors.New("fn failed")
	for _, tc := range []struct {
		name   string
		errs   []error // the lock's results, in order; then nil
		fn     error
		ran    bool
		want   []error // errors.Is each of these
		notNo  bool    // not ErrNoNamesLock
		second bool    // a second Names runs fn without trying the lock again
	}{
		{name: "EINVAL", errs: []error{unix.EINVAL}, ran: true, want: []error{ErrNoNamesLock, unix.EINVAL}, second: true},
		{name: "ENOLCK", errs: []error{unix.ENOLCK}, ran: true, want: []error{ErrNoNamesLock, unix.ENOLCK}, second: true},
		{name: "ENOSYS, fn fails", errs: []error{unix.ENOSYS}, fn: fnErr, ran: true, want: []error{ErrNoNamesLock, fnErr}, second: true},
		{name: "EINTR, then locked", errs: []error{unix.EINTR}, ran: true, notNo: true},
		{name: "EBADF", errs: []error{unix.EBADF}, want: []error{unix.EBADF}, notNo: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ClaimJob("abc", Options{Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Release()
			calls := 0
			c.lockFn = func(fd uintptr, cmd int, lk *unix.Flock_t) error {
				calls++
				if lk.Type != unix.F_UNLCK && len(tc.errs) > 0 {
					err := tc.errs[0]
					tc.errs = tc.errs[1:]
					return err
				}
				return unix.FcntlFlock(fd, cmd, lk)
			}
			ran := false
			err = c.Names(2, func() error { ran = true; return tc.fn })
			if ran != tc.ran {
				t.Errorf("fn ran: %v, want %v (err %v)", ran, tc.ran, err)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("err %v, want one wrapping %v", err, w)
				}
			}
			if tc.want == nil && err != nil {
				t.Errorf("err %v, want nil", err)
			}
			if tc.notNo && errors.Is(err, ErrNoNamesLock) {
				t.Errorf("err %v wraps ErrNoNamesLock", err)
			}
			if !tc.second {
				return
			}
			before := calls
			ran = false
			if err := c.Names(2, func() error { ran = true; return nil }); !ran || !errors.Is(err, ErrNoNamesLock) {
				t.Errorf("second Names: ran %v, err %v", ran, err)
			}
			if calls != before {
				t.Errorf("the second Names tried the lock again (%d calls)", calls-before)
			}
		})
	}
}

// TestClaimNamesBusy: Names gives up on a lock another process holds
// past its wait, without running fn (a holder stopped with SIGSTOP must
// not hang this one's hello or exit).
func TestClaimNamesBusy(t *testing.T) {
	a, b := twoClaims(t)
	b.wait = 20 * time.Millisecond
	err := a.Names(4, func() error {
		ran := false
		err := b.Names(4, func() error { ran = true; return nil })
		if ran || !errors.Is(err, ErrNamesBusy) {
			t.Errorf("Names of a held lock: ran %v, err %v, want ErrNamesBusy", ran, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := b.Names(4, func() error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("Names once the lock is free: ran %v, err %v", ran, err)
	}
}

// TestOwnFileCloseOnExec: the descriptor OwnFile keeps is close-on-exec
// (a trainer the agent starts must not inherit it), and a descriptor of
// its own: closing the caller's leaves it open.
func TestOwnFileCloseOnExec(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	o, err := OwnFile(f)
	if err != nil {
		t.Fatal(err)
	}
	defer Disown([]OwnedFile{o})
	if o.f.Fd() == f.Fd() {
		t.Fatalf("OwnFile kept the caller's descriptor %d", f.Fd())
	}
	flags, err := unix.FcntlInt(o.f.Fd(), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("the owned descriptor's flags %#x lack FD_CLOEXEC", flags)
	}
	f.Close()
	if ok, err := o.leadsTo(); !ok || err != nil {
		t.Errorf("after the caller closed its file: leads to it %v, err %v", ok, err)
	}
}

// twoClaims returns two claims of job "abc" in a new directory, as two
// agents of the job sharing it hold them (each its own open file
// description), released at the test's end.
func twoClaims(t *testing.T) (a, b *Claim) {
	t.Helper()
	opt := Options{Dir: t.TempDir()}
	for _, c := range []**Claim{&a, &b} {
		var err error
		if *c, err = ClaimJob("abc", opt); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { (*c).Release() })
	}
	return a, b
}
