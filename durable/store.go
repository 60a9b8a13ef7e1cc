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
	"unsafe"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/ckpt"
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

// directAlign is the alignment O_DIRECT asks of a write's memory, file
// offset and length (the device's logical block size, 4096 at most on
// the devices gorun knows): chunks are at multiples of 4096 in a base
// file, and written whole up to one.
const directAlign = 4096

// alignedBuf returns n bytes of memory starting at a multiple of
// directAlign.
func alignedBuf(n int) []byte {
	b := make([]byte, n+directAlign)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(b))) & (directAlign - 1))
	return b[off : off+n : off+n]
}

// openDirectFile opens a base file for writing with O_DIRECT (a variable:
// tests have it fail).
var openDirectFile = func(p string) (*os.File, error) {
	return os.OpenFile(p, os.O_WRONLY|syscall.O_DIRECT|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
}

// openDirect opens the base file p for writing with O_DIRECT, or returns
// nil where the file system refuses it (the chunks are then written
// through the page cache).
func (s *Store) openDirect(p string) *os.File {
	f, err := openDirectFile(p)
	if err != nil {
		s.log.Debug("durable: no O_DIRECT on the base files: written through the page cache", "file", p, "err", err)
		return nil
	}
	return f
}

// directRefused reports whether err, from a write with O_DIRECT, says
// the file system or the device does not take such writes (EINVAL:
// another alignment wanted; EOPNOTSUPP, ENOTSUP, ENOSYS: not supported,
// as some FUSE file systems say) rather than that the write failed
// (ENOSPC, EIO: the version is abandoned).
func directRefused(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ENOSYS)
}

// writeData writes b, a chunk in memory from alignedBuf, at off in bf:
// with O_DIRECT when direct and the file system takes it, else through
// the page cache. A direct write refused (directRefused) is written
// through the page cache, as are all the store's writes after it. Either
// way the bytes reach the disk by the fdatasync of step 5 (which flushes
// the device's cache too).
func (s *Store) writeData(bf *baseFile, b []byte, off int64, direct bool) error {
	if direct && bf.direct != nil && !s.buffered.Load() {
		err := s.at("direct", off)
		if err == nil {
			_, err = bf.direct.WriteAt(b, off)
		}
		if !directRefused(err) {
			return err
		}
		if !s.buffered.Swap(true) {
			s.log.Info("durable: O_DIRECT writes refused: the base files are written through the page cache", "file", bf.path, "err", err)
		}
	}
	_, err := bf.f.WriteAt(b, off)
	return err
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

// Save writes one version of the rank's regions at step, from src (one
// slice per region, in order, each of the region's size), and makes it
// durable as the package comment describes: data, chunk table and header
// fdatasynced in that order, then the pointer moved forward, then the
// completion marker written. sums are the regions' CRC32Cs, as committed
// with src (ckpt.Staged.Sums, ckpt.Snapshot.Sums): a source that does not
// match them, whole, fails the save with an error wrapping ErrCorrupt
// and nothing is kept. copied, if not nil, is called once, when every
// byte of src has been read and matched sums (before the data are
// synced); after it Save does not touch src. It is not called when Save
// fails before then.
//
// Save returns an error wrapping ErrBusy at once, without reading src,
// when Concurrency saves are in flight or no base file is free. Any
// error before the header is written abandons the version: the file
// stays free. ctx cancels a save in progress the same way. Two Saves of
// one step may not be in flight at once. Steps need not increase from
// one Save to the next, but a version's counter is taken when Save
// starts, and the pointer names the complete version that started last.
func (s *Store) Save(ctx context.Context, step int64, src [][]byte, sums []uint32, copied func()) error {
	if !validStep(step) {
		return fmt.Errorf("durable: bad step %d", step)
	}
	if len(src) != len(s.regions) || len(sums) != len(s.regions) {
		return fmt.Errorf("durable: save of step %d: %d sources and %d CRCs for %d regions", step, len(src), len(sums), len(s.regions))
	}
	for i, r := range s.regions {
		if int64(len(src[i])) != r.Size {
			return fmt.Errorf("durable: save of step %d: region %q: %d bytes, want %d", step, r.Name, len(src[i]), r.Size)
		}
	}
	s.repair()
	bf, version, direct, err := s.take(step)
	if err != nil {
		return err
	}
	complete := false
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !complete {
			bf.state = fsFree
			if errors.Is(err, errCrash) || errors.Is(err, errBrokenHeader) {
				bf.state = fsBroken
			}
		}
		s.inflight--
		delete(s.steps, step)
	}()
	err = s.write(ctx, bf, step, version, direct, src, sums, copied)
	if err != nil {
		return fmt.Errorf("durable: rank %d: version %d of step %d abandoned: %w", s.rank, version, step, err)
	}
	complete = true
	s.mu.Lock()
	p := pointer{rank: s.rank, file: bf.idx, step: step, version: version, hdrCRC: bf.hdrCRC}
	s.mu.Unlock()
	superseded, err := s.publish(p)
	if superseded {
		// Reclaim moved past this step while it was written: no
		// recovery can use it, and it would hold its file until the
		// next Reclaim. It is freed at once, unmarked.
		s.log.Debug("durable: a save finished after the watermark passed it: freed", "step", step)
		return s.freeVersion(p)
	}
	if err != nil {
		if !errors.Is(err, errCrash) && !errors.Is(err, ErrClosed) {
			s.pmu.Lock()
			s.pending = append(s.pending, p)
			s.pmu.Unlock()
		}
		return fmt.Errorf("durable: rank %d: version %d of step %d is complete but not marked (retried at the next Save): %w", s.rank, version, step, err)
	}
	return nil
}

