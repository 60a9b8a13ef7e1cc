package events

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sync"
	"time"
)

// Writer writes records to an events file, each line whole in one
// Write. It is safe for concurrent use. After the first error writing,
// Write returns it and writes nothing more.
type Writer struct {
	mu  sync.Mutex // guards w and err
	w   io.Writer
	err error
}

// NewWriter returns a Writer writing to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes e as a record at t since the job started.
func (w *Writer) Write(t time.Duration, e Event) error {
	line, err := Marshal(Seconds(t), e)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if _, err := w.w.Write(line); err != nil {
		w.err = fmt.Errorf("events: %w", err)
	}
	return w.err
}

// Err returns the first error writing, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Marshal returns e's line (newline included) at t seconds: "t" and
// "event" first, then e's fields.
func Marshal(t float64, e Event) ([]byte, error) {
	if math.IsNaN(t) || math.IsInf(t, 0) {
		return nil, fmt.Errorf("events: time %v", t)
	}
	if u, ok := e.(Unknown); ok {
		return append(append([]byte(nil), u.Line...), '\n'), nil
	}
	fields, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("events: %s: %w", e.Kind(), err)
	}
	head, err := json.Marshal(struct {
		T     float64 `json:"t"`
		Event string  `json:"event"`
	}{t, e.Kind()})
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	line := head[:len(head)-1]
	if len(fields) > 2 { // not {}
		line = append(append(line, ','), fields[1:]...)
	} else {
		line = append(line, '}')
	}
	return append(line, '\n'), nil
}

// Seconds is d in seconds, to the microsecond, as records carry times.
func Seconds(d time.Duration) float64 { return float64(d.Microseconds()) / 1e6 }
