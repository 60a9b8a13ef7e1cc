package durable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/gorun/gorun/internal/crc32c"
)

// Load reads rank's version of step in dir into dst (one slice per
// region, in order, each exactly the region's size), verifying the
// header and every chunk's CRC32C as it reads. It uses the complete
// version of step with the highest counter (falling back to another
// complete version of step, if there is one, when that one does not
// verify). No complete version of step is an error wrapping
// ErrNoVersion; one that does not verify, an error wrapping ErrCorrupt
// naming the file, the region and the byte range (dst then holds partial
// data). Load does not look at the commit record: a resume loads the
// step ReadCommitted returns.
func Load(ctx context.Context, dir string, rank int, step int64, dst [][]byte) error {
	return load(ctx, dir, rank, step, dst, nil)
}

// candidate is a base file holding a complete version, found by scanning.
type candidate struct {
	path string
	h    *header
	hb   []byte // the header's bytes
}

// scanBases reads the headers of rank's base files and returns those
// holding a complete version (all, or of step when step ≥ 0), by
// decreasing version, and the errors of the headers that do not verify.
func scanBases(dir string, rank int, step int64) ([]candidate, []error, error) {
	rd := rankDir(dir, rank)
	ents, err := os.ReadDir(rd)
	if err != nil {
		return nil, nil, fmt.Errorf("durable: %w", err)
	}
	var cands []candidate
	var bad []error
	for _, e := range ents {
		if _, ok := parseBase(e.Name()); !ok {
			continue
		}
		p := filepath.Join(rd, e.Name())
		h, hb, err := readHeaderPath(p, rank)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if h.complete() && (step < 0 || h.step == step) {
			cands = append(cands, candidate{p, h, hb})
		}
	}
	slices.SortFunc(cands, func(a, b candidate) int { return cmpInt(b.h.version, a.h.version) })
	return cands, bad, nil
}

// readHeaderPath opens path and reads its header.
func readHeaderPath(path string, rank int) (*header, []byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	return readHeader(f, rank, path)
}

// openRegular opens path for reading, without following a symbolic
// link, and checks that it is a regular file.
func openRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
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
		return nil, corruptErr(path, 0, 0, "not a regular file (%v)", fi.Mode().Type())
	}
	return f, nil
}

// load is Load, checking the regions' names too when want is not nil.
func load(ctx context.Context, dir string, rank int, step int64, dst [][]byte, want []Region) error {
	if !validRank(rank) || !validStep(step) {
		return fmt.Errorf("durable: bad rank %d or step %d", rank, step)
	}
	cands, bad, err := scanBases(dir, rank, step)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: rank %d has no directory in %s", ErrNoVersion, rank, dir)
	}
	if err != nil {
		return err
	}
	if len(cands) == 0 {
		err := fmt.Errorf("%w: rank %d holds no complete version of step %d", ErrNoVersion, rank, step)
		if len(bad) > 0 {
			err = fmt.Errorf("%w (and %d base files do not verify: %w)", err, len(bad), errors.Join(bad...))
		}
		return err
	}
	var errs []error
	for _, c := range cands {
		err := loadFile(ctx, c, dst, want)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// loadFile reads c's version into dst.
func loadFile(ctx context.Context, c candidate, dst [][]byte, want []Region) error {
	l := c.h.l
	if len(dst) != len(l.regions) {
		return fmt.Errorf("durable: %s: %d regions, the caller has %d", c.path, len(l.regions), len(dst))
	}
	for i, r := range l.regions {
		if int64(len(dst[i])) != r.Size {
			return fmt.Errorf("durable: %s: region %q is %d bytes, the caller's is %d", c.path, r.Name, r.Size, len(dst[i]))
		}
	}
	if want != nil {
		if err := sameRegions(l.regions, want); err != nil {
			return fmt.Errorf("durable: %s: %v", c.path, err)
		}
	}
	f, err := openRegular(c.path)
	if err != nil {
		return err
	}
	defer f.Close()
	table, err := readTable(f, c)
	if err != nil {
		return err
	}
	if err := readChunks(ctx, f, c, table, dst); err != nil {
		return err
	}
	// The header again: a version freed and rewritten while it was read
	// (which the protocol does not do to a version being loaded) must
	// not pass.
	hb := make([]byte, hdrSize)
	if _, err := f.ReadAt(hb, 0); err != nil {
		return fmt.Errorf("durable: reading %s: %w", c.path, err)
	}
	if !bytes.Equal(hb, c.hb) {
		return corruptErr(c.path, 0, hdrSize, "the header changed while the version was read")
	}
	return nil
}

// readTable checks c's file size and reads and checks its chunk table.
func readTable(f *os.File, c candidate) ([]uint32, error) {
	l := c.h.l
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	if fi.Size() != l.size {
		return nil, corruptErr(c.path, min(fi.Size(), l.size), max(fi.Size(), l.size), "the file is %d bytes, its layout %d", fi.Size(), l.size)
	}
	// The table and the zeros after it, up to the data.
	buf := make([]byte, l.tableEnd-hdrSize)
	if _, err := f.ReadAt(buf, hdrSize); err != nil {
		return nil, fmt.Errorf("durable: reading %s: %w", c.path, err)
	}
	tb := buf[:4*l.chunks]
	if got := crc32c.Checksum(tb); got != c.h.table {
		return nil, corruptErr(c.path, hdrSize, hdrSize+int64(len(tb)), "chunk table CRC32C %#08x, the header says %#08x", got, c.h.table)
	}
	if i := nonZero(buf[len(tb):]); i >= 0 {
		return nil, corruptErr(c.path, hdrSize+int64(len(tb)+i), l.tableEnd, "the padding after the chunk table is not zero")
	}
	table := make([]uint32, l.chunks)
	for k := range table {
		table[k] = le.Uint32(tb[4*k:])
	}
	return table, nil
}

// nonZero returns the index of b's first byte that is not zero, or -1.
func nonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return -1
}

