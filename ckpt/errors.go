package ckpt

import (
	"errors"
	"fmt"
)

var (
	// ErrEmpty is returned by Newest when no step was ever committed.
	ErrEmpty = errors.New("ckpt: no committed step")
	// ErrNoStep is returned by At when neither slot holds the step
	// asked for, committed.
	ErrNoStep = errors.New("ckpt: step not held")
	// ErrCorrupt is wrapped by the errors about slots whose contents do
	// not verify (a region's CRC32C, the slot header's CRC or fields).
	ErrCorrupt = errors.New("ckpt: corrupt slot")
	// ErrLayout is wrapped by the errors about files that do not hold
	// the layout they should: a bad header file, regions other than the
	// caller's, data files of the wrong size or kind.
	ErrLayout = errors.New("ckpt: bad layout")
	// ErrOutrun is wrapped by Newest's error when the writer overwrote
	// the slot being read on every one of its tries: a writer faster
	// than the reader, which gorun's overwrite rule does not allow (a
	// slot is overwritten only once the step after it is replicated).
	// Nothing is wrong with the slots: reading again may succeed.
	ErrOutrun = errors.New("ckpt: the writer outran the reader")

	// ErrNamesBusy is wrapped by Claim.Names's error when another
	// process held the rank's names lock for NamesWait: fn did not run.
	ErrNamesBusy = errors.New("ckpt: another process keeps holding a rank's names lock")
	// ErrNoNamesLock is wrapped by Claim.Names's error when the kernel or
	// the file system cannot take the names lock: fn ran without it.
	ErrNoNamesLock = errors.New("ckpt: cannot lock a rank's names")

	errClosed = errors.New("ckpt: slots closed")
)

// layoutErr returns an error wrapping ErrLayout.
func layoutErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrLayout}, args...)...)
}

// corruptErr returns an error wrapping ErrCorrupt.
func corruptErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}
