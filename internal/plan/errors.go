package plan

import (
	"errors"
	"fmt"
)

// ErrInput is wrapped by every error about the inputs of a plan: a value
// out of range, a unit not known, a contradiction.
var ErrInput = errors.New("plan: bad input")

// ErrTrace is wrapped by every error about a failure trace file.
var ErrTrace = errors.New("plan: bad failure trace")

// TraceError is a bad line of a failure trace.
type TraceError struct {
	Line int    // 1-based
	Msg  string // what is wrong with it
	Err  error  // the parse error underneath, if any
}

func (e *TraceError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("line %d: %s: %v", e.Line, e.Msg, e.Err)
	}
	return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
}

// Unwrap returns ErrTrace and the parse error underneath.
func (e *TraceError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrTrace, e.Err}
	}
	return []error{ErrTrace}
}

func inputf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInput}, args...)...)
}

// FieldError is an error about one field of [Inputs] (or of [Plan]'s
// other arguments: "Runs", "SpareRisk"), so that a caller can name its own
// flag for it. It wraps [ErrInput] and the error underneath, if any.
type FieldError struct {
	Field string // the Inputs field, e.g. "Hosts"
	Msg   string // what is wrong, without the field's name: "must be 1 to 1048576, not 0"
	Err   error
}

func (e *FieldError) Error() string { return ErrInput.Error() + ": " + e.Field + " " + e.Msg }

// Unwrap returns ErrInput and the error underneath.
func (e *FieldError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInput, e.Err}
	}
	return []error{ErrInput}
}

func fieldf(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}
