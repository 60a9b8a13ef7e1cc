package ckpt

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Slots is one rank's two slots, mapped. It is safe for concurrent use;
// Stage and Commit are serialized (one writer), Newest, Committed and
// Regions may run beside them.
type Slots struct {
	regions []Region // immutable after open
	dir     string   // absolute; immutable after open
	job     string
	rank    int

	// wmu serializes Stage and Commit and guards gen.
	wmu sync.Mutex
	gen uint64 // counts Stages: a Staged may commit while its gen is current

	// mu guards the mappings' lifetime: held for reading while they are
	// used, for writing by Close.
	mu     sync.RWMutex
	closed bool
	hdr    []byte      // the header file, read-write
	maps   []regionMap // one per region

	rereads atomic.Uint64 // Newest's reads of slots overwritten under it

	owned []OwnedFile // the files Create made, held open (owned.go); immutable after Create
}

// regionMap is a region's data file, mapped twice.
type regionMap struct {
	rw, ro []byte // read-write (Stage) and read-only (Newest); nil when empty
	size   int64
	stride int64
}

// view returns the region's bytes in slot of mapping m.
func (r *regionMap) view(m []byte, slot int) []byte {
	if r.size == 0 {
		return []byte{}
	}
	off := int64(slot) * r.stride
	return m[off : off+r.size : off+r.size]
}

// Create makes the files of a rank's slots, replacing any it had (other
// processes that have the old files mapped keep the old memory): a data
// file per region, with its space reserved, and the header file, written
// last. Both slots start empty. Region names must match
// [a-z][a-z0-9_-]{0,31}, and be unique; there are 1 to 16 regions, of 0
// to MaxRegionSize bytes. The Slots own the files made (Owned).
// Processes that share the directory call Create under the rank's names
// lock (Claim.Names).
func Create(job string, rank int, regions []Region, opt Options) (*Slots, error) {
	if err := checkIDs(job, rank); err != nil {
		return nil, err
	}
	if err := checkRegions(regions); err != nil {
		return nil, err
	}
	for _, r := range regions {
		if 2*stride(r.Size) > math.MaxInt {
			return nil, fmt.Errorf("ckpt: region %q of %d bytes does not fit this machine's address space", r.Name, r.Size)
		}
	}
	dir := opt.dir()
	if err := Remove(job, rank, opt); err != nil {
		return nil, err
	}
	var created []OwnedFile
	fail := func(err error) (*Slots, error) {
		_, _ = RemoveOwned(created) // only what this Create made
		return nil, err
	}
	for _, r := range regions {
		p := filepath.Join(dir, dataName(job, rank, r.Name))
		o, err := createFile(p, 2*stride(r.Size), nil)
		if err != nil {
			return fail(err)
		}
		created = append(created, o)
	}
	hdr := make([]byte, hdrFileSize)
	copy(hdr, encodeLayout(job, rank, regions))
	p := filepath.Join(dir, hdrName(job, rank))
	o, err := createFile(p, hdrFileSize, hdr)
	if err != nil {
		return fail(err)
	}
	created = append(created, o)
	s, err := open(dir, job, rank, regions)
	if err != nil {
		return fail(err)
	}
	s.owned = created
	return s, nil
}

// createFile creates path, 0600, failing if anything (a symbolic link
// included) has the name, and gives it size bytes: content if not nil,
// else reserved zeros. It returns the file it made (OwnFile). If it fails
// after creating the file, it removes it.
func createFile(path string, size int64, content []byte) (OwnedFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return OwnedFile{}, fmt.Errorf("ckpt: %w", err)
	}
	o, err := OwnFile(f)
	switch {
	case err != nil:
	case content != nil:
		_, err = f.WriteAt(content, 0)
	case size > 0:
		err = unix.Fallocate(int(f.Fd()), 0, 0, size)
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
			err = f.Truncate(size) // a file system without fallocate
		}
		if err != nil {
			err = fmt.Errorf("reserving %d bytes for %s: %w", size, path, err)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if o.Path != "" {
			_, _ = RemoveOwned([]OwnedFile{o})
		} else {
			os.Remove(path) // made a moment ago, but its inode is unknown
		}
		return OwnedFile{}, fmt.Errorf("ckpt: %w", err)
	}
	return o, nil
}

// Open maps the existing files of a rank's slots (for a restarted rank, or
// the agent). It checks the header file's layout and, if regions is not
// nil, that it holds exactly these regions, in this order; with nil it
// takes the header's. Errors about the files' contents, sizes or kinds
// wrap ErrLayout; a missing header file is an error wrapping
// fs.ErrNotExist.
func Open(job string, rank int, regions []Region, opt Options) (*Slots, error) {
	if err := checkIDs(job, rank); err != nil {
		return nil, err
	}
	if regions != nil {
		if err := checkRegions(regions); err != nil {
			return nil, err
		}
	}
	return open(opt.dir(), job, rank, regions)
}

