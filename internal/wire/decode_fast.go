package wire

import "math"

// A fast path for decoding events, the messages the launcher receives once
// or more per rank. decodeEventFast accepts only the canonical form that
// appendEvent writes for an event without GPU report or corrupt copies:
// no whitespace, lower-case keys in Event's declaration order, each at most
// once, printable-ASCII strings without escapes, integers in JSON's
// grammar that fit their field. On that subset encoding/json yields the
// same value (FuzzDecodeEventFast compares the two); on anything else
// decodeEventFast declines and DecodeEvent falls back to encoding/json, so
// what is accepted and rejected, and the errors, are unchanged. Validation
// is DecodeEvent's either way.

// eventScanner reads one canonical event; its methods report false when
// the input leaves the canonical form.
type eventScanner struct {
	b []byte
	i int
}

// lit consumes s if the input continues with it.
func (s *eventScanner) lit(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

// number consumes a JSON number of integer form (-?(0|[1-9][0-9]*))
// whose magnitude fits in a uint64.
func (s *eventScanner) number() (neg bool, mag uint64, ok bool) {
	if s.i < len(s.b) && s.b[s.i] == '-' {
		neg = true
		s.i++
	}
	start := s.i
	for ; s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9'; s.i++ {
		d := uint64(s.b[s.i] - '0')
		if mag > (math.MaxUint64-d)/10 {
			return false, 0, false
		}
		mag = mag*10 + d
	}
	n := s.i - start
	return neg, mag, n > 0 && (n == 1 || s.b[start] != '0')
}

// int consumes an integer that fits an int.
func (s *eventScanner) int() (int, bool) {
	neg, mag, ok := s.number()
	switch {
	case !ok:
		return 0, false
	case neg && mag <= -math.MinInt:
		return int(-mag), true // two's complement: -MinInt's magnitude wraps to MinInt
	case !neg && mag <= math.MaxInt:
		return int(mag), true
	}
	return 0, false
}

// uint consumes a non-negative integer.
func (s *eventScanner) uint() (uint64, bool) {
	neg, mag, ok := s.number()
	return mag, ok && !neg
}

func (s *eventScanner) bool() (bool, bool) {
	if s.lit("true") {
		return true, true
	}
	return false, s.lit("false")
}

// string consumes a string of printable ASCII without escapes.
func (s *eventScanner) string() (string, bool) {
	if !s.lit(`"`) {
		return "", false
	}
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			v := string(s.b[start:s.i])
			s.i++
			return v, true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return "", false
		}
	}
	return "", false
}

// kind consumes a string naming one of the event kinds, returning the
// package's constant (no allocation); another string is left to
// encoding/json.
func (s *eventScanner) kind() (EventKind, bool) {
	start := s.i
	if !s.lit(`"`) {
		return "", false
	}
	for s.i < len(s.b) && s.b[s.i] != '"' {
		s.i++
	}
	if s.i == len(s.b) {
		return "", false
	}
	name := s.b[start+1 : s.i]
	s.i++
	for _, k := range eventKinds {
		if string(name) == string(k) {
			return k, true
		}
	}
	return "", false
}

// eventKinds are the kinds the fast path knows.
var eventKinds = [...]EventKind{EventStarted, EventExited, EventAgentError, EventAgentDone,
	EventGPU, EventEpoch, EventReplFailed, EventPeerLost, EventAbort}

func (s *eventScanner) ints() ([]int, bool) {
	if !s.lit("[") || s.lit("]") {
		return nil, false // an empty list is left to encoding/json
	}
	var xs []int
	for {
		x, ok := s.int()
		if !ok || len(xs) == MaxPeers {
			return nil, false
		}
		xs = append(xs, x)
		if s.lit("]") {
			return xs, true
		}
		if !s.lit(",") {
			return nil, false
		}
	}
}

// decodeEventFast decodes b if it is a canonical event (see above);
// ok false says only that b is not, not that it is malformed.
func decodeEventFast(b []byte) (e Event, ok bool) {
	s := eventScanner{b: b}
	if !s.lit(`{"k":`) {
		return e, false
	}
	if e.Kind, ok = s.kind(); !ok {
		return e, false
	}
	if !s.lit(`,"h":`) {
		return e, false
	}
	if e.Host, ok = s.int(); !ok || !s.lit(`,"r":`) {
		return e, false
	}
	if e.Rank, ok = s.int(); !ok {
		return e, false
	}
	if s.lit(`,"pid":`) {
		if e.Pid, ok = s.int(); !ok {
			return e, false
		}
	}
	if !s.lit(`,"code":`) {
		return e, false
	}
	if e.Code, ok = s.int(); !ok {
		return e, false
	}
	return e, s.optional(&e) && s.i == len(s.b)
}

// optional reads the fields after "code", each optional, in order, and
// the closing brace.
func (s *eventScanner) optional(e *Event) (ok bool) {
	if s.lit(`,"sig":`) {
		if e.Signal, ok = s.int(); !ok {
			return false
		}
	}
	if s.lit(`,"stopped":`) {
		if e.Stopped, ok = s.bool(); !ok {
			return false
		}
	}
	if s.lit(`,"gen":`) {
		if e.Gen, ok = s.uint(); !ok {
			return false
		}
	}
	if s.lit(`,"abort":`) {
		if e.Abort, ok = s.bool(); !ok {
			return false
		}
	}
	if s.lit(`,"msg":`) {
		if e.Msg, ok = s.string(); !ok {
			return false
		}
	}
	if s.lit(`,"epoch":`) {
		if e.Epoch, ok = s.uint(); !ok {
			return false
		}
	}
	if s.lit(`,"peer":`) {
		if e.Peer, ok = s.int(); !ok {
			return false
		}
	}
	if s.lit(`,"peers":`) {
		if e.Peers, ok = s.ints(); !ok {
			return false
		}
	}
	return s.lit("}")
}
