package events

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// MaxLine is the longest line a Reader takes: far above a sample of
// 10,000 hosts.
const MaxLine = 16 << 20

// ErrSyntax is what every malformed line's error wraps.
var ErrSyntax = errors.New("events: malformed line")

// ErrTruncated is the error of a file whose last line has no newline and
// does not decode: the file is being written, or was cut short (a full
// disk). The records before it are whole; a reader may use them, with a
// warning.
var ErrTruncated = errors.New("events: the last line is cut short")

// ErrSchema is a file this package cannot read: its launch record names a
// newer schema than SchemaVersion, or none (CheckSchema).
var ErrSchema = errors.New("events: schema")

// LineError is a malformed line: its number (from 1) and what is wrong.
type LineError struct {
	Line int
	Msg  string
	Err  error
}

func (e *LineError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("events: line %d: %s: %v", e.Line, e.Msg, e.Err)
	}
	return fmt.Sprintf("events: line %d: %s", e.Line, e.Msg)
}

// Unwrap returns ErrSyntax and the cause, if any.
func (e *LineError) Unwrap() []error { return []error{ErrSyntax, e.Err} }

// Reader decodes an events file record by record. It is strict: a line
// that is not one JSON object with a number "t" (finite, not negative)
// and a non-empty string "event", or whose known kind's fields have the
// wrong types, is a *LineError. It is tolerant of what newer writers
// add: unknown fields are ignored and unknown kinds read as Unknown.
// Empty lines are skipped.
//
// A last line with no newline that does not decode is the end of a file
// cut short, not a malformed line: Next returns an error wrapping
// ErrTruncated (and its line number, a *LineError) for it; every other
// line is held to the rules above.
type Reader struct {
	r    *bufio.Reader
	line int
	// partial: the line read last had no newline (the end of the file).
	partial bool
}

// NewReader returns a Reader of r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next record, or io.EOF after the last.
func (r *Reader) Next() (Record, error) {
	for {
		b, err := r.readLine()
		if err != nil {
			return Record{}, err
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		rec, err := Decode(r.line, b)
		if err != nil && r.partial {
			le, _ := errors.AsType[*LineError](err)
			return Record{}, &LineError{Line: r.line, Msg: fmt.Sprintf("cut short (%d bytes and no newline at the end of the file: it is being written, or was cut short)", len(b)), Err: truncated{le}}
		}
		return rec, err
	}
}

func (r *Reader) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := r.r.ReadSlice('\n')
		if len(line)+len(frag) > MaxLine {
			return nil, &LineError{Line: r.line + 1, Msg: fmt.Sprintf("longer than %d bytes", MaxLine)}
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			r.line++
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			r.line++
			r.partial = true
			return line, nil
		case errors.Is(err, io.EOF):
			return nil, io.EOF
		default:
			return nil, fmt.Errorf("events: reading line %d: %w", r.line+1, err)
		}
	}
}

// truncated is the cause of a cut-short last line: ErrTruncated, and what
// decoding it said.
type truncated struct{ cause *LineError }

func (t truncated) Error() string {
	switch {
	case t.cause == nil:
		return ErrTruncated.Error()
	case t.cause.Err != nil:
		return t.cause.Msg + ": " + t.cause.Err.Error()
	}
	return t.cause.Msg
}

func (t truncated) Unwrap() error { return ErrTruncated }

// ReadAll reads every record of r. At an error it returns the records
// before it with the error: with ErrTruncated (a cut-short last line)
// they are the whole file but that line.
func ReadAll(r io.Reader) ([]Record, error) {
	rd := NewReader(r)
	var out []Record
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, rec)
	}
}

// CheckSchema checks that recs start with a launch record of a schema
// this package reads: an error wrapping ErrSchema if its schema is newer
// than SchemaVersion or missing (0, or no launch record first).
func CheckSchema(recs []Record) error {
	if len(recs) == 0 {
		return fmt.Errorf("%w: no launch record, so no schema version", ErrSchema)
	}
	l, ok := recs[0].Event.(Launch)
	switch {
	case !ok:
		return fmt.Errorf("%w: the first record is %q, not a launch record with the schema version", ErrSchema, recs[0].Event.Kind())
	case l.Schema <= 0:
		return fmt.Errorf("%w: the launch record has no schema version", ErrSchema)
	case l.Schema > SchemaVersion:
		return fmt.Errorf("%w: version %d is newer than this gorun reads (%d): use a newer gorun", ErrSchema, l.Schema, SchemaVersion)
	}
	return nil
}

// Decode decodes one line, numbered n for its errors.
func Decode(n int, line []byte) (Record, error) {
	var head struct {
		T     *json.RawMessage `json:"t"`
		Event *json.RawMessage `json:"event"`
	}
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return Record{}, &LineError{Line: n, Msg: "not a JSON object"}
	}
	if err := json.Unmarshal(line, &head); err != nil {
		return Record{}, &LineError{Line: n, Msg: "not a JSON object", Err: err}
	}
	if head.T == nil {
		return Record{}, &LineError{Line: n, Msg: `no "t"`}
	}
	var t float64
	if err := json.Unmarshal(*head.T, &t); err != nil {
		return Record{}, &LineError{Line: n, Msg: `"t" is not a number`}
	}
	if t < 0 || math.IsInf(t, 0) || math.IsNaN(t) {
		return Record{}, &LineError{Line: n, Msg: fmt.Sprintf(`"t" is %v, want seconds since the start`, t)}
	}
	if head.Event == nil {
		return Record{}, &LineError{Line: n, Msg: `no "event"`}
	}
	var kind string
	if err := json.Unmarshal(*head.Event, &kind); err != nil || kind == "" {
		return Record{}, &LineError{Line: n, Msg: `"event" is not a kind's name`}
	}
	if isStage(kind) {
		s := &Stage{}
		if err := json.Unmarshal(line, s); err != nil {
			return Record{}, fieldError(n, kind, err)
		}
		s.Name = kind
		return Record{T: t, Event: *s}, nil
	}
	mk, ok := decoders[kind]
	if !ok {
		return Record{T: t, Event: Unknown{Name: kind, Line: bytes.Clone(line)}}, nil
	}
	e := mk()
	if err := json.Unmarshal(line, e); err != nil {
		return Record{}, fieldError(n, kind, err)
	}
	return Record{T: t, Event: deref(e)}, nil
}

func fieldError(n int, kind string, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return &LineError{Line: n, Msg: fmt.Sprintf("%s: field %q is %s, want %s", kind, te.Field, te.Value, te.Type)}
	}
	return &LineError{Line: n, Msg: kind, Err: err}
}

// deref returns the value e points to, as records hold bodies by value.
func deref(e Event) Event {
	switch v := e.(type) {
	case *Launch:
		return *v
	case *Rendezvous:
		return *v
	case *Sample:
		return *v
	case *Failure:
		return *v
	case *Fence:
		return *v
	case *Splice:
		return *v
	case *Restart:
		return *v
	case *Publish:
		return *v
	case *UnderProtected:
		return *v
	case *Protected:
		return *v
	case *Abort:
		return *v
	case *Timeline:
		return *v
	case *Exit:
		return *v
	}
	return e
}
