package ckpt

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// RegionFile is a region's data file, as Slots.Files gives it and
// MapData maps it.
type RegionFile struct {
	Name   string // the region's name
	Size   int64  // the region's size in bytes
	Stride int64  // the offset of slot 1 in the file: Size rounded up to 4096
	Path   string // the file's absolute path
}

// Dir returns the absolute path of the directory of the slots' files.
func (s *Slots) Dir() string { return s.dir }

// Files returns the data file of every region, in Regions order. A rank
// service that owns the header file (and commits) gives them to the rank
// client, which maps them with MapData and writes the slot the service
// tells it to.
func (s *Slots) Files() []RegionFile {
	fs := make([]RegionFile, len(s.regions))
	for i, r := range s.regions {
		fs[i] = RegionFile{Name: r.Name, Size: r.Size, Stride: stride(r.Size), Path: filepath.Join(s.dir, dataName(s.job, s.rank, r.Name))}
	}
	return fs
}

// MapData maps one region's data file read-write and shared, as Open
// maps it, and returns the views of its two slots, each of f.Size bytes,
// and the function that unmaps them (calling it again does nothing). It
// refuses, as Open does, a symbolic link, a file that is not regular, not
// owned by this user, or writable by group or others, and a file whose
// size is not exactly 2·f.Stride (errors wrapping ErrLayout); and an f
// whose Size is outside [0, MaxRegionSize] or whose Stride is not Size
// rounded up to 4096. A region of size 0 gives empty views and maps
// nothing.
//
// The views are those a Staged's views are over: the process holding the
// header (a rank service) stages and commits, and the process that
// mapped the data (the rank) fills the staging slot in between. Nothing
// stops writes to a committed slot through these views; the CRC32C
// catches them.
func MapData(f RegionFile) (views [2][]byte, unmap func() error, err error) {
	if f.Size < 0 || f.Size > MaxRegionSize {
		return views, nil, fmt.Errorf("ckpt: region %q: size %d outside [0, %d]", f.Name, f.Size, int64(MaxRegionSize))
	}
	if f.Stride != stride(f.Size) {
		return views, nil, fmt.Errorf("ckpt: region %q: stride %d, want %d for %d bytes", f.Name, f.Stride, stride(f.Size), f.Size)
	}
	if 2*f.Stride > math.MaxInt {
		return views, nil, fmt.Errorf("ckpt: region %q of %d bytes does not fit this machine's address space", f.Name, f.Size)
	}
	file, size, err := openFile(f.Path)
	if err != nil {
		if !errors.Is(err, ErrLayout) {
			err = fmt.Errorf("ckpt: %w", err)
		}
		return views, nil, err
	}
	defer file.Close()
	if want := 2 * f.Stride; size != want {
		return views, nil, layoutErr("%s: %d bytes, want %d (two slots of %d)", f.Path, size, want, f.Stride)
	}
	if size == 0 {
		return [2][]byte{{}, {}}, func() error { return nil }, nil
	}
	m, err := mmap(file, int(size), unix.PROT_READ|unix.PROT_WRITE)
	if err != nil {
		return views, nil, err
	}
	r := regionMap{size: f.Size, stride: f.Stride}
	views = [2][]byte{r.view(m, 0), r.view(m, 1)}
	var once sync.Once
	var uerr error
	unmap = func() error {
		once.Do(func() {
			if e := unix.Munmap(m); e != nil {
				uerr = fmt.Errorf("ckpt: munmap: %w", e)
			}
		})
		return uerr
	}
	return views, unmap, nil
}
