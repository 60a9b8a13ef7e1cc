package durable

import (
	"errors"
	"fmt"
)

var (
	// ErrMismatch is wrapped by CheckManifest's error when the directory
	// holds another job, world size or layout than the caller expects;
	// the error names the first field that differs.
	ErrMismatch = errors.New("durable: the checkpoint directory holds another job or layout")
	// ErrCorrupt is wrapped by the errors about files whose contents do
	// not verify: a header, pointer, marker, commit record, batch or
	// chunk whose CRC32C or fields are wrong, or a file of the wrong
	// size. The error names the file and the first bad byte range.
	ErrCorrupt = errors.New("durable: corrupt file")
	// ErrNoVersion is wrapped by Load's error when no base file of the
	// rank holds a complete version of the step asked for.
	ErrNoVersion = errors.New("durable: no complete version of that step")
	// ErrBusy is wrapped by Save's error when Concurrency saves are in
	// flight already or no base file is free: the caller counts the step
	// as one the durable tier fell behind on.
	ErrBusy = errors.New("durable: every base file is in use")
	// ErrNotCommitted is wrapped by ReadCommitted's error when the
	// directory has no commit record: no version may be used to resume.
	ErrNotCommitted = errors.New("durable: no committed version")
	// ErrNoManifest is wrapped by ReadManifest's and CheckManifest's
	// errors when the directory has no manifest (no job ever started
	// there).
	ErrNoManifest = errors.New("durable: no manifest")
	// ErrGap is wrapped by ScanBatches' stop error when the next batch
	// after the records handed over does not begin where they end.
	ErrGap = errors.New("durable: gap in the differential log")
	// ErrClosed is returned by the methods of a closed Store.
	ErrClosed = errors.New("durable: store closed")
	// ErrLocked is wrapped by Open's error when another Store (in this
	// process or another, on this host or another sharing the
	// directory) has the rank open: one writer per rank at a time.
	ErrLocked = errors.New("durable: the rank's store is open elsewhere")
)

// corruptErr returns an error wrapping ErrCorrupt about path's bytes
// [off, end).
func corruptErr(path string, off, end int64, format string, args ...any) error {
	return &CorruptError{Path: path, Off: off, End: end, Msg: fmt.Sprintf(format, args...)}
}

// CorruptError is the error about a file's bad bytes: the file, the
// first bad byte range [Off, End) and what is wrong. It wraps
// ErrCorrupt. A file shorter than it should be has Off at its size and
// End where it should end.
type CorruptError struct {
	Path     string
	Off, End int64
	Msg      string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("durable: %s: bytes [%d, %d): %s", e.Path, e.Off, e.End, e.Msg)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }
