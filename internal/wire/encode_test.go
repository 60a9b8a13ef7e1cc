package wire_test

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"testing/quick"

	"github.com/gorun/gorun/internal/wire"
)

// sameAsJSON fails t unless wire.Marshal(v) is byte for byte what
// encoding/json's Marshal gives for v.
func sameAsJSON(t *testing.T, v any) {
	t.Helper()
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("json.Marshal(%+v): %v", v, err)
	}
	if got := wire.Marshal(v); !bytes.Equal(got, want) {
		t.Fatalf("Marshal(%+v)\n got %s\nwant %s", v, got, want)
	}
}

// escapes are strings whose JSON encoding is not the string between quotes.
var escapes = []string{
	`"`, `\`, "<b>&amp;</b>", "\x00\x01\x1f\x7f", "\b\f\n\r\t", "\u2028\u2029",
	"\xff\xfe", "\xe2\x28\xa1", "é日本\U0001F600", "a\u00e9\xed\xa0\x80", "}{,:",
}

func TestMarshalEventSameAsJSON(t *testing.T) {
	cases := []wire.Event{
		{},
		validEvent(),
		{Kind: wire.EventStarted, Host: 3, Rank: 17, Pid: 4242},
		{Kind: wire.EventExited, Host: 1, Rank: 2, Code: -1, Signal: 9, Stopped: true, Gen: 7},
		{Kind: wire.EventAbort, Host: 1, Rank: 1, Gen: 3, Code: 7, Abort: true, Msg: "called MPI_Abort"},
		{Kind: wire.EventAgentError, Rank: -1, Msg: "no such file"},
		{Kind: wire.EventEpoch, Host: 1, Rank: -1, Epoch: math.MaxUint64},
		{Kind: wire.EventReplFailed, Host: 1, Rank: -1, Peer: -5},
		{Kind: wire.EventPeerLost, Host: 1, Rank: 2, Peers: []int{3, -4, math.MaxInt, math.MinInt}},
		{Kind: wire.EventPeerLost, Peers: []int{}},
		{Kind: wire.EventGPU, Host: 1, Rank: -1, Msg: "XID 79",
			GPU: &wire.GPUReport{Index: 1, UUID: "GPU-1", Kind: "xid", XID: 79, Class: wire.GPUPermanent, Ranks: []int{1, 3}}},
		{Kind: wire.EventGPU, GPU: &wire.GPUReport{}},
		{Kind: wire.EventGPU, GPU: &wire.GPUReport{Ranks: []int{}}},
		{Kind: wire.EventExited, Corrupt: &wire.CorruptCopies{Step: 12, Holders: []int{0, 5}}},
		{Kind: wire.EventExited, Corrupt: &wire.CorruptCopies{}},
		{Kind: wire.EventExited, Corrupt: &wire.CorruptCopies{Step: -1, Holders: []int{}}},
		{Host: math.MaxInt, Rank: math.MinInt, Pid: math.MinInt, Code: math.MaxInt, Signal: -1},
	}
	for _, s := range escapes {
		cases = append(cases, wire.Event{Kind: wire.EventKind(s), Msg: s,
			GPU: &wire.GPUReport{UUID: s, Kind: s, Class: s}})
	}
	for _, e := range cases {
		sameAsJSON(t, &e)
	}
	sameAsJSON(t, (*wire.Event)(nil))
}

func TestMarshalHeartbeatSameAsJSON(t *testing.T) {
	for _, h := range []wire.Heartbeat{{}, {Host: 3, Seq: 9}, {Host: -1, Seq: math.MaxUint64}, {Host: math.MinInt}} {
		sameAsJSON(t, &h)
	}
	sameAsJSON(t, (*wire.Heartbeat)(nil))
}

// randomString is a short string drawn mostly from bytes that need
// escaping in JSON, some of them not UTF-8.
func randomString(r *rand.Rand) string {
	if r.IntN(4) == 0 {
		return ""
	}
	const pool = "aZ09 -_\"\\<>&\x00\x1f\x7f\b\f\n\r\t\xff\xc3\xa9\xe2\x80\xa8"
	b := make([]byte, r.IntN(12))
	for i := range b {
		b[i] = pool[r.IntN(len(pool))]
	}
	if r.IntN(3) == 0 {
		return escapes[r.IntN(len(escapes))] + string(b)
	}
	return string(b)
}

// randomInts is nil, empty, or a few ints of any sign and size.
func randomInts(r *rand.Rand) []int {
	switch r.IntN(3) {
	case 0:
		return nil
	case 1:
		return []int{}
	}
	xs := make([]int, 1+r.IntN(5))
	for i := range xs {
		xs[i] = randomInt(r)
	}
	return xs
}

func randomInt(r *rand.Rand) int {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return r.IntN(100) - 50
	}
	return int(r.Uint64())
}

func randomUint(r *rand.Rand) uint64 {
	if r.IntN(2) == 0 {
		return 0
	}
	return r.Uint64() >> r.IntN(64)
}

// randomEvent fills every field of an Event, each empty (zero, nil) often
// enough that every omitempty branch is taken both ways.
func randomEvent(r *rand.Rand) wire.Event {
	e := wire.Event{
		Kind: wire.EventKind(randomString(r)), Host: randomInt(r), Rank: randomInt(r), Pid: randomInt(r),
		Code: randomInt(r), Signal: randomInt(r), Stopped: r.IntN(2) == 0, Gen: randomUint(r),
		Abort: r.IntN(2) == 0, Msg: randomString(r), Epoch: randomUint(r), Peer: randomInt(r), Peers: randomInts(r),
	}
	if r.IntN(2) == 0 {
		e.GPU = &wire.GPUReport{Index: randomInt(r), UUID: randomString(r), Kind: randomString(r),
			XID: randomUint(r), Class: randomString(r), Ranks: randomInts(r)}
	}
	if r.IntN(2) == 0 {
		e.Corrupt = &wire.CorruptCopies{Step: int64(randomInt(r)), Holders: randomInts(r)}
	}
	return e
}

func TestMarshalRandomEventSameAsJSON(t *testing.T) {
	same := func(seed uint64) bool {
		r := rand.New(rand.NewPCG(seed, seed>>1))
		e := randomEvent(r)
		want, _ := json.Marshal(&e)
		if got := wire.Marshal(&e); !bytes.Equal(got, want) {
			t.Logf("Marshal(%+v)\n got %s\nwant %s", e, got, want)
			return false
		}
		h := wire.Heartbeat{Host: randomInt(r), Seq: randomUint(r)}
		want, _ = json.Marshal(&h)
		return bytes.Equal(wire.Marshal(&h), want)
	}
	if err := quick.Check(same, &quick.Config{MaxCount: 20000}); err != nil {
		t.Fatal(err)
	}
}

// The decoder takes back what the encoder writes, for every valid event
// of the fuzz seeds' kinds.
func TestMarshalEventDecodes(t *testing.T) {
	e := validEvent()
	got, err := wire.DecodeEvent(wire.Marshal(&e))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, e) {
		t.Fatalf("decoded %+v, sent %+v", *got, e)
	}
}
