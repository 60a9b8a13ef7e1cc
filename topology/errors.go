package topology

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap one of these, so
// callers can classify them with [errors.Is].
var (
	// ErrSyntax: a hostfile line or host list entry is malformed (unknown
	// or duplicate key, empty value, slots given twice, ...).
	ErrSyntax = errors.New("topology: syntax error")
	// ErrBadValue: a number is out of range or inconsistent (slots=0,
	// max_slots below slots, a Host with no slots).
	ErrBadValue = errors.New("topology: bad value")
	// ErrBadHostName: a host name or address is not valid.
	ErrBadHostName = errors.New("topology: bad host name")
	// ErrBadNodeList: a Slurm node list bracket expression is malformed.
	ErrBadNodeList = errors.New("topology: bad node list")
	// ErrConflict: one host is given conflicting attributes on two lines.
	ErrConflict = errors.New("topology: conflicting host definitions")
	// ErrTooLarge: input exceeds a size limit (line length, host count).
	ErrTooLarge = errors.New("topology: input too large")
	// ErrNoHosts: a hostfile or host list names no hosts.
	ErrNoHosts = errors.New("topology: no hosts")
	// ErrNoSlots: there is no non-spare host to place ranks on.
	ErrNoSlots = errors.New("topology: no slots")
	// ErrTooManyRanks: more ranks were requested than the hosts allow.
	ErrTooManyRanks = errors.New("topology: too many ranks")
	// ErrBadMapBy: an unknown mapping policy.
	ErrBadMapBy = errors.New("topology: unknown mapping policy")
	// ErrBadNP: the number of ranks is below 1 or above the supported maximum.
	ErrBadNP = errors.New("topology: bad number of ranks")
)

// HostfileError reports a bad hostfile line. Err is the cause: one of the
// sentinels above, or an I/O error.
type HostfileError struct {
	File string // the file name given to ParseHostfile, or the path given to ReadHostfile
	Line int    // 1-based line number; 0 means the file as a whole
	Msg  string // what is wrong, for people
	Err  error  // the cause, for errors.Is and errors.As
}

// Error returns "hostfile FILE:LINE: MSG", or "hostfile FILE: MSG" when
// Line is 0.
func (e *HostfileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("hostfile %s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("hostfile %s: %s", e.File, e.Msg)
}

// Unwrap returns the cause.
func (e *HostfileError) Unwrap() error { return e.Err }

// detailError is a parse failure with a message for people and a sentinel
// for errors.Is. Its text does not repeat the sentinel's.
type detailError struct {
	msg  string
	kind error
}

func (e *detailError) Error() string { return e.msg }
func (e *detailError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &detailError{msg: fmt.Sprintf(format, args...), kind: kind}
}

// shorten quotes s for an error message, cutting very long input.
func shorten(s string) string {
	const limit = 80
	if len(s) > limit {
		return fmt.Sprintf("%q...", s[:limit])
	}
	return fmt.Sprintf("%q", s)
}
