package ckpt

// Files removed by their maker only. A rank's files have fixed names
// (names.go), so two processes that both keep rank r's slots in one
// directory use the same names: two agents of a job on one machine, as
// when hosts emulated by network namespaces share /dev/shm (gorun's
// multi-host tests), or containers that share the host's. When a lost
// host's rank r moves to a spare, the spare's Create replaces the names,
// and the lost host's agent, ending later, must not remove them by name:
// the spare's rank would find its files gone. So an agent removes what
// it made, known by the inodes the names led to when it made them
// (Owned), and leaves a name that leads elsewhere: the newest maker owns
// a name.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// OwnedFile is a file one process made: its path and the inode the path
// led to when it was made.
type OwnedFile struct {
	Path     string
	dev, ino uint64
}

// OwnFile returns f's path and the inode behind its open descriptor (a
// file the caller just made with O_EXCL, as Create makes the slots').
func OwnFile(f *os.File) (OwnedFile, error) {
	fi, err := f.Stat()
	if err != nil {
		return OwnedFile{}, fmt.Errorf("ckpt: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return OwnedFile{}, fmt.Errorf("ckpt: %s: no inode number on this system", f.Name())
	}
	return OwnedFile{Path: f.Name(), dev: uint64(st.Dev), ino: st.Ino}, nil
}

// leadsTo reports whether o's path still leads to the inode it was made
// as.
func (o OwnedFile) leadsTo() (bool, error) {
	fi, err := os.Lstat(o.Path)
	if err != nil {
		return false, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == o.dev && st.Ino == o.ino, nil
}

// Owned returns the files Create made for s: its header file and its
// regions' data files. Slots that Open mapped own none.
func (s *Slots) Owned() []OwnedFile {
	return append([]OwnedFile(nil), s.owned...)
}

// RemoveOwned removes each of files whose path still leads to the inode
// it was made as, and returns the paths of those left because it leads
// elsewhere now (another process made the name since). A path that is
// gone is not an error.
//
// Between the check and the removal, another process could replace the
// name once more; Create's makers do so only when they take a rank's
// slots over, which a process removing its own does not wait for: that
// window (a stat and an unlink) is left open.
func RemoveOwned(files []OwnedFile) (left []string, err error) {
	var errs []error
	for _, o := range files {
		ok, err := o.leadsTo()
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("ckpt: %w", err))
			continue
		case !ok:
			left = append(left, o.Path)
			continue
		}
		if err := os.Remove(o.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("ckpt: %w", err))
		}
	}
	return left, errors.Join(errs...)
}
