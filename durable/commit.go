package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"sync"
	"time"
)

// Markers reports, for each rank 0 to world-1, whether it has a valid
// completion marker for step. A missing marker is false; so is one that
// does not verify (it is not an error: the rank has not durably written
// step as far as the launcher can tell).
func Markers(dir string, world int, step int64) ([]bool, error) {
	if world < 1 || world > MaxWorld || !validStep(step) {
		return nil, fmt.Errorf("durable: bad world size %d or step %d", world, step)
	}
	have := make([]bool, world)
	for r := range world {
		_, err := readMarker(dir, r, step)
		have[r] = err == nil
	}
	return have, nil
}

// readMarker reads and checks rank's marker of step.
func readMarker(dir string, rank int, step int64) (pointer, error) {
	p := filepath.Join(rankDir(dir, rank), doneName(step))
	b, err := readSmall(p, ptrSize)
	if err != nil {
		return pointer{}, err
	}
	m, err := parsePointer(b, magicMarker, rank, p)
	if err == nil && m.step != step {
		err = corruptErr(p, 16, 24, "step %d, the name says %d", m.step, step)
	}
	return m, err
}

// commitMu serializes this process's Commits.
var commitMu sync.Mutex

// Commit writes the commit record for step, if it is after the recorded
// one (else it does nothing and returns nil). The caller must have seen
// every rank's marker for step. A record that does not verify is
// replaced.
func Commit(dir string, step int64) error {
	if !validStep(step) {
		return fmt.Errorf("durable: bad step %d", step)
	}
	commitMu.Lock()
	defer commitMu.Unlock()
	have, err := ReadCommitted(dir)
	switch {
	case err == nil && have >= step:
		return nil
	case err != nil && !errors.Is(err, ErrNotCommitted) && !errors.Is(err, ErrCorrupt):
		return err
	}
	return writeAtomic(dir, committedName, [][]byte{encodeCommit(step)}, nil)
}

// ReadCommitted returns the commit record's step. No record is an error
// wrapping ErrNotCommitted, a bad one an error wrapping ErrCorrupt.
func ReadCommitted(dir string) (int64, error) {
	p := filepath.Join(dir, committedName)
	b, err := readSmall(p, commitSize)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%w in %s", ErrNotCommitted, dir)
	}
	if err != nil {
		return 0, err
	}
	return parseCommit(b, p)
}

// DefaultConcurrency returns N, the number of saves to allow in flight,
// from PCcheck's Eq. (2)/(3): with a base every `every` steps of
// stepTime t each, and writeTime T_w to write one, training stalls less
// than a fraction overhead of the time (0.03 for 3%) when
//
//	T_w / (N · every · t) ≤ q,  q = 1 + overhead
//
// (the paper's q is a slowdown factor, runtime ≤ q·runtime₀), so N is
// ceil(T_w / (q · every · t)), at least 1 and at most MaxConcurrency.
// Nonpositive or unknown inputs give 1.
func DefaultConcurrency(writeTime, stepTime time.Duration, every int, overhead float64) int {
	if writeTime <= 0 || stepTime <= 0 || every < 1 || !(overhead >= 0) || math.IsInf(overhead, 0) {
		return 1
	}
	q := 1 + overhead
	n := math.Ceil(float64(writeTime) / (q * float64(every) * float64(stepTime)))
	switch {
	case n < 1:
		return 1
	case n > MaxConcurrency:
		return MaxConcurrency
	}
	return int(n)
}
