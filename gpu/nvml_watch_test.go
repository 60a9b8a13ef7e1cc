//go:build linux && cgo

package gpu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// wantEvent is an expected event: what, on which device, and when after
// the start of Watch (polled kinds: up to a poll interval later).
type wantEvent struct {
	after  time.Duration
	device int
	kind   Kind
	xid    uint64
	class  Class
	detail string
}

// checkEvents compares events received from a Watch started at start
// with want.
func checkEvents(t *testing.T, b Backend, start time.Time, poll time.Duration, got []Event, want []wantEvent) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%d events, want %d", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		g, w := got[i], want[i]
		at := g.Time.Sub(start)
		late := time.Duration(0)
		if w.kind == KindRetiredPagesPending || w.kind == KindRowRemapPending || w.kind == KindRowRemapFailure {
			late = poll
		}
		if g.Device != w.device || g.UUID != b.Devices()[w.device].UUID || g.Kind != w.kind || g.XID != w.xid ||
			g.Class != w.class || g.Detail != w.detail || at < w.after || at > w.after+late {
			t.Errorf("event %d: %+v at %v;\nwant %+v", i, g, at, w)
		}
	}
	if t.Failed() {
		for _, e := range got {
			t.Logf("got %v %+v", e.Time.Sub(start), e)
		}
	}
}

// TestWatchEvents: the fake's events come through the NVML backend's code
// at their time, in time order, classified, and Watch stops within one
// wait once its context ends, leaving no goroutine (synctest.Test fails
// if one is left blocked).
func TestWatchEvents(t *testing.T) {
	path := writeFake(t, `{"devices": [{}, {}, {}], "events": [
		{"after": "2.5s", "device": 1, "xid": 13},
		{"after": "1.5s", "device": 0, "xid": 79},
		{"after": "2s", "device": 1, "ecc": "double"},
		{"after": "2s", "device": 2, "ecc": "single"},
		{"after": "3s", "device": 2, "xid": 154},
		{"after": "3200ms", "device": 0, "clock": true},
		{"after": "3400ms", "device": 0, "power": true},
		{"after": "4s", "device": 2, "retired_pages_pending": true},
		{"after": "4200ms", "device": 1, "xid": 48}
	]}`)
	want := []wantEvent{
		{1500 * time.Millisecond, 0, KindXID, 79, Permanent, "XID 79: GPU has fallen off the bus"},
		{2 * time.Second, 1, KindECCDoubleBit, 0, Permanent, "double-bit ECC error (uncorrectable)"},
		{2 * time.Second, 2, KindECCSingleBit, 0, Transient, "single-bit ECC error (corrected)"},
		{2500 * time.Millisecond, 1, KindXID, 13, Transient, "XID 13: graphics engine exception"},
		{3 * time.Second, 2, KindXID, 154, Unknown, "XID 154: not in gorun's table"},
		{3200 * time.Millisecond, 0, KindClock, 0, Transient, "clocks changed"},
		{3400 * time.Millisecond, 0, KindPower, 0, Transient, "power source changed"},
		{4 * time.Second, 2, KindRetiredPagesPending, 0, Permanent, "retired pages pending: reset the GPU to stop using them"},
		{4200 * time.Millisecond, 1, KindXID, 48, Permanent, "XID 48: double-bit ECC error"},
	}
	const poll = 100 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		b := openFakeFile(t, path, "", poll)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		ch, err := b.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []Event
		for e := range ch {
			got = append(got, e)
			if len(got) == len(want) {
				break
			}
		}
		checkEvents(t, b, start, poll, got, want)

		time.Sleep(10 * time.Second) // nothing more happens
		cancel()
		stopped := time.Now()
		for e := range ch {
			t.Errorf("unexpected event %+v", e)
		}
		if d := time.Since(stopped); d > waitTimeout {
			t.Errorf("Watch took %v to stop, more than %v", d, waitTimeout)
		}
	})
}