// freeVersion frees the file of p's version, if it still holds it.
func (s *Store) freeVersion(p pointer) error {
	_, err := s.free(func(f *baseFile) bool {
		return f.idx == p.file && f.state == fsComplete && f.version == p.version
	})
	if err != nil {
		return fmt.Errorf("durable: rank %d: step %d: %w", s.rank, p.step, err)
	}
	return nil
}

// repair retries what failed before, at the start of a Save or Reclaim:
// it rewrites as free the headers of broken files, and moves the pointer
// and writes the markers of the complete versions whose publish failed.
// What fails again is logged and left for the next time. One repair runs
// at a time; a Save that finds one running goes on without.
func (s *Store) repair() {
	if !s.repairMu.TryLock() {
		return
	}
	defer s.repairMu.Unlock()
	if _, err := s.free(func(bf *baseFile) bool { return bf.state == fsBroken }); err != nil {
		s.log.Warn("durable: a base file's header cannot be rewritten", "err", err)
	}
	s.pmu.Lock()
	pending := slices.Clone(s.pending)
	s.pmu.Unlock()
	for _, p := range pending {
		superseded, err := s.publish(p)
		switch {
		case superseded:
			if err := s.freeVersion(p); err != nil {
				s.log.Warn("durable: a base file's header cannot be rewritten", "err", err)
			}
		case err != nil:
			s.log.Warn("durable: a complete version cannot be marked", "step", p.step, "version", p.version, "err", err)
			continue
		}
		s.dropPending(func(q pointer) bool { return q.version == p.version })
	}
}

// dropPending forgets the pending publishes that drop chooses.
func (s *Store) dropPending(drop func(pointer) bool) {
	s.pmu.Lock()
	s.pending = slices.DeleteFunc(s.pending, drop)
	s.pmu.Unlock()
}

// errBrokenHeader marks a failure after which a file's header on disk
// may be anything: the file is not reused until the store is reopened
// (or Reclaim rewrites it).
var errBrokenHeader = errors.New("durable: the header's state on disk is unknown")

// CopyWaited tells the store that its caller waited for a save to have
// copied its source (Save's copied) before it could overwrite it: with
// O_DIRECT that copy lasts as long as the device takes to write the
// chunks. The next PageCacheSaves saves write their chunks through the
// page cache, whose copy ends sooner (the kernel writes the pages back
// meanwhile, and step 5's fdatasync waits for them), then the store goes
// back to O_DIRECT; a wait meanwhile starts the count again.
func (s *Store) CopyWaited() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cacheLeft == 0 {
		s.log.Debug("durable: a save's copy was waited for: the next saves write through the page cache", "rank", s.rank, "saves", PageCacheSaves)
	}
	s.cacheLeft = PageCacheSaves
}

