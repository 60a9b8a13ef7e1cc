package durable

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/crc32c"
)

// fileState is what a Store knows of one of its base files.
type fileState int

const (
	fsFree     fileState = iota // holds no version: a Save may take it
	fsInFlight                  // a Save is writing it
	fsComplete                  // holds a complete version
	fsFreeing                   // Reclaim or Truncate is rewriting its header as free
	fsBroken                    // a write to its header failed: its state on disk is unknown
)

// baseFile is one of the rank's base files.
type baseFile struct {
	idx  int
	path string
	f    *os.File // immutable after Open
	// direct is the same file opened with O_DIRECT, through which a
	// Save writes its chunks (no copy into the page cache, no dirty
	// pages for the kernel to write back: Store.writeData); nil where
	// the file system refuses to open it so (tmpfs before Linux 6.6,
	// some FUSE file systems). Immutable after Open.
	direct *os.File

	// Guarded by Store.mu.
	state   fileState
	step    int64
	version uint64
	hdrCRC  uint32 // of the complete header
	size    int64  // the file's size
}

// Store is one rank's base files in a job's directory. It is safe for
// concurrent use (see the package comment).
type Store struct {
	root    string // the job's directory
	dir     string // DIR/r<rank>
	rank    int
	regions []Region // immutable
	lay     *layout  // the layout Saves write; immutable
	n       int      // Concurrency
	writers int
	log     *slog.Logger
	bufs    sync.Pool // *[]byte of lay.chunk bytes, each at a multiple of directAlign
	lock    *os.File  // DIR/r<rank>/LOCK, flocked exclusively while the store is open

	// hook, set by tests before use, is called at the named points of
	// Save (see hookPoint) and of its atomic writes: an error it returns
	// is taken for an I/O error there, and errCrash for the process
	// dying there (nothing more is written, nothing cleaned up).
	hook func(point string, arg int64) error

	// mu guards the fields below and the files' mutable fields.
	mu       sync.Mutex
	files    []*baseFile // by index
	inflight int
	steps    map[int64]bool // the steps of the Saves in flight
	counter  uint64         // the last version handed out
	// watermark is the newest step Reclaim was given (-1 before): a
	// version of an older step is of no use.
	watermark int64
	// resolved and kept are the newest resolved step Abandon was given
	// and the committed step given with it (-1 before): a version of a
	// step at or before resolved, other than kept, is of no use.
	resolved, kept int64
	closed         bool

	// rmu makes a publish (its look at the watermark, then its pointer
	// and marker) one step for Reclaim and Close: a Reclaim never
	// removes markers between a publish's look and its marker, so no
	// marker outlives its version; a Close ends the publishes. Lock
	// order: rmu, then pmu, then mu.
	rmu sync.Mutex

	// pmu serializes the pointer's updates (in memory and on disk) and
	// guards ptr, hasPtr and pending.
	pmu     sync.Mutex
	ptr     pointer
	hasPtr  bool
	pending []pointer // complete versions whose pointer move or marker failed

	repairMu sync.Mutex // held by repair

	// buffered: the chunks are written through the page cache, not
	// with O_DIRECT (set by tests, or once a direct write was refused).
	buffered atomic.Bool

	// cacheLeft (under mu) is how many of the next saves write their
	// chunks through the page cache because a caller waited for a
	// save's copy (CopyWaited); direct and cached count the saves
	// written each way (the ones that got to their chunks).
	cacheLeft      int
	direct, cached atomic.Int64
}

// PageCacheSaves is how many saves, after a caller waited for a save to
// have copied its source (Store.CopyWaited), write their chunks through
// the page cache before the store goes back to O_DIRECT.
const PageCacheSaves = 8

// errCrash, returned by a test hook, stands for the process dying there.
var errCrash = errors.New("durable: crashed here by the test hook")

func (s *Store) at(point string, arg int64) error {
	if s.hook == nil {
		return nil
	}
	return s.hook(point, arg)
}