// TestWatchPolling: retired pages and row remapping, read by polling,
// give one event each time a condition arises, not one per poll.
func TestWatchPolling(t *testing.T) {
	path := writeFake(t, `{"devices": [{}, {}], "events": [
		{"after": "0s", "device": 0, "retired_pages_pending": true},
		{"after": "1s", "device": 1, "row_remap_pending": true},
		{"after": "1500ms", "device": 1, "row_remap_failure": true},
		{"after": "2s", "device": 1, "row_remap_pending": false},
		{"after": "3s", "device": 1, "row_remap_pending": true},
		{"after": "4s", "device": 0, "retired_pages_pending": true}
	]}`)
	const poll = 250 * time.Millisecond
	want := []wantEvent{
		{0, 0, KindRetiredPagesPending, 0, Permanent, "retired pages pending: reset the GPU to stop using them"},
		{time.Second, 1, KindRowRemapPending, 0, Permanent, "row remapping pending: reset the GPU to activate it"},
		{1500 * time.Millisecond, 1, KindRowRemapFailure, 0, Permanent, "row remapping failed: no spare row left"},
		{3 * time.Second, 1, KindRowRemapPending, 0, Permanent, "row remapping pending: reset the GPU to activate it"},
	}
	synctest.Test(t, func(t *testing.T) {
		b := openFakeFile(t, path, "", poll)
		ctx, cancel := context.WithTimeout(t.Context(), 6*time.Second)
		defer cancel()
		start := time.Now()
		ch, err := b.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []Event
		for e := range ch {
			got = append(got, e)
		}
		checkEvents(t, b, start, poll, got, want)
	})
}

// TestWatchWhenFile: an event with a when_file, XID or polled kind, is
// not delivered while the file does not exist, and is once it does, its
// "after" counted from then; the events without one keep their schedule.
// The file is created by the test, on synctest's clock.
func TestWatchWhenFile(t *testing.T) {
	trigger := filepath.Join(t.TempDir(), "fail-now")
	path := writeFake(t, fmt.Sprintf(`{"devices": [{}, {}], "events": [
		{"after": "500ms", "device": 1, "xid": 79, "when_file": %[1]q},
		{"after": "1s", "device": 0, "xid": 13},
		{"device": 1, "retired_pages_pending": true, "when_file": %[1]q}
	]}`, trigger))
	const poll = 250 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		b := openFakeFile(t, path, "", poll)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ch, err := b.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e := <-ch; e.Device != 0 || e.XID != 13 {
			t.Fatalf("first event %+v; want XID 13 on GPU 0, the event without a when_file", e)
		}
		time.Sleep(time.Minute) // Watch waits and polls all along
		synctest.Wait()
		select {
		case e := <-ch:
			t.Fatalf("event %+v delivered before %s exists", e, trigger)
		default:
		}

		if err := os.WriteFile(trigger, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		created := time.Now()
		got := map[Kind]Event{}
		for len(got) < 2 {
			e := <-ch
			if _, dup := got[e.Kind]; dup || e.Device != 1 {
				t.Fatalf("event %+v; want one XID 79 and one retired-pages event on GPU 1", e)
			}
			got[e.Kind] = e
		}
		if e := got[KindXID]; e.XID != 79 || e.Class != Permanent || e.Time.Sub(created) < 500*time.Millisecond {
			t.Errorf("XID event %+v, %v after the file was made; want XID 79, permanent, its 500ms after the file", e, e.Time.Sub(created))
		}
		if e, ok := got[KindRetiredPagesPending]; !ok || e.Time.Before(created) {
			t.Errorf("retired-pages event %+v (%v); want one after the file was made", e, ok)
		}
		time.Sleep(time.Minute) // nothing more happens
		cancel()
		for e := range ch {
			t.Errorf("unexpected event %+v", e)
		}
	})
}

