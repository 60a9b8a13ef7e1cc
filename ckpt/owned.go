package ckpt

// Files removed by their maker only. A rank's files have fixed names
// (names.go), so two processes that both keep rank r's slots in one
// directory use the same names: two agents of a job on one machine, as
// when hosts emulated by network namespaces share /dev/shm (gorun's
// multi-host tests), or containers that share the host's. When a lost
// host's rank r moves to a spare, the spare's Create replaces the names,
// and the lost host's agent, ending later, must not remove them by name:
// the spare's rank would find its files gone. So an agent removes what
// it made (OwnedFile), and leaves a name that leads elsewhere: the
// newest maker owns a name. Makers and removers of a rank's files take
// its names lock around their work (Claim.Names), which makes a check
// and its removal one step to the others.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// OwnedFile is a file one process made: its path, and the file itself,
// held open so that the path can be checked to lead to it still. (An
// inode number alone would not do: a file system may give a removed
// file's number to the next file made, the one that replaced it.)
type OwnedFile struct {
	Path string
	f    *os.File
}

// OwnFile returns f's path and the file behind its descriptor (a file
// the caller just made with O_EXCL, as Create makes the slots'), which
// it keeps open, on a descriptor of its own, until RemoveOwned or
// Disown. The caller still closes f.
func OwnFile(f *os.File) (OwnedFile, error) {
	// Close-on-exec in the same call: a trainer started meanwhile by
	// another goroutine must not inherit the descriptor.
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return OwnedFile{}, fmt.Errorf("ckpt: owning %s: %w", f.Name(), err)
	}
	return OwnedFile{Path: f.Name(), f: os.NewFile(uintptr(fd), f.Name())}, nil
}

// leadsTo reports whether o's path still leads to o's file.
func (o OwnedFile) leadsTo() (bool, error) {
	b, err := os.Lstat(o.Path)
	if err != nil {
		return false, err
	}
	if o.f == nil {
		return false, nil
	}
	a, err := o.f.Stat()
	if err != nil {
		return false, err
	}
	return os.SameFile(a, b), nil
}

// Owned returns the files Create made for s: its header file and its
// regions' data files. Slots that Open mapped own none. The files stay
// open, after Close too, until RemoveOwned or Disown is given them.
func (s *Slots) Owned() []OwnedFile {
	return append([]OwnedFile(nil), s.owned...)
}

// RemoveOwned removes each of files whose path still leads to it, and
// returns the paths it left because they lead elsewhere now (another
// process made the name since). A path that is gone is not an error.
// It closes the files. Processes that share the directory call it, and
// Create, under the rank's names lock (Claim.Names): else another could
// make a name again between its check and its removal.
func RemoveOwned(files []OwnedFile) (left []string, err error) {
	var errs []error
	for _, o := range files {
		ok, err := o.leadsTo()
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			errs = append(errs, fmt.Errorf("ckpt: %w", err))
		case !ok:
			left = append(left, o.Path)
		default:
			if err := os.Remove(o.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("ckpt: %w", err))
			}
		}
	}
	Disown(files)
	return left, errors.Join(errs...)
}

// Disown closes files, removing none.
func Disown(files []OwnedFile) {
	for _, o := range files {
		if o.f != nil {
			o.f.Close()
		}
	}
}