// Written returns how many saves wrote their chunks with O_DIRECT and how
// many through the page cache (by how each began: a direct write refused
// midway has the rest written through the page cache), of the ones that
// got to their chunks.
func (s *Store) Written() (direct, cached int64) {
	return s.direct.Load(), s.cached.Load()
}

// take picks a free base file for a Save of step and hands out the
// version's counter, and says whether the save writes with O_DIRECT (not
// while CopyWaited's count of page-cache saves lasts, which it counts
// down).
func (s *Store) take(step int64) (bf *baseFile, version uint64, direct bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, 0, false, ErrClosed
	case s.steps[step]:
		return nil, 0, false, fmt.Errorf("durable: rank %d: a save of step %d is in flight already", s.rank, step)
	case s.inflight >= s.n:
		return nil, 0, false, fmt.Errorf("%w: rank %d: %d saves in flight (concurrency %d)", ErrBusy, s.rank, s.inflight, s.n)
	}
	i := slices.IndexFunc(s.files, func(bf *baseFile) bool { return bf.state == fsFree })
	if i < 0 {
		return nil, 0, false, fmt.Errorf("%w: rank %d: none of its %d base files is free", ErrBusy, s.rank, len(s.files))
	}
	bf = s.files[i]
	direct = s.cacheLeft == 0
	if !direct {
		s.cacheLeft--
	}
	bf.state = fsInFlight
	s.inflight++
	s.steps[step] = true
	s.counter++
	return bf, s.counter, direct, nil
}

// write writes a version into bf, steps 2 to 6 of the package comment.
func (s *Store) write(ctx context.Context, bf *baseFile, step int64, version uint64, direct bool, src [][]byte, sums []uint32, copied func()) error {
	l := s.lay
	fd := int(bf.f.Fd())
	// 2. The header as free, first of all.
	if err := s.at("free", 0); err != nil {
		return err
	}
	if bf.size != l.size {
		if err := s.resize(bf); err != nil {
			return err
		}
	}
	if err := s.writeFree(bf); err != nil {
		return err
	}
	// 3. The chunks.
	direct = direct && bf.direct != nil && !s.buffered.Load()
	if direct {
		s.direct.Add(1)
	} else {
		s.cached.Add(1)
	}
	table, err := s.writeChunks(ctx, bf, src, direct)
	if err != nil {
		return err
	}
	// 4. The source must be what was committed.
	for r, reg := range l.regions {
		var crc uint32
		for k := l.first[r]; k < l.first[r]+(reg.Size+l.chunk-1)/l.chunk; k++ {
			_, _, n := l.chunkAt(k)
			crc = ckpt.CombineCRC32C(crc, table[k], n)
		}
		if crc != sums[r] {
			return fmt.Errorf("%w: region %q of step %d: the source's CRC32C is %#08x, the caller's %#08x (overwritten while read?)",
				ErrCorrupt, reg.Name, step, crc, sums[r])
		}
	}
	if copied != nil {
		copied()
	}
	// 5. The chunk table and the zeros after it, then everything
	// durable.
	tb := make([]byte, l.tableEnd-hdrSize)
	for k, c := range table {
		le.PutUint32(tb[4*k:], c)
	}
	if err := s.at("table", 0); err != nil {
		return err
	}
	if _, err := bf.f.WriteAt(tb, hdrSize); err != nil {
		return fmt.Errorf("writing the chunk table of %s: %w", bf.path, err)
	}
	if err := s.at("datasync", 0); err != nil {
		return err
	}
	if err := unix.Fdatasync(fd); err != nil {
		return fmt.Errorf("syncing %s: %w", bf.path, err)
	}
	// 6. The header, complete.
	if err := s.at("header", 0); err != nil {
		return err
	}
	hb := encodeHeader(&header{state: stateComplete, rank: s.rank, step: step, version: version, table: crc32c.Checksum(tb[:4*len(table)]), l: l})
	if _, err := bf.f.WriteAt(hb, 0); err != nil {
		return s.unwrite(bf, fmt.Errorf("writing the header of %s: %w", bf.path, err))
	}
	if err := s.at("headersync", 0); err != nil {
		if errors.Is(err, errCrash) {
			return err
		}
		return s.unwrite(bf, err)
	}
	if err := unix.Fdatasync(fd); err != nil {
		return s.unwrite(bf, fmt.Errorf("syncing %s: %w", bf.path, err))
	}
	s.mu.Lock()
	bf.state, bf.step, bf.version, bf.hdrCRC = fsComplete, step, version, crc32c.Checksum(hb)
	s.mu.Unlock()
	return nil
}