// Open opens rank's base files in dir, creating DIR/r<rank> and the
// base files it lacks (N+1 of them, preallocated). regions are the
// rank's regions, in order (the manifest's). It reads every base file's
// header to learn which versions the rank holds; files whose headers do
// not verify are treated as free (and logged), as are those holding a
// version of other regions or of the wrong size. It removes the
// package's temporary files in the rank's directory, so it must not run
// beside an AppendBatch of the rank.
func Open(dir string, rank int, regions []Region, opt Options) (*Store, error) {
	if !validRank(rank) {
		return nil, fmt.Errorf("durable: bad rank %d", rank)
	}
	if err := checkRegions(regions); err != nil {
		return nil, err
	}
	n := opt.Concurrency
	switch {
	case n == 0:
		n = 1
	case n < 0 || n > MaxConcurrency:
		return nil, fmt.Errorf("durable: concurrency %d, want 1 to %d", n, MaxConcurrency)
	}
	w := opt.Writers
	switch {
	case w == 0:
		w = DefaultWriters
	case w < 0 || w > 256:
		return nil, fmt.Errorf("durable: %d writers, want 1 to 256", w)
	}
	chunk := int64(opt.ChunkSize)
	if chunk == 0 {
		chunk = DefaultChunkSize
	}
	lay, err := newLayout(chunk, regions)
	if err != nil {
		return nil, err
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		root: dir, dir: rankDir(dir, rank), rank: rank, regions: slices.Clone(regions),
		lay: lay, n: n, writers: w, log: log.With("rank", rank), steps: map[int64]bool{}, watermark: -1, resolved: -1, kept: -1,
	}
	s.bufs.New = func() any { b := alignedBuf(int(lay.chunk)); return &b }
	if err := ensureRankDir(dir, rank); err != nil {
		return nil, err
	}
	// The lock first: another store of the rank may be writing, and
	// its temporary files are not this one's to remove.
	lock, err := lockRank(s.dir)
	if err != nil {
		return nil, err
	}
	s.lock = lock
	ok := false
	defer func() {
		if !ok {
			s.closeFiles()
		}
	}()
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	have := map[int]bool{}
	for _, e := range ents {
		name := e.Name()
		if isTemp(name) {
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("durable: removing a temporary file: %w", err)
			}
			continue
		}
		i, isBase := parseBase(name)
		if !isBase {
			continue
		}
		bf, err := s.openBase(i)
		if err != nil {
			return nil, err
		}
		have[i] = true
		s.files = append(s.files, bf)
	}
	created := false
	for i := 0; i <= n; i++ {
		if have[i] {
			continue
		}
		bf, err := s.createBase(i)
		if err != nil {
			return nil, err
		}
		s.files = append(s.files, bf)
		created = true
	}
	if created {
		if err := syncDir(s.dir); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(s.files, func(a, b *baseFile) int { return a.idx - b.idx })
	for _, bf := range s.files {
		s.counter = max(s.counter, bf.version)
	}
	s.readPointer()
	ok = true
	return s, nil
}

// lockRank opens (creating it if needed) the rank directory rd's lock
// file and takes an exclusive flock on it without waiting: a lock held
// by another open file (another Store, in this process or another) is
// an error wrapping ErrLocked. The lock lasts until the returned file is
// closed (or the process ends). The file is never removed: removing a
// lock file races with another opener's flock on it.
func lockRank(rd string) (*os.File, error) {
	p := filepath.Join(rd, lockName)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		f.Close()
		return nil, fmt.Errorf("%w: %s is locked", ErrLocked, p)
	default:
		f.Close()
		return nil, fmt.Errorf("durable: locking %s: %w", p, err)
	}
}

