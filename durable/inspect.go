package durable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/gorun/gorun/internal/crc32c"
)

// diskBytes returns the bytes a file takes on disk (st_blocks), or its
// size where the file system does not say.
func diskBytes(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// rankDirs returns the ranks that have a directory in dir, ascending.
func rankDirs(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	var ranks []int
	for _, e := range ents {
		if r, ok := parseRankDir(e.Name()); ok && e.IsDir() {
			ranks = append(ranks, r)
		}
	}
	slices.Sort(ranks)
	return ranks, nil
}

// Footprint returns the directory's usage, from the files' allocated
// sizes (st_blocks). Ranks has an entry for every rank up to the highest
// that has a directory.
func Footprint(dir string) (Usage, error) {
	var u Usage
	ents, err := os.ReadDir(dir)
	if err != nil {
		return u, fmt.Errorf("durable: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		if fi, err := e.Info(); err == nil {
			u.Total += diskBytes(fi)
		}
	}
	ranks, err := rankDirs(dir)
	if err != nil {
		return u, err
	}
	if len(ranks) > 0 {
		u.Ranks = make([]int64, ranks[len(ranks)-1]+1)
	}
	for _, r := range ranks {
		n, err := dirBytes(rankDir(dir, r))
		if err != nil {
			return u, err
		}
		u.Ranks[r] = n
		u.Total += n
	}
	return u, nil
}

// dirBytes returns the bytes the regular files of a directory take.
func dirBytes(dir string) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("durable: %w", err)
	}
	var n int64
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if fi, err := e.Info(); err == nil {
			n += diskBytes(fi)
		}
	}
	return n, nil
}

// List reads the directory's manifest, commit record, and every rank's
// headers, pointer, markers and batches, without reading the data (Verify
// does): for gorun ckpt ls and show.
func List(dir string) (*Listing, error) {
	ranks, err := rankDirs(dir)
	if err != nil {
		return nil, err
	}
	ls := &Listing{}
	ls.Manifest, ls.ManifestErr = ReadManifest(dir)
	ls.Committed, ls.CommitErr = ReadCommitted(dir)
	ls.HasCommit = ls.CommitErr == nil
	if errors.Is(ls.CommitErr, ErrNotCommitted) {
		ls.CommitErr = nil
	}
	for _, r := range ranks {
		rl, err := listRank(dir, r, ls.Committed, ls.HasCommit)
		if err != nil {
			return nil, err
		}
		ls.Ranks = append(ls.Ranks, *rl)
	}
	if ls.Usage, err = Footprint(dir); err != nil {
		return nil, err
	}
	return ls, nil
}

// listRank lists one rank's files.
func listRank(dir string, rank int, committed int64, hasCommit bool) (*RankListing, error) {
	rd := rankDir(dir, rank)
	ents, err := os.ReadDir(rd)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	rl := &RankListing{Rank: rank}
	for _, e := range ents {
		name := e.Name()
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		if fi.Mode().IsRegular() {
			rl.Disk += diskBytes(fi)
		}
		if isTemp(name) {
			continue
		}
		p := filepath.Join(rd, name)
		if i, ok := parseBase(name); ok {
			bf := BaseFile{Path: p, Index: i, Disk: diskBytes(fi)}
			h, _, err := readHeaderPath(p, rank)
			switch {
			case err != nil:
				bf.State, bf.Err = StateCorrupt, err
			case h.complete():
				bf.State, bf.Step, bf.Version = StateComplete, h.step, h.version
				for _, r := range h.l.regions {
					bf.Bytes += r.Size
				}
			}
			rl.Bases = append(rl.Bases, bf)
		}
		if step, ok := parseDone(name); ok {
			rl.Markers = append(rl.Markers, step)
		}
		if a, b, ok := parseDiff(name); ok {
			rl.Batches = append(rl.Batches, Batch{Path: p, First: a, Last: b, Disk: diskBytes(fi)})
		}
	}
	slices.SortFunc(rl.Bases, func(a, b BaseFile) int { return a.Index - b.Index })
	slices.Sort(rl.Markers)
	slices.SortFunc(rl.Batches, func(x, y Batch) int { return cmpInt(x.First, y.First)*2 + cmpInt(x.Last, y.Last) })
	if hasCommit {
		// The committed version: the complete one of that step with the
		// highest counter (the one Load reads).
		c := -1
		for i, bf := range rl.Bases {
			if bf.State == StateComplete && bf.Step == committed && (c < 0 || bf.Version > rl.Bases[c].Version) {
				c = i
			}
		}
		if c >= 0 {
			rl.Bases[c].State = StateCommitted
		}
	}
	if b, err := readSmall(filepath.Join(rd, latestName), ptrSize); err == nil {
		if p, err := parsePointer(b, magicPointer, rank, filepath.Join(rd, latestName)); err == nil {
			rl.Latest = &Version{Step: p.step, Version: p.version, File: filepath.Join(rd, baseName(p.file))}
		}
	}
	return rl, nil
}

