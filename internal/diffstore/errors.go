package diffstore

import (
	"errors"
	"fmt"
)

// Errors of a Store. Match them with errors.Is: every error a Store or a
// BaseWriter returns about its input wraps one of them.
var (
	// ErrGap reports a differential that is not the next step the store
	// expects (a step lost, repeated or out of order), or that has no base
	// or refresh in progress to apply to.
	ErrGap = errors.New("diffstore: differential out of sequence")
	// ErrCorrupt reports bytes that do not verify: a record that does not
	// decode (its CRC32C, its layout), or a base whose regions' CRC32C
	// differ from the owner's.
	ErrCorrupt = errors.New("diffstore: corrupt data")
	// ErrMismatch reports input that decodes but does not fit the owner's
	// declared layout: a record's tensor count or length, its step, the
	// other regions' names or sizes, bad or non-consecutive
	// hyper-parameters, a destination of the wrong shape.
	ErrMismatch = errors.New("diffstore: does not fit the owner's layout")
	// ErrNotHeld reports a step outside the range the store can restore.
	ErrNotHeld = errors.New("diffstore: step not held")
	// ErrStale reports a base refresh that is no longer current (aborted,
	// superseded by a newer BeginBase, already committed, or cut off by
	// Truncate), or that is older than the store's base.
	ErrStale = errors.New("diffstore: stale base refresh")
)

// wrapf returns an error wrapping sentinel, with the message after it.
func wrapf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}
