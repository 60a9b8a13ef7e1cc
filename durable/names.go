package durable

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/wire"
)

// The directory's names (see the package comment).
const (
	manifestName  = "MANIFEST"
	committedName = "COMMITTED"
	latestName    = "LATEST"
	lockName      = "LOCK"
	basePrefix    = "base."
	donePrefix    = "done."
	diffPrefix    = "diff."
	tmpMark       = ".tmp"
	maxRank       = math.MaxInt32
)

func rankDir(dir string, rank int) string {
	return filepath.Join(dir, "r"+strconv.Itoa(rank))
}

func baseName(i int) string      { return basePrefix + strconv.Itoa(i) }
func doneName(step int64) string { return donePrefix + strconv.FormatInt(step, 10) }
func diffName(a, b int64) string {
	return diffPrefix + strconv.FormatInt(a, 10) + "-" + strconv.FormatInt(b, 10)
}
func validRank(rank int) bool      { return rank >= 0 && rank <= maxRank }
func validStep(step int64) bool    { return step >= 0 }
func isTemp(name string) bool      { return strings.Contains(name, tmpMark) }
func validJob(job string) bool     { return wire.ValidJobID(job) }
func validRegion(name string) bool { return ckpt.ValidRegionName(name) }

// parseDec parses a decimal without sign or leading zeros, 0 to max.
func parseDec(s string, max int64) (int64, bool) {
	if s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v > max {
		return 0, false
	}
	return v, true
}

// parseRankDir returns the rank a directory name r<rank> names.
func parseRankDir(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "r")
	if !ok {
		return 0, false
	}
	v, ok := parseDec(s, maxRank)
	return int(v), ok
}

// parseBase returns i of base.<i>.
func parseBase(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, basePrefix)
	if !ok {
		return 0, false
	}
	v, ok := parseDec(s, 1<<20)
	return int(v), ok
}

// parseDone returns the step of done.<step>.
func parseDone(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, donePrefix)
	if !ok {
		return 0, false
	}
	return parseDec(s, math.MaxInt64)
}

// parseDiff returns a and b of diff.<a>-<b>, a ≤ b.
func parseDiff(name string) (a, b int64, ok bool) {
	s, ok := strings.CutPrefix(name, diffPrefix)
	if !ok {
		return 0, 0, false
	}
	as, bs, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, false
	}
	a, ok1 := parseDec(as, math.MaxInt64)
	b, ok2 := parseDec(bs, math.MaxInt64)
	if !ok1 || !ok2 || a > b {
		return 0, 0, false
	}
	return a, b, true
}

// checkRegions checks a rank's regions: 1 to MaxRegions, valid unique
// names, sizes 0 to MaxRegionSize.
func checkRegions(regions []Region) error {
	if len(regions) < 1 || len(regions) > MaxRegions {
		return fmt.Errorf("durable: %d regions, want 1 to %d", len(regions), MaxRegions)
	}
	for i, r := range regions {
		if !validRegion(r.Name) {
			return fmt.Errorf("durable: region %d: bad name %q", i, r.Name)
		}
		if r.Size < 0 || r.Size > MaxRegionSize {
			return fmt.Errorf("durable: region %q: size %d, want 0 to %d", r.Name, r.Size, int64(MaxRegionSize))
		}
		if slices.ContainsFunc(regions[:i], func(o Region) bool { return o.Name == r.Name }) {
			return fmt.Errorf("durable: region %q listed twice", r.Name)
		}
	}
	return nil
}

// syncDir fsyncs a directory, making the names in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("durable: syncing directory %s: %w", dir, err)
	}
	return nil
}

// tempName returns a temporary name for the file name: name, ".tmp" and
// random characters.
func tempName(name string) string {
	var b [6]byte
	rand.Read(b[:])
	return name + tmpMark + hex.EncodeToString(b[:])
}

// writeAtomic replaces dir/name with the concatenation of data: a temporary file in dir,
// written, fsynced, renamed over name, then dir fsynced. A crash leaves
// the old file or the new one. fault, if not nil, is consulted before each
// step (tests).
func writeAtomic(dir, name string, data [][]byte, fault func(op string) error) (err error) {
	tmp := filepath.Join(dir, tempName(name))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	step := func(op string, do func() error) error {
		if fault != nil {
			if err := fault(op); err != nil {
				return err
			}
		}
		return do()
	}
	err = step("write", func() error {
		for _, d := range data {
			if _, err := f.Write(d); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = step("sync", f.Sync)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = step("rename", func() error { return os.Rename(tmp, filepath.Join(dir, name)) })
	}
	if err != nil {
		return fmt.Errorf("durable: writing %s: %w", filepath.Join(dir, name), err)
	}
	if fault != nil {
		if err := fault("syncdir"); err != nil {
			return fmt.Errorf("durable: writing %s: %w", filepath.Join(dir, name), err)
		}
	}
	return syncDir(dir)
}

// removeSynced removes dir/names (missing ones are fine) and fsyncs dir.
func removeSynced(dir string, names ...string) error {
	var errs []error
	for _, n := range names {
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("durable: %w", err))
		}
	}
	if len(names) > 0 {
		if err := syncDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// readSmall reads a file of at most max bytes, without following a
// symbolic link; a larger file is an error wrapping ErrCorrupt.
func readSmall(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, corruptErr(path, 0, 0, "not a regular file (%v)", fi.Mode().Type())
	}
	if fi.Size() > max {
		return nil, corruptErr(path, max, fi.Size(), "%d bytes, at most %d expected", fi.Size(), max)
	}
	b := make([]byte, fi.Size())
	n, err := f.ReadAt(b, 0)
	if n < len(b) {
		if err == nil {
			err = fmt.Errorf("short read")
		}
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return b, nil
}