// unwrite tries to make bf's header free again after a failed write or
// sync of its complete header; if it cannot, the file is broken (its
// state on disk unknown) until Reclaim or a reopen.
func (s *Store) unwrite(bf *baseFile, err error) error {
	if ferr := s.writeFree(bf); ferr != nil {
		return fmt.Errorf("%w (and then %w: %w)", err, errBrokenHeader, ferr)
	}
	return err
}

// writeChunks writes src's chunks into bf with s.writers goroutines (with
// O_DIRECT if direct: writeData) and returns the chunk table.
func (s *Store) writeChunks(ctx context.Context, bf *baseFile, src [][]byte, direct bool) ([]uint32, error) {
	l := s.lay
	table := make([]uint32, l.chunks)
	var next atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for range min(int64(s.writers), l.chunks) {
		g.Go(func() error {
			bp := s.bufs.Get().(*[]byte)
			defer s.bufs.Put(bp)
			buf := *bp
			for {
				if err := ctx.Err(); err != nil {
					return context.Cause(ctx)
				}
				k := next.Add(1) - 1
				if k >= l.chunks {
					return nil
				}
				r, off, n := l.chunkAt(k)
				table[k] = crc32c.CopyUpdate(0, buf[:n], src[r][off:off+n])
				// A region's last chunk is written with the zeros up to
				// the next multiple of 4096: whatever the file held there
				// (a version of another layout) goes.
				w := roundUp(n)
				clear(buf[n:w])
				if err := s.at("chunk", k); err != nil {
					return err
				}
				if err := s.writeData(bf, buf[:w], l.dataOff[r]+off, direct); err != nil {
					return fmt.Errorf("writing chunk %d of %s: %w", k, bf.path, err)
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return table, nil
}

// publish moves the pointer to a complete version if it is the newest,
// then writes its marker: steps 7 and 8. It does neither, and returns
// superseded, when the watermark passed the version's step or Abandon
// gave it up (the caller frees its file), and returns ErrClosed once the
// store is closed. The look and the writes are one step for Reclaim and
// Abandon (rmu).
func (s *Store) publish(p pointer) (superseded bool, err error) {
	if err := s.at("publish", 0); err != nil {
		return false, err
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.mu.Lock()
	closed, stale := s.closed, s.staleLocked(p.step)
	s.mu.Unlock()
	switch {
	case closed:
		return false, ErrClosed
	case stale:
		return true, nil
	}
	if err := s.at("pointer", 0); err != nil {
		return false, err
	}
	if err := s.movePointer(p); err != nil {
		return false, err
	}
	if err := s.at("marker", 0); err != nil {
		return false, err
	}
	err = writeAtomic(s.dir, doneName(p.step), [][]byte{encodePointer(magicMarker, p)}, s.fault("marker"))
	if err != nil {
		return false, err
	}
	return false, s.at("done", 0)
}

// movePointer replaces LATEST with p if p's version is newer than the
// pointer's, in memory and on disk, under pmu.
func (s *Store) movePointer(p pointer) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.hasPtr && s.ptr.version >= p.version {
		return nil
	}
	if err := writeAtomic(s.dir, latestName, [][]byte{encodePointer(magicPointer, p)}, s.fault("latest")); err != nil {
		return err
	}
	s.ptr, s.hasPtr = p, true
	return nil
}

// staleLocked reports whether a version of step can never be committed:
// before the watermark, or given up by Abandon. s.mu is held.
func (s *Store) staleLocked(step int64) bool {
	return step < s.watermark || step <= s.resolved && step != s.kept
}

// fault returns the hook for writeAtomic of the named file.
func (s *Store) fault(name string) func(op string) error {
	if s.hook == nil {
		return nil
	}
	return func(op string) error { return s.hook(name+"."+op, 0) }
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

// Reclaim frees what a recovery at committed, the step of the commit
// record, cannot need (see Reclaiming in the package comment) and
// returns the number of base files it freed. It frees nothing and
// returns an error wrapping ErrNoVersion when the rank holds no complete
// version of committed.
func (s *Store) Reclaim(committed int64) (int, error) {
	s.repair()
	if err := s.at("reclaim.lock", 0); err != nil {
		return 0, err
	}
	// Under rmu: no publish looks at the watermark before it moves and
	// writes its marker after the markers are removed.
	s.rmu.Lock()
	s.dropPending(func(p pointer) bool { return p.step < committed })
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.rmu.Unlock()
		return 0, ErrClosed
	}
	s.watermark = max(s.watermark, committed)
	if !slices.ContainsFunc(s.files, func(bf *baseFile) bool { return bf.state == fsComplete && bf.step == committed }) {
		s.mu.Unlock()
		s.rmu.Unlock()
		return 0, fmt.Errorf("%w: rank %d: reclaiming before step %d, which it does not hold: nothing freed", ErrNoVersion, s.rank, committed)
	}
	s.mu.Unlock()
	// Markers first: a marker never outlives its version.
	err := s.removeMarkers(func(step int64) bool { return step < committed })
	s.rmu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := s.removeBatches(func(a, b int64) bool { return b <= committed }); err != nil {
		return 0, err
	}
	s.pmu.Lock()
	ptrFile := -1
	if s.hasPtr {
		ptrFile = s.ptr.file
	}
	s.pmu.Unlock()
	return s.free(func(bf *baseFile) bool {
		return (bf.state == fsComplete && bf.step < committed && bf.idx != ptrFile) || bf.state == fsBroken
	})
}

// Abandon frees what can never be committed once the launcher resolved
// every step up to resolved, committed being its commit record's step
// (-1: none yet): every complete version of a step at or before
// resolved other than committed, with its marker (see Abandoning in the
// package comment). A version of such a step that completes later is
// freed at once, unmarked. The pointer, if it names a version freed,
// first moves back to the newest complete version left (by counter), or
// is removed. Abandon returns the number of base files it freed;
// resolved < 0 frees nothing.
func (s *Store) Abandon(committed, resolved int64) (int, error) {
	if resolved < 0 {
		return 0, nil
	}
	s.repair()
	if err := s.at("abandon.lock", 0); err != nil {
		return 0, err
	}
	gone := func(step int64) bool { return step <= resolved && step != committed }
	// Under rmu, as Reclaim: no publish looks before the step is given
	// up and writes its marker after the markers are removed.
	s.rmu.Lock()
	s.dropPending(func(p pointer) bool { return gone(p.step) })
	s.pmu.Lock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.pmu.Unlock()
		s.rmu.Unlock()
		return 0, ErrClosed
	}
	if resolved >= s.resolved {
		s.resolved, s.kept = resolved, max(s.kept, committed)
	}
	var todo []*baseFile
	var newest *baseFile // the newest complete version left
	for _, bf := range s.files {
		switch {
		case bf.state != fsComplete:
		case gone(bf.step):
			bf.state = fsFreeing
			todo = append(todo, bf)
		case newest == nil || bf.version > newest.version:
			newest = bf
		}
	}
	s.mu.Unlock()
	// The pointer first: it never names a freed file.
	var perr error
	if s.hasPtr && slices.ContainsFunc(todo, func(bf *baseFile) bool { return bf.idx == s.ptr.file }) {
		var p pointer
		if newest != nil {
			p = pointer{rank: s.rank, file: newest.idx, step: newest.step, version: newest.version, hdrCRC: newest.hdrCRC}
			perr = writeAtomic(s.dir, latestName, [][]byte{encodePointer(magicPointer, p)}, s.fault("latest"))
		} else {
			perr = removeSynced(s.dir, latestName)
		}
		if perr == nil {
			s.ptr, s.hasPtr = p, newest != nil
		} else {
			// The file the pointer names stays as it is, and its step's
			// markers with it; the next Abandon tries again.
			s.mu.Lock()
			todo = slices.DeleteFunc(todo, func(bf *baseFile) bool {
				if bf.idx == s.ptr.file {
					bf.state = fsComplete
					return true
				}
				return false
			})
			s.mu.Unlock()
		}
	}
	kept := int64(-1)
	if perr != nil {
		kept = s.ptr.step
	}
	s.pmu.Unlock()
	// Then the markers: a marker never outlives its version.
	merr := s.removeMarkers(func(step int64) bool { return gone(step) && step != kept })
	s.rmu.Unlock()
	if merr != nil {
		// The files stay complete, as their markers may.
		s.mu.Lock()
		for _, bf := range todo {
			bf.state = fsComplete
		}
		s.mu.Unlock()
		return 0, errors.Join(perr, merr)
	}
	freed, ferr := s.free(func(bf *baseFile) bool { return slices.Contains(todo, bf) })
	return freed, errors.Join(perr, ferr)
}

// free rewrites as free the headers of the files that pick chooses
// (under mu) and returns how many it freed.
func (s *Store) free(pick func(*baseFile) bool) (int, error) {
	s.mu.Lock()
	var todo []*baseFile
	for _, bf := range s.files {
		if pick(bf) {
			bf.state = fsFreeing
			todo = append(todo, bf)
		}
	}
	s.mu.Unlock()
	var errs []error
	freed := 0
	for _, bf := range todo {
		err := s.writeFree(bf)
		s.mu.Lock()
		if err == nil {
			bf.state, bf.step, bf.version, bf.hdrCRC = fsFree, 0, 0, 0
			freed++
		} else {
			bf.state = fsBroken
			errs = append(errs, err)
		}
		s.mu.Unlock()
	}
	return freed, errors.Join(errs...)
}

// removeMarkers removes the rank's markers of the steps drop chooses.
func (s *Store) removeMarkers(drop func(step int64) bool) error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	var names []string
	for _, e := range ents {
		if step, ok := parseDone(e.Name()); ok && drop(step) {
			names = append(names, e.Name())
		}
	}
	return removeSynced(s.dir, names...)
}

// removeBatches removes the rank's batches that drop chooses.
func (s *Store) removeBatches(drop func(a, b int64) bool) error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	var names []string
	for _, e := range ents {
		if a, b, ok := parseDiff(e.Name()); ok && drop(a, b) {
			names = append(names, e.Name())
		}
	}
	return removeSynced(s.dir, names...)
}

// Truncate forgets everything the rank wrote after step (see Resuming
// and restoring in the package comment): for a job resumed, or a rank
// restored, at step. It fails if a Save is in flight.
func (s *Store) Truncate(step int64) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case s.inflight > 0:
		s.mu.Unlock()
		return fmt.Errorf("durable: rank %d: truncating after step %d with %d saves in flight", s.rank, step, s.inflight)
	}
	// The pointer first: it must never name a freed file.
	var newest *baseFile
	for _, bf := range s.files {
		if bf.state == fsComplete && bf.step <= step && (newest == nil || bf.version > newest.version) {
			newest = bf
		}
	}
	var p pointer
	if newest != nil {
		p = pointer{rank: s.rank, file: newest.idx, step: newest.step, version: newest.version, hdrCRC: newest.hdrCRC}
	}
	s.mu.Unlock()
	s.dropPending(func(p pointer) bool { return p.step > step })
	s.pmu.Lock()
	if !s.hasPtr || s.ptr.step > step {
		var err error
		if newest != nil {
			err = writeAtomic(s.dir, latestName, [][]byte{encodePointer(magicPointer, p)}, s.fault("latest"))
		} else {
			err = removeSynced(s.dir, latestName)
		}
		if err != nil {
			s.pmu.Unlock()
			return err
		}
		s.ptr, s.hasPtr = p, newest != nil
	}
	s.pmu.Unlock()
	if err := s.removeMarkers(func(st int64) bool { return st > step }); err != nil {
		return err
	}
	if err := trimBatches(s.root, s.rank, step); err != nil {
		return err
	}
	_, err := s.free(func(bf *baseFile) bool {
		return (bf.state == fsComplete && bf.step > step) || bf.state == fsBroken
	})
	return err
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