// TestWatchRegistersSupported: Watch registers on each device only the
// event types it supports, and NVML delivers no others.
func TestWatchRegistersSupported(t *testing.T) {
	h, err := parseFake([]byte(`{"devices": [{}, {}], "events": [
		{"after": "1s", "device": 0, "clock": true},
		{"after": "1500ms", "device": 1, "xid": 79},
		{"after": "2s", "device": 0, "xid": 13}
	]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	f := newFake(h)
	f.devs[0].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypePState, nvml.SUCCESS
	}
	f.devs[1].GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	synctest.Test(t, func(t *testing.T) {
		b, err := newNVMLBackend(f.lib, "test", Options{PollInterval: time.Hour, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		ch, err := b.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []Event
		for e := range ch {
			got = append(got, e)
		}
		if len(got) != 1 || got[0].Device != 0 || got[0].XID != 13 {
			t.Fatalf("events %+v; want only device 0's XID 13", got)
		}
		calls := f.devs[0].RegisterEventsCalls()
		if len(calls) != 1 || calls[0].V != nvml.EventTypeXidCriticalError || len(f.devs[1].RegisterEventsCalls()) != 0 {
			t.Fatalf("RegisterEvents calls: device 0 %+v, device 1 %+v", calls, f.devs[1].RegisterEventsCalls())
		}
	})
}

// watchGoroutines counts the goroutines running a Watch.
func watchGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("gpu.(*nvmlBackend).run("))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitNoWatch fails t unless every Watch goroutine is gone within a
// second (a goroutine may still be returning after it said it is done).
func waitNoWatch(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); watchGoroutines() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d Watch goroutines left", watchGoroutines())
		}
	}
}

// TestWatchLifecycle runs in real time: an event arrives, one Watch at a
// time, Watch stops promptly when its context ends and leaves no
// goroutine, a new Watch replays the schedule, and Close stops a Watch,
// frees the event set and shuts NVML down.
func TestWatchLifecycle(t *testing.T) {
	h, err := parseFake([]byte(`{"devices": [{}], "events": [{"after": "100ms", "device": 0, "xid": 79}]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	f := newFake(h)
	var sets []*fakeEventSet
	create := f.lib.EventSetCreateFunc
	f.lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		s, ret := create()
		sets = append(sets, s.(*fakeEventSet))
		return s, ret
	}
	b, err := newNVMLBackend(f.lib, "test", Options{PollInterval: time.Hour, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}

	for round := range 2 {
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		ch, err := b.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Watch(ctx); err == nil || !strings.Contains(err.Error(), "already running") {
			t.Fatalf("second Watch: %v; want an error", err)
		}
		select {
		case e := <-ch:
			if e.XID != 79 || e.Time.Sub(start) < 100*time.Millisecond {
				t.Fatalf("round %d: event %+v after %v", round, e, e.Time.Sub(start))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: no event", round)
		}
		cancel()
		stopped := time.Now()
		for e := range ch {
			t.Fatalf("unexpected event %+v", e)
		}
		if d := time.Since(stopped); d > waitTimeout+250*time.Millisecond {
			t.Errorf("Watch took %v to stop", d)
		}
		waitNoWatch(t)
		if n := len(sets[round].FreeCalls()); n != 1 {
			t.Errorf("round %d: event set freed %d times", round, n)
		}
	}

	ch, err := b.Watch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for e := range ch { // closed by Close
		if e.XID != 79 {
			t.Fatalf("unexpected event %+v", e)
		}
	}
	waitNoWatch(t)
	if len(sets[2].FreeCalls()) != 1 || len(f.lib.ShutdownCalls()) != 1 {
		t.Errorf("after Close: event set freed %d times, NVML shut down %d times", len(sets[2].FreeCalls()), len(f.lib.ShutdownCalls()))
	}
	if err := b.Close(); err != nil || len(f.lib.ShutdownCalls()) != 1 {
		t.Errorf("second Close: %v, %d shutdowns", err, len(f.lib.ShutdownCalls()))
	}
	if _, err := b.Watch(t.Context()); err == nil {
		t.Error("Watch after Close: no error")
	}
}