// Verify checks every file of the directory: the manifest, the commit
// record, and for every rank its base files' headers and every chunk's
// CRC32C, its pointer, markers and batches; and that every rank of the
// manifest holds a complete version of the committed step, with its
// marker. It returns the problems it found (none: all is well); err is
// about the directory itself (it cannot be read, or ctx ended).
func Verify(ctx context.Context, dir string) (problems []Problem, err error) {
	ranks, err := rankDirs(dir)
	if err != nil {
		return nil, err
	}
	report := func(path string, err error) {
		p := Problem{Path: path, Err: err}
		if ce, ok := errors.AsType[*CorruptError](err); ok {
			p.Off, p.End = ce.Off, ce.End
		}
		problems = append(problems, p)
	}
	m, merr := ReadManifest(dir)
	if merr != nil {
		report(filepath.Join(dir, manifestName), merr)
	}
	committed, cerr := ReadCommitted(dir)
	hasCommit := cerr == nil
	if cerr != nil && !errors.Is(cerr, ErrNotCommitted) {
		report(filepath.Join(dir, committedName), cerr)
	}
	for _, r := range ranks {
		var want []Region
		if m != nil {
			if r >= m.World {
				report(rankDir(dir, r), fmt.Errorf("durable: rank %d is not in the job (world size %d)", r, m.World))
			} else {
				want = m.Regions[r]
			}
		}
		good, err := verifyRank(ctx, dir, r, want, report)
		if err != nil {
			return problems, err
		}
		if hasCommit && m != nil && r < m.World && !good[committed] {
			report(rankDir(dir, r), fmt.Errorf("durable: rank %d has no complete version of the committed step %d with its marker", r, committed))
		}
	}
	if hasCommit && m != nil {
		for r := range m.World {
			if !slices.Contains(ranks, r) {
				report(rankDir(dir, r), fmt.Errorf("durable: rank %d has no directory, and step %d is committed", r, committed))
			}
		}
	}
	return problems, nil
}

// verifyRank verifies one rank's files and returns the steps of which
// it holds a complete version that verifies and has its marker.
func verifyRank(ctx context.Context, dir string, rank int, want []Region, report func(string, error)) (map[int64]bool, error) {
	rd := rankDir(dir, rank)
	ents, err := os.ReadDir(rd)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	type held struct {
		step    int64
		version uint64
		hdrCRC  uint32
		ok      bool // its data verify
	}
	bases := map[int]held{}
	var markers []string
	for _, e := range ents {
		name := e.Name()
		p := filepath.Join(rd, name)
		if i, ok := parseBase(name); ok {
			h, hb, err := readHeaderPath(p, rank)
			if err != nil {
				report(p, err)
				continue
			}
			if !h.complete() {
				continue
			}
			hd := held{step: h.step, version: h.version, hdrCRC: crc32c.Checksum(hb)}
			if want != nil {
				if err := sameRegions(h.l.regions, want); err != nil {
					report(p, corruptErr(p, regionsOff, int64(regionsOff+regionDescLen*len(h.l.regions)), "the manifest's rank %d: %v", rank, err))
					bases[i] = hd
					continue
				}
			}
			err = verifyBase(ctx, candidate{p, h, hb})
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			if err != nil {
				report(p, err)
			}
			hd.ok = err == nil
			bases[i] = hd
		}
		if _, ok := parseDone(name); ok {
			markers = append(markers, name)
		}
		if a, b, ok := parseDiff(name); ok {
			if err := verifyBatch(rd, rank, batchFile{name, a, b}); err != nil {
				report(p, err)
			}
		}
	}
	names := func(p pointer) bool {
		h, ok := bases[p.file]
		return ok && h.step == p.step && h.version == p.version && h.hdrCRC == p.hdrCRC
	}
	lp := filepath.Join(rd, latestName)
	if b, err := readSmall(lp, ptrSize); err == nil {
		if p, err := parsePointer(b, magicPointer, rank, lp); err != nil {
			report(lp, err)
		} else if !names(p) {
			report(lp, fmt.Errorf("durable: %s names version %d of step %d in base.%d, which no base file holds", lp, p.version, p.step, p.file))
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		report(lp, err)
	}
	good := map[int64]bool{}
	for _, name := range markers {
		step, _ := parseDone(name)
		p := filepath.Join(rd, name)
		mk, err := readMarker(dir, rank, step)
		switch {
		case err != nil:
			report(p, err)
		case !names(mk):
			report(p, fmt.Errorf("durable: %s: the marker names version %d of step %d in base.%d, which no base file holds", p, mk.version, mk.step, mk.file))
		default:
			good[step] = bases[mk.file].ok
		}
	}
	return good, nil
}

// verifyBase checks a complete version's size, chunk table and chunks.
func verifyBase(ctx context.Context, c candidate) error {
	f, err := openRegular(c.path)
	if err != nil {
		return err
	}
	defer f.Close()
	table, err := readTable(f, c)
	if err != nil {
		return err
	}
	return readChunks(ctx, f, c, table, nil)
}