// ensureRankDir creates DIR/r<rank> if it is missing, durably.
func ensureRankDir(dir string, rank int) error {
	rd := rankDir(dir, rank)
	err := os.Mkdir(rd, 0o700)
	switch {
	case err == nil:
		return syncDir(dir)
	case errors.Is(err, fs.ErrExist):
		fi, err := os.Lstat(rd)
		if err != nil {
			return fmt.Errorf("durable: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("durable: %s is not a directory", rd)
		}
		return nil
	default:
		return fmt.Errorf("durable: %w", err)
	}
}

// openBase opens base.<i> and reads its header.
func (s *Store) openBase(i int) (*baseFile, error) {
	p := filepath.Join(s.dir, baseName(i))
	f, err := os.OpenFile(p, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("durable: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("durable: %s is not a regular file", p)
	}
	bf := &baseFile{idx: i, path: p, f: f, direct: s.openDirect(p), state: fsFree, size: fi.Size()}
	h, hb, err := readHeader(f, s.rank, p)
	switch {
	case err != nil:
		s.log.Warn("durable: a base file's header does not verify: taken as free", "file", p, "err", err)
	case !h.complete():
	case sameRegions(h.l.regions, s.regions) != nil:
		s.log.Warn("durable: a base file holds other regions: taken as free", "file", p, "err", sameRegions(h.l.regions, s.regions))
	case fi.Size() != h.l.size:
		s.log.Warn("durable: a base file has the wrong size: taken as free", "file", p, "size", fi.Size(), "want", h.l.size)
	default:
		bf.state, bf.step, bf.version, bf.hdrCRC = fsComplete, h.step, h.version, crc32c.Checksum(hb)
	}
	return bf, nil
}

// readHeader reads and parses the header of a base file of rank.
func readHeader(f *os.File, rank int, path string) (*header, []byte, error) {
	b := make([]byte, hdrSize)
	n, err := f.ReadAt(b, 0)
	if n < hdrSize {
		if err == nil || errors.Is(err, io.EOF) {
			return nil, nil, corruptErr(path, int64(n), hdrSize, "the file ends inside the header")
		}
		return nil, nil, fmt.Errorf("durable: reading %s: %w", path, err)
	}
	h, err := parseHeader(b, rank, path)
	return h, b, err
}

// createBase creates base.<i>, preallocated, with a free header.
func (s *Store) createBase(i int) (*baseFile, error) {
	p := filepath.Join(s.dir, baseName(i))
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	bf := &baseFile{idx: i, path: p, f: f, state: fsFree}
	if err := s.resize(bf); err == nil {
		err = s.writeFree(bf)
	}
	if err != nil {
		f.Close()
		os.Remove(p)
		return nil, err
	}
	bf.direct = s.openDirect(p)
	return bf, nil
}

// resize makes bf's size the store's layout's, with its space reserved.
func (s *Store) resize(bf *baseFile) error {
	size := s.lay.size
	if bf.size > size {
		if err := bf.f.Truncate(size); err != nil {
			return fmt.Errorf("durable: resizing %s: %w", bf.path, err)
		}
	}
	err := unix.Fallocate(int(bf.f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		err = bf.f.Truncate(size) // a file system without fallocate
	}
	if err != nil {
		return fmt.Errorf("durable: reserving %d bytes for %s: %w", size, bf.path, err)
	}
	bf.size = size
	return nil
}

// writeFree writes bf's header as free, in the store's layout, and
// fdatasyncs it.
func (s *Store) writeFree(bf *baseFile) error {
	h := encodeHeader(&header{state: stateFree, rank: s.rank, l: s.lay})
	if _, err := bf.f.WriteAt(h, 0); err != nil {
		return fmt.Errorf("durable: writing the header of %s: %w", bf.path, err)
	}
	if err := unix.Fdatasync(int(bf.f.Fd())); err != nil {
		return fmt.Errorf("durable: syncing %s: %w", bf.path, err)
	}
	return nil
}

// readPointer reads LATEST at Open. A pointer that does not verify, or
// names no complete version the store has, is logged and ignored: the
// next Save writes a good one.
func (s *Store) readPointer() {
	p := filepath.Join(s.dir, latestName)
	b, err := readSmall(p, ptrSize)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var ptr pointer
	if err == nil {
		ptr, err = parsePointer(b, magicPointer, s.rank, p)
	}
	if err == nil && !slices.ContainsFunc(s.files, func(bf *baseFile) bool {
		return bf.idx == ptr.file && bf.state == fsComplete && bf.version == ptr.version && bf.step == ptr.step && bf.hdrCRC == ptr.hdrCRC
	}) {
		err = corruptErr(p, 12, 36, "names version %d of step %d in base.%d, which no base file holds", ptr.version, ptr.step, ptr.file)
	}
	if err != nil {
		s.log.Warn("durable: the pointer is ignored", "err", err)
		return
	}
	s.ptr, s.hasPtr = ptr, true
	s.counter = max(s.counter, ptr.version)
}

// Latest returns what the rank's pointer names: its newest complete
// version (false if none).
func (s *Store) Latest() (Version, bool) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if !s.hasPtr {
		return Version{}, false
	}
	return Version{Step: s.ptr.step, Version: s.ptr.version, File: filepath.Join(s.dir, baseName(s.ptr.file))}, true
}

// Versions returns the rank's complete versions, by step (then version).
func (s *Store) Versions() []Version {
	s.mu.Lock()
	defer s.mu.Unlock()
	var vs []Version
	for _, bf := range s.files {
		if bf.state == fsComplete {
			vs = append(vs, Version{Step: bf.step, Version: bf.version, File: bf.path})
		}
	}
	slices.SortFunc(vs, func(a, b Version) int {
		if a.Step != b.Step {
			return cmpInt(a.Step, b.Step)
		}
		return cmpInt(a.Version, b.Version)
	})
	return vs
}

func cmpInt[T int64 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Marked returns the steps of the rank's complete versions that have
// their marker, ascending: a marker that names another version (its
// file, counter or header) does not count. It reads the rank's own
// markers only, one per complete version.
func (s *Store) Marked() []int64 {
	s.mu.Lock()
	var held []pointer
	for _, bf := range s.files {
		if bf.state == fsComplete {
			held = append(held, pointer{rank: s.rank, file: bf.idx, step: bf.step, version: bf.version, hdrCRC: bf.hdrCRC})
		}
	}
	s.mu.Unlock()
	var steps []int64
	for _, p := range held {
		if m, err := readMarker(s.root, s.rank, p.step); err == nil && m == p && !slices.Contains(steps, p.step) {
			steps = append(steps, p.step)
		}
	}
	slices.Sort(steps)
	return steps
}

// InFlight returns the number of Saves in progress.
func (s *Store) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight
}

// Load reads the rank's version of step into dst, as the package
// function Load does, checking dst against the store's regions.
func (s *Store) Load(ctx context.Context, step int64, dst [][]byte) error {
	return load(ctx, s.root, s.rank, step, dst, s.regions)
}

// Close releases the store's files; Saves in flight fail. Closing twice
// is a no-op.
func (s *Store) Close() error {
	s.rmu.Lock() // no publish is under way, and none writes after
	defer s.rmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.closeFiles()
}

func (s *Store) closeFiles() error {
	var errs []error
	for _, bf := range s.files {
		if err := bf.f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("durable: %w", err))
		}
		if bf.direct != nil {
			if err := bf.direct.Close(); err != nil {
				errs = append(errs, fmt.Errorf("durable: %w", err))
			}
		}
	}
	if s.lock != nil {
		// Last: the files are closed, and the next store of the rank
		// may open them.
		if err := s.lock.Close(); err != nil {
			errs = append(errs, fmt.Errorf("durable: %w", err))
		}
	}
	return errors.Join(errs...)
}