// loadReaders is the number of goroutines reading a version's chunks.
const loadReaders = DefaultWriters

// readChunks reads every chunk of c into dst (or, if dst is nil, into
// scratch buffers, to verify it) and checks its CRC32C against the
// table, and that the padding after each region's last chunk (up to the
// next multiple of 4096, under no CRC) is zero. The error is about the
// first bad chunk (lowest offset).
func readChunks(ctx context.Context, f *os.File, c candidate, table []uint32, dst [][]byte) error {
	l := c.h.l
	var next atomic.Int64
	var mu sync.Mutex
	badK := int64(-1)
	var badErr error
	g, ctx := errgroup.WithContext(ctx)
	for range min(int64(loadReaders), l.chunks) {
		g.Go(func() error {
			var scratch []byte
			if dst == nil {
				scratch = make([]byte, l.chunk)
			}
			var pad []byte // a region's padding, when read apart from its last chunk
			for {
				if err := ctx.Err(); err != nil {
					return context.Cause(ctx)
				}
				k := next.Add(1) - 1
				if k >= l.chunks {
					return nil
				}
				mu.Lock()
				stop := badK >= 0 && badK < k
				mu.Unlock()
				if stop {
					return nil
				}
				r, off, n := l.chunkAt(k)
				// The padding after the region, if this is its last
				// chunk: read with the chunk into scratch, apart into
				// pad when the chunk goes to dst.
				padN := int64(0)
				if off+n == l.regions[r].Size {
					padN = roundUp(n) - n
				}
				buf := scratch[:min(n+padN, int64(len(scratch)))]
				if dst != nil {
					buf = dst[r][off : off+n]
				}
				at := l.dataOff[r] + off
				_, err := f.ReadAt(buf, at)
				if err == nil && dst != nil && padN > 0 {
					if pad == nil {
						pad = make([]byte, align)
					}
					_, err = f.ReadAt(pad[:padN], at+n)
				}
				if err != nil {
					if errors.Is(err, io.EOF) {
						err = corruptErr(c.path, at, at+n, "region %q bytes [%d, %d): the file ends", l.regions[r].Name, off, off+n)
					} else {
						return fmt.Errorf("durable: reading %s: %w", c.path, err)
					}
					mu.Lock()
					if badK < 0 || k < badK {
						badK, badErr = k, err
					}
					mu.Unlock()
					continue
				}
				var bad error
				if got := crc32c.Checksum(buf[:n]); got != table[k] {
					bad = corruptErr(c.path, at, at+n, "region %q bytes [%d, %d) (chunk %d): CRC32C %#08x, the table says %#08x",
						l.regions[r].Name, off, off+n, k, got, table[k])
				} else if padN > 0 {
					var p []byte
					if dst != nil {
						p = pad[:padN]
					} else {
						p = buf[n : n+padN]
					}
					if i := nonZero(p); i >= 0 {
						bad = corruptErr(c.path, at+n+int64(i), at+n+padN, "the padding after region %q is not zero", l.regions[r].Name)
					}
				}
				if bad != nil {
					mu.Lock()
					if badK < 0 || k < badK {
						badK, badErr = k, bad
					}
					mu.Unlock()
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return badErr
}
