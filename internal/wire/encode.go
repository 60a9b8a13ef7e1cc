package wire

import (
	"encoding/json"
	"strconv"
)

// Hand-written encoders of the messages sent once or more per rank (Event)
// or per agent at every heartbeat interval (Heartbeat). They produce
// exactly the bytes encoding/json's Marshal produces for the same value
// (encode_test.go compares them over table cases and random values), so the
// wire format is unchanged; they only spare the per-message reflection and
// the first-use construction of encoding/json's encoder for these types,
// which perf showed as most of the control plane's encoding cost at
// -np 16 (issue 22).

// appendHeartbeat appends h's JSON encoding to b.
func appendHeartbeat(b []byte, h *Heartbeat) []byte {
	b = append(b, `{"h":`...)
	b = strconv.AppendInt(b, int64(h.Host), 10)
	b = append(b, `,"s":`...)
	b = strconv.AppendUint(b, h.Seq, 10)
	return append(b, '}')
}

// appendEvent appends e's JSON encoding to b, field by field in Event's
// declaration order, omitting what its omitempty tags omit.
func appendEvent(b []byte, e *Event) []byte {
	b = append(b, `{"k":`...)
	b = appendString(b, string(e.Kind))
	b = appendIntField(b, `,"h":`, int64(e.Host))
	b = appendIntField(b, `,"r":`, int64(e.Rank))
	if e.Pid != 0 {
		b = appendIntField(b, `,"pid":`, int64(e.Pid))
	}
	b = appendIntField(b, `,"code":`, int64(e.Code))
	if e.Signal != 0 {
		b = appendIntField(b, `,"sig":`, int64(e.Signal))
	}
	if e.Stopped {
		b = append(b, `,"stopped":true`...)
	}
	if e.Gen != 0 {
		b = append(b, `,"gen":`...)
		b = strconv.AppendUint(b, e.Gen, 10)
	}
	if e.Abort {
		b = append(b, `,"abort":true`...)
	}
	if e.Msg != "" {
		b = append(b, `,"msg":`...)
		b = appendString(b, e.Msg)
	}
	if e.GPU != nil {
		b = append(b, `,"gpu":`...)
		b = appendGPUReport(b, e.GPU)
	}
	if e.Epoch != 0 {
		b = append(b, `,"epoch":`...)
		b = strconv.AppendUint(b, e.Epoch, 10)
	}
	if e.Peer != 0 {
		b = appendIntField(b, `,"peer":`, int64(e.Peer))
	}
	if len(e.Peers) != 0 {
		b = append(b, `,"peers":`...)
		b = appendInts(b, e.Peers)
	}
	if e.Corrupt != nil {
		b = append(b, `,"corrupt":{"step":`...)
		b = strconv.AppendInt(b, e.Corrupt.Step, 10)
		b = append(b, `,"holders":`...)
		b = appendInts(b, e.Corrupt.Holders) // no omitempty: nil is null
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendGPUReport(b []byte, g *GPUReport) []byte {
	b = appendIntField(b, `{"i":`, int64(g.Index))
	b = append(b, `,"uuid":`...)
	b = appendString(b, g.UUID)
	b = append(b, `,"kind":`...)
	b = appendString(b, g.Kind)
	if g.XID != 0 {
		b = append(b, `,"xid":`...)
		b = strconv.AppendUint(b, g.XID, 10)
	}
	b = append(b, `,"class":`...)
	b = appendString(b, g.Class)
	if len(g.Ranks) != 0 {
		b = append(b, `,"ranks":`...)
		b = appendInts(b, g.Ranks)
	}
	return append(b, '}')
}

func appendIntField(b []byte, key string, v int64) []byte {
	return strconv.AppendInt(append(b, key...), v, 10)
}

// appendInts appends xs as a JSON array, or null if xs is nil (as
// encoding/json does).
func appendInts(b []byte, xs []int) []byte {
	if xs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}

// appendString appends s as a JSON string. A string of printable ASCII
// that encoding/json leaves as it is (no quote, backslash or HTML-escaped
// <, >, &) is copied; any other goes through encoding/json itself, so that
// its escaping (control characters, invalid UTF-8, U+2028, U+2029, HTML
// characters) is encoding/json's by construction.
func appendString(b []byte, s string) []byte {
	if !plainJSONString(s) {
		q, err := json.Marshal(s)
		if err != nil {
			panic("wire: marshal string: " + err.Error()) // a string always encodes
		}
		return append(b, q...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// plainJSONString reports whether encoding/json (HTML escaping on) writes
// s between quotes unchanged.
func plainJSONString(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}
