package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Version is the control-plane protocol version. An agent and a launcher of
// different versions refuse each other at registration.
const Version = 1

// Limits on what a decoder accepts; they bound memory on hostile input.
const (
	MaxWorld     = 1 << 24
	MaxHosts     = 1 << 20
	MaxArgs      = 1 << 16
	MaxStringLen = 1 << 16
	MaxArgBytes  = 8 << 20 // program, arguments and -x variables together
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("wire: malformed message")

func malformed(what string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(what, args...))
}

// decode unmarshals one JSON value from b into v, rejecting unknown fields
// and trailing data.
//
// Field names match case-insensitively and the last of duplicate keys
// wins (encoding/json's rules); every value is validated after decoding.
func decode(b []byte, v any, what string) error {
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return malformed("%s: not a JSON object", what)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrMalformed, what, err)
	}
	if _, err := d.Token(); err != io.EOF {
		return malformed("%s: trailing data", what)
	}
	return nil
}

func checkString(what, s string) error {
	if len(s) > MaxStringLen {
		return malformed("%s longer than %d bytes", what, MaxStringLen)
	}
	return nil
}

// Truncate cuts s to 40 bytes, for quoting a peer's string in an error.
func Truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Heartbeat is sent by every agent at the job's heartbeat interval.
type Heartbeat struct {
	Host int    `json:"h"`
	Seq  uint64 `json:"s"`
}

// DecodeHeartbeat decodes and validates a Heartbeat.
func DecodeHeartbeat(b []byte) (*Heartbeat, error) {
	var h Heartbeat
	if err := decode(b, &h, "heartbeat"); err != nil {
		return nil, err
	}
	if h.Host < 0 || h.Host >= MaxHosts {
		return nil, malformed("heartbeat: host %d out of range", h.Host)
	}
	return &h, nil
}

// Marshal encodes any of the JSON messages of this package. Events and
// heartbeats, the messages sent per rank and per heartbeat interval, go
// through hand-written encoders (encode.go) that produce the same bytes.
func Marshal(v any) []byte {
	switch m := v.(type) {
	case *Event:
		if m != nil {
			return appendEvent(make([]byte, 0, 96), m)
		}
	case *Heartbeat:
		if m != nil {
			return appendHeartbeat(make([]byte, 0, 32), m)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		// Every message type here is plain data; failure is a programming error.
		panic(fmt.Sprintf("wire: marshal %T: %v", v, err))
	}
	return b
}

// stepString is *v in decimal, or "none" if v is nil.
func stepString(v *int64) string {
	if v == nil {
		return "none"
	}
	return strconv.FormatInt(*v, 10)
}
