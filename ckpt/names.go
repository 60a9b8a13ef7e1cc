package ckpt

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultDir is where the slots' files live when Options.Dir is empty.
const DefaultDir = "/dev/shm"

const (
	maxJobLen  = 64
	maxNameLen = 32
	maxRank    = math.MaxInt32
	filePrefix = "gorun-"
	hdrRegion  = "hdr" // the header file's suffix, which no region may be named
	hdrSuffix  = "." + hdrRegion
)

// Options are the settings of Create and Open. The zero value is valid:
// files in /dev/shm.
type Options struct {
	// Dir is the directory of the files; "" means /dev/shm. Tests and
	// machines without /dev/shm set it; it should be on tmpfs, since
	// the files are written every step.
	Dir string
}

func (o Options) dir() string {
	if o.Dir == "" {
		return DefaultDir
	}
	return o.Dir
}

// validJob reports whether job is a job id ckpt accepts: 1 to 64
// characters of [a-z0-9-], not starting with '-'. These are exactly the
// ids internal/wire.ValidJobID accepts (ckpt may not import it, so the
// rule is copied; keep the two the same). They never contain '.', which
// the file names use to end the job id.
func validJob(job string) bool {
	if job == "" || len(job) > maxJobLen || job[0] == '-' {
		return false
	}
	for _, c := range []byte(job) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// validName reports whether name is a valid region name:
// [a-z][a-z0-9_-]{0,31}, other than "hdr" (whose data file would have
// the header file's name).
func validName(name string) bool {
	if name == "" || len(name) > maxNameLen || name[0] < 'a' || name[0] > 'z' || name == hdrRegion {
		return false
	}
	for _, c := range []byte(name[1:]) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ValidRegionName reports whether name can name a region:
// [a-z][a-z0-9_-]{0,31}, other than "hdr".
func ValidRegionName(name string) bool { return validName(name) }

// MaxRegionName is the longest region name.
const MaxRegionName = maxNameLen

// RegionPath is the path of the data file of rank's region of job in
// opt's directory: the file Files names, and RemoveJob removes. Other
// files a rank's service keeps beside its slots (a gradient buffer) are
// named this way too, so that they go with the job's.
func RegionPath(job string, rank int, region string, opt Options) string {
	return filepath.Join(opt.dir(), dataName(job, rank, region))
}

// checkIDs checks a job id and a rank given by the caller.
func checkIDs(job string, rank int) error {
	if !validJob(job) {
		return fmt.Errorf("ckpt: invalid job id %q (want 1 to %d characters of [a-z0-9-], not starting with '-')", job, maxJobLen)
	}
	if rank < 0 || rank > maxRank {
		return fmt.Errorf("ckpt: invalid rank %d", rank)
	}
	return nil
}

// hdrName and dataName are the names of a rank's files:
// gorun-<job>.r<rank>.hdr and gorun-<job>.r<rank>.<region>. Job ids
// cannot contain '.', so "gorun-<job>." starts the names of job's files
// only.
func hdrName(job string, rank int) string {
	return filePrefix + job + ".r" + strconv.Itoa(rank) + hdrSuffix
}

func dataName(job string, rank int, region string) string {
	return filePrefix + job + ".r" + strconv.Itoa(rank) + "." + region
}

// parseName reports whether name is one of job's files, and whose: the
// rank, and the region ("" for the header file).
func parseName(name, job string) (rank int, region string, ok bool) {
	rest, ok := strings.CutPrefix(name, filePrefix+job+".r")
	if !ok {
		return 0, "", false
	}
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n > 10 || (n > 1 && rest[0] == '0') {
		return 0, "", false
	}
	r, err := strconv.ParseInt(rest[:n], 10, 64)
	if err != nil || r > maxRank {
		return 0, "", false
	}
	switch rest = rest[n:]; {
	case rest == hdrSuffix:
		return int(r), "", true
	case len(rest) > 1 && rest[0] == '.' && validName(rest[1:]):
		return int(r), rest[1:], true
	}
	return 0, "", false
}

// Remove removes the files of one rank's slots: its header file and the
// data files of every region, whatever the layout says (it does not read
// it). Only regular files named as ckpt names them are removed; having
// none is not an error. Processes that have the files mapped keep their
// memory until they unmap it.
func Remove(job string, rank int, opt Options) error {
	if err := checkIDs(job, rank); err != nil {
		return err
	}
	return removeFiles(opt.dir(), job, func(r int) bool { return r == rank })
}

// RemoveJob removes the files of every rank of job in opt's directory (the
// agent calls it when the job ends): the regular files named
// gorun-<job>.r<rank>.hdr or gorun-<job>.r<rank>.<region> exactly, and no
// others (not another job's, even one whose id starts with job's, not
// files that merely share the prefix).
func RemoveJob(job string, opt Options) error {
	if err := checkIDs(job, 0); err != nil {
		return err
	}
	return removeFiles(opt.dir(), job, func(int) bool { return true })
}

// removeFiles removes the regular files of job in dir whose rank passes
// keep.
func removeFiles(dir, job string, match func(rank int) bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	var errs []error
	for _, e := range entries {
		r, _, ok := parseName(e.Name(), job)
		if !ok || !match(r) || !e.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("ckpt: %w", err))
		}
	}
	return errors.Join(errs...)
}