func open(dir, job string, rank int, want []Region) (*Slots, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	s := &Slots{dir: dir, job: job, rank: rank}
	fail := func(err error) (*Slots, error) {
		s.unmap()
		return nil, err
	}
	hp := filepath.Join(dir, hdrName(job, rank))
	f, size, err := openFile(hp)
	if err != nil {
		if !errors.Is(err, ErrLayout) {
			err = fmt.Errorf("ckpt: %w", err)
		}
		return nil, err
	}
	if size != hdrFileSize {
		f.Close()
		return nil, layoutErr("%s: %d bytes, want %d", hp, size, hdrFileSize)
	}
	s.hdr, err = mmap(f, hdrFileSize, unix.PROT_READ|unix.PROT_WRITE)
	f.Close()
	if err != nil {
		return nil, err
	}
	// Parse a private copy: the file may change under a parse of the
	// mapping, and what was checked must be what is used.
	s.regions, err = parseLayout(slices.Clone(s.hdr[:layoutSize]), hp, job, rank)
	if err != nil {
		return fail(err)
	}
	if want != nil {
		if err := sameRegions(s.regions, want); err != nil {
			return fail(fmt.Errorf("%w (%s)", err, hp))
		}
	}
	s.maps = make([]regionMap, len(s.regions))
	for i, r := range s.regions {
		m := &s.maps[i]
		m.size, m.stride = r.Size, stride(r.Size)
		p := filepath.Join(dir, dataName(job, rank, r.Name))
		f, size, err := openFile(p)
		if err != nil {
			if !errors.Is(err, ErrLayout) {
				err = layoutErr("%w", err)
			}
			return fail(err)
		}
		if want := 2 * m.stride; size != want {
			f.Close()
			return fail(layoutErr("%s: %d bytes, the layout says %d (two slots of %d)", p, size, want, m.stride))
		}
		if size > math.MaxInt {
			f.Close()
			return fail(fmt.Errorf("ckpt: %s: %d bytes do not fit this machine's address space", p, size))
		}
		if size > 0 {
			m.rw, err = mmap(f, int(size), unix.PROT_READ|unix.PROT_WRITE)
			if err == nil {
				m.ro, err = mmap(f, int(size), unix.PROT_READ)
			}
		}
		f.Close()
		if err != nil {
			return fail(err)
		}
	}
	return s, nil
}

// openFile opens path for reading and writing, without following a
// symbolic link, and checks that it is a regular file of this user's that
// others cannot write. It returns the file's size. Its errors are the
// os package's (for the caller to prefix) or wrap ErrLayout.
func openFile(path string) (*os.File, int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	bad := func(format string, args ...any) (*os.File, int64, error) {
		f.Close()
		return nil, 0, layoutErr("%s: "+format, append([]any{path}, args...)...)
	}
	if !fi.Mode().IsRegular() {
		return bad("not a regular file (%v)", fi.Mode().Type())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return bad("writable by others (%v)", fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return bad("owned by uid %d, not by this user (%d)", st.Uid, os.Geteuid())
	}
	return f, fi.Size(), nil
}

// mmap maps size bytes of f, shared, with its pages mapped in now rather
// than faulted in by the first step that writes them.
func mmap(f *os.File, size int, prot int) ([]byte, error) {
	b, err := unix.Mmap(int(f.Fd()), 0, size, prot, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("ckpt: mapping %d bytes of %s: %w", size, f.Name(), err)
	}
	return b, nil
}

// unmap releases the mappings (open's failures, and Close).
func (s *Slots) unmap() error {
	var errs []error
	munmap := func(b []byte) {
		if b != nil {
			if err := unix.Munmap(b); err != nil {
				errs = append(errs, fmt.Errorf("ckpt: munmap: %w", err))
			}
		}
	}
	munmap(s.hdr)
	for _, m := range s.maps {
		munmap(m.rw)
		munmap(m.ro)
	}
	s.hdr, s.maps = nil, nil
	return errors.Join(errs...)
}

// Close unmaps the files; the files stay (Remove and RemoveJob remove
// them, and RemoveOwned those Create made, which it keeps open: Owned).
// Views obtained from the Slots must not be used afterwards. Closing
// twice is a no-op.
func (s *Slots) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.unmap()
}

// Regions returns the regions, in the layout's order.
func (s *Slots) Regions() []Region {
	return slices.Clone(s.regions)
}

// regionIndex returns the index of the region named name, or -1.
func (s *Slots) regionIndex(name string) int {
	return slices.IndexFunc(s.regions, func(r Region) bool { return r.Name == name })
}

// The words of slot i's header, for atomic access. The mapping is page
// aligned and the offsets are multiples of the words' sizes.
func (s *Slots) slotHdr(i int) []byte {
	return s.hdr[slotHdrOff+slotHdrSize*i:][:slotHdrSize]
}

func (s *Slots) stateWord(i int) *uint32 {
	return (*uint32)(unsafe.Pointer(&s.slotHdr(i)[0]))
}

func (s *Slots) stepWord(i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&s.slotHdr(i)[8]))
}

// slotInfo is what a slot's header says, read atomically.
type slotInfo struct {
	state uint32
	step  uint64
}

func (s *Slots) readInfo(i int) slotInfo {
	st := atomic.LoadUint32(s.stateWord(i))
	return slotInfo{st, atomic.LoadUint64(s.stepWord(i))}
}

// unchanged reports whether slot i is still committed with in's step:
// the sequence lock's re-check. The compare-and-swap (which writes the
// value it reads) is a full barrier: the loads of the slot's bytes before
// it cannot be satisfied after it.
func (s *Slots) unchanged(i int, in slotInfo) bool {
	return atomic.CompareAndSwapUint32(s.stateWord(i), stateCommitted, stateCommitted) &&
		atomic.LoadUint64(s.stepWord(i)) == in.step
}

// newestSlot returns the slot holding the newest committed step, by the
// headers (unverified), or -1.
func newestSlot(info [2]slotInfo) int {
	n := -1
	for i, in := range info {
		if in.state == stateCommitted && (n < 0 || in.step > info[n].step) {
			n = i
		}
	}
	return n
}
