package control_test

// The launcher's fence collector (FenceCollector) against a real control
// plane.

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

func TestFenceCollector(t *testing.T) {
	_, _, l := testControlPlane(t, "fj", 0)
	merged := make(chan *nats.Msg, 4)
	sub, err := l.ChanSubscribe(wire.JobSubjects("fj").Fence, merged)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	fc := control.NewFenceCollector(l.Conn, "fj", 0, 2)
	up := func(host, seq int, kv map[string]string) []byte {
		return wire.Marshal(&wire.UpFence{Host: host, Epoch: 0, Seq: seq, KV: kv})
	}
	if err := fc.Handle(0, up(0, 0, map[string]string{"a": "1"})); err != nil {
		t.Fatal(err)
	}
	if err := fc.Handle(0, up(0, 0, map[string]string{"a": "1"})); err == nil {
		t.Error("a host entered the same fence twice")
	}
	if err := fc.Handle(1, wire.Marshal(&wire.UpFence{Host: 1, Epoch: 7, Seq: 0})); err == nil {
		t.Error("a fence of another epoch was taken")
	}
	if err := fc.Handle(5, up(5, 0, nil)); err == nil {
		t.Error("a fence from an unknown host was taken")
	}
	if err := fc.Handle(0, up(1, 0, nil)); err == nil {
		t.Error("host 0 entered a fence for host 1")
	}
	select {
	case m := <-merged:
		t.Fatalf("fence published before every host was in: %s", m.Data)
	case <-time.After(50 * time.Millisecond):
	}
	if err := fc.Handle(1, up(1, 0, map[string]string{"b": "2"})); err != nil {
		t.Fatal(err)
	}
	m := <-merged
	f, err := wire.DecodeFence(m.Data, 100)
	if err != nil || f.Err != "" || f.KV["a"] != "1" || f.KV["b"] != "2" {
		t.Fatalf("merged %+v, %v", f, err)
	}
	// A key two hosts set fails the fence.
	fc.Handle(0, up(0, 1, map[string]string{"x": "1"}))
	fc.Handle(1, up(1, 1, map[string]string{"x": "2"}))
	if f, err := wire.DecodeFence((<-merged).Data, 100); err != nil || f.Err == "" || f.KV != nil {
		t.Fatalf("conflicting keys: %+v, %v", f, err)
	}
	// A host's error (a rank ended without entering) fails the fence at
	// once for everyone, and again for a part that comes later.
	fc.Handle(0, up(0, 2, map[string]string{"y": "1"}))
	if err := fc.Handle(1, wire.Marshal(&wire.UpFence{Host: 1, Epoch: 0, Seq: 2, Err: "rank 3 ended without entering this fence"})); err != nil {
		t.Fatal(err)
	}
	if f, err := wire.DecodeFence((<-merged).Data, 100); err != nil || f.Seq != 2 || !strings.Contains(f.Err, "rank 3 ended") {
		t.Fatalf("failed fence: %+v, %v", f, err)
	}
	if err := fc.Handle(1, up(1, 2, nil)); err != nil {
		t.Fatal(err)
	}
	if f, err := wire.DecodeFence((<-merged).Data, 100); err != nil || f.Seq != 2 || f.Err == "" {
		t.Fatalf("a late part of a failed fence: %+v, %v", f, err)
	}
}

// TestFenceCollectorPlacement: an epoch's fences are entered by the hosts
// that run ranks in it: an idle spare's or a fenced host's part is refused
// and does not count, and the fence completes without them.
func TestFenceCollectorPlacement(t *testing.T) {
	_, _, l := testControlPlane(t, "fp", 0)
	merged := make(chan *nats.Msg, 4)
	sub, err := l.ChanSubscribe(wire.JobSubjects("fp").Fence, merged)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	fc := control.NewFenceCollector(l.Conn, "fp", 0, 3)
	for _, bad := range [][][]int{{{0}, {1}}, {nil, nil, nil}, {{0}, {1}, {2}, nil}} {
		if err := fc.SetPlacement(1, bad); err == nil {
			t.Errorf("placement %v was taken", bad)
		}
	}
	// Host 1 was lost: its ranks moved to the spare, host 2.
	if err := fc.SetPlacement(1, [][]int{{0}, nil, {1}}); err != nil {
		t.Fatal(err)
	}
	up := func(host int, kv map[string]string) []byte {
		return wire.Marshal(&wire.UpFence{Host: host, Epoch: 1, Seq: 0, KV: kv})
	}
	if err := fc.Handle(0, wire.Marshal(&wire.UpFence{Host: 0, Epoch: 0, Seq: 0})); err == nil {
		t.Error("a part of the previous epoch was taken")
	}
	if err := fc.Handle(1, up(1, map[string]string{"x": "lost"})); err == nil {
		t.Error("a part from a host without ranks was taken")
	}
	if err := fc.Handle(1, wire.Marshal(&wire.UpFence{Host: 1, Epoch: 1, Seq: 0, Err: "rank 1 ended"})); err == nil {
		t.Error("a host without ranks failed the fence")
	}
	if err := fc.Handle(0, up(0, map[string]string{"a": "1"})); err != nil {
		t.Fatal(err)
	}
	if err := fc.Handle(2, up(2, map[string]string{"b": "2"})); err != nil {
		t.Fatal(err)
	}
	// Handle publishes in order: the first merged fence is the complete one.
	f, err := wire.DecodeFence((<-merged).Data, 100)
	if err != nil || f.Epoch != 1 || f.Err != "" || !reflect.DeepEqual(f.KV, map[string]string{"a": "1", "b": "2"}) {
		t.Fatalf("merged %+v, %v", f, err)
	}
}
