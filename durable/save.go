package durable

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
)

// Store.Save and what it does, steps 1 to 8 of the package comment: taking a
// free base file, writing the chunks (with O_DIRECT where the file system
// takes it), the table and header, then publishing the version (pointer and
// marker); and the repair of what failed before.

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
