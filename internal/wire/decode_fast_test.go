package wire

import (
	"reflect"
	"testing"
)

// canonicalEvents are events as agents send them, which the fast path
// must take.
var canonicalEvents = []Event{
	{Kind: EventStarted, Host: 3, Rank: 17, Pid: 4242},
	{Kind: EventExited, Host: 1, Rank: 2, Code: -1, Signal: 9, Stopped: true, Gen: 7},
	{Kind: EventExited, Host: 0, Rank: 0},
	{Kind: EventAbort, Host: 1, Rank: 1, Gen: 3, Code: 7, Abort: true, Msg: "called MPI_Abort (code 7)"},
	{Kind: EventAgentDone, Host: 2, Rank: -1},
	{Kind: EventEpoch, Host: 1, Rank: -1, Epoch: 1<<64 - 1},
	{Kind: EventReplFailed, Host: 1, Rank: -1, Peer: 4, Msg: "dial tcp: refused"},
	{Kind: EventPeerLost, Host: 1, Rank: 2, Peers: []int{3, 0, 9}},
}

func TestDecodeEventFastTakesWhatAgentsSend(t *testing.T) {
	for _, want := range canonicalEvents {
		b := Marshal(&want)
		got, ok := decodeEventFast(b)
		if !ok {
			t.Fatalf("fast path declines %s", b)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("fast path decodes %s as %+v", b, got)
		}
	}
}

// The launcher decodes an event a rank costs without encoding/json's
// decoder and its buffers: one allocation, the Event returned.
func TestDecodeEventAllocations(t *testing.T) {
	b := Marshal(&Event{Kind: EventExited, Host: 1, Rank: 2, Code: -1, Signal: 9, Stopped: true, Gen: 7})
	if n := testing.AllocsPerRun(100, func() {
		if _, err := DecodeEvent(b); err != nil {
			t.Fatal(err)
		}
	}); n > 1 {
		t.Fatalf("DecodeEvent makes %v allocations, want 1", n)
	}
}

// Whatever the fast path accepts, encoding/json decodes without error to
// the same value.
func FuzzDecodeEventFast(f *testing.F) {
	for _, e := range canonicalEvents {
		f.Add(Marshal(&e))
	}
	// Edge cases of an event of a real kind, so that the fast path gets
	// past the kind to them.
	for _, s := range []string{
		`{"k":"exited","h":1,"r":2,"code":0,"sig":1,"sig":2}`,
		`{"k":"exited","h":01,"r":2,"code":0}`,
		`{"k":"exited","h":1,"r":2,"code":-0,"gen":-0}`,
		`{"k":"exited","h":1,"r":2,"code":9223372036854775808}`,
		`{"k":"exited","h":1,"r":2,"code":0,"peers":[]}`,
		`{"k":"exited","h":1,"r":2,"code":0} `,
		`{"k":"exite\u0064","h":1,"r":2,"code":0}`,
		`{"k":"exited","h":1,"r":2,"code":0,"stopped":false,"abort":true,"msg":""}`,
		`{"k":"exited","h":1.0,"r":2,"code":0}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := decodeEventFast(b)
		if !ok {
			return
		}
		var slow Event
		if err := decode(b, &slow, "event"); err != nil {
			t.Fatalf("fast path accepts %q, encoding/json rejects it: %v", b, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q:\n fast %+v\n json %+v", b, fast, slow)
		}
	})
}
