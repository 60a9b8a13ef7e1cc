//go:build linux && cgo

package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// writeFake writes a fake backend's JSON to a file and returns its path.
func writeFake(t *testing.T, json string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gpus.json")
	if err := os.WriteFile(path, []byte(json), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// openFakeFile opens the fake backend of path for host, closed at the end
// of the test.
func openFakeFile(t *testing.T, path, host string, poll time.Duration) Backend {
	t.Helper()
	b, err := Open(t.Context(), Options{Fake: path, Host: host, PollInterval: poll, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func defaultUUID(host string, i int) string {
	return fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", crc32.ChecksumIEEE([]byte(host)), i)
}

func TestFakeDiscovery(t *testing.T) {
	h100 := Device{Index: 0, UUID: "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", Name: "NVIDIA H100 80GB HBM3",
		MemoryBytes: 80 << 30, PCIBusID: "0000:07:00.0", CPUs: []int{0, 1, 2, 3},
		NVLinks: []NVLink{{0, "0000:08:00.0", 1}, {1, "0000:08:00.0", 1}}}
	a100 := func(i int, uuid, bus, peer string, cpus []int) Device {
		return Device{Index: i, UUID: uuid, Name: "NVIDIA A100-PCIE-40GB", MemoryBytes: 40 << 30, PCIBusID: bus, CPUs: cpus,
			NVLinks: []NVLink{{0, peer, i ^ 1}, {1, peer, i ^ 1}, {2, peer, i ^ 1}}}
	}
	numa0, numa1 := []int{0, 1, 2, 3, 64, 65, 66, 67}, []int{32, 33, 34, 35, 96, 97, 98, 99}
	tests := []struct {
		file, host string
		want       []Device
	}{
		{"example.json", "", []Device{h100, {Index: 1, UUID: defaultUUID("", 1), Name: "Fake NVIDIA GPU", PCIBusID: "0000:08:00.0",
			NVLinks: []NVLink{{0, "0000:07:00.0", 0}, {1, "0000:07:00.0", 0}}}}},
		{"example.json", "node1", []Device{h100, {Index: 1, UUID: defaultUUID("node1", 1), Name: "Fake NVIDIA GPU", PCIBusID: "0000:08:00.0",
			NVLinks: []NVLink{{0, "0000:07:00.0", 0}, {1, "0000:07:00.0", 0}}}}},
		{"example.json", "node3", []Device{}},
		{"pcie4.json", "", []Device{
			a100(0, "GPU-0a1b2c3d-0000-4000-8000-000000000000", "0000:17:00.0", "0000:31:00.0", numa0),
			a100(1, "GPU-0a1b2c3d-0000-4000-8000-000000000001", "0000:31:00.0", "0000:17:00.0", numa0),
			a100(2, "GPU-5e6f7a8b-0000-4000-8000-000000000002", "0000:b1:00.0", "0000:ca:00.0", numa1),
			a100(3, "GPU-5e6f7a8b-0000-4000-8000-000000000003", "0000:ca:00.0", "0000:b1:00.0", numa1),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.file+"/"+tc.host, func(t *testing.T) {
			b := openFakeFile(t, filepath.Join("testdata", tc.file), tc.host, 0)
			if got := b.Devices(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Devices:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	t.Run("hgx8.json via GORUN_FAKE_GPUS", func(t *testing.T) {
		t.Setenv("GORUN_FAKE_GPUS", filepath.Join("testdata", "hgx8.json"))
		b := openFakeFile(t, "", "node7", 0)
		devs := b.Devices()
		if len(devs) != 8 {
			t.Fatalf("%d devices, want 8", len(devs))
		}
		for i, d := range devs {
			// The NVLinks go to NVSwitches, not to GPUs of the host.
			want := []NVLink{{0, "0000:05:00.0", -1}, {1, "0000:06:00.0", -1}}
			if d.Index != i || d.UUID != defaultUUID("node7", i) || d.MemoryBytes != 80<<30 || len(d.CPUs) != 8 || d.CPUs[0] != 8*(i/4) || !reflect.DeepEqual(d.NVLinks, want) {
				t.Errorf("device %d: %+v", i, d)
			}
		}
	})
	t.Run("Devices returns a copy", func(t *testing.T) {
		b := openFakeFile(t, filepath.Join("testdata", "example.json"), "", 0)
		d := b.Devices()
		d[0].CPUs[0], d[0].NVLinks[0].PeerIndex, d[1].Name = 99, 99, "changed"
		if !reflect.DeepEqual(b.Devices()[0], h100) || b.Devices()[1].Name != "Fake NVIDIA GPU" {
			t.Fatalf("changing Devices' result changed the backend: %+v", b.Devices())
		}
	})
}

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

// TestOpenEnvironment: $GORUN_FAKE_GPUS selects the fake when
// Options.Fake is empty, and the default poll interval applies.
func TestOpenEnvironment(t *testing.T) {
	t.Setenv("GORUN_FAKE_GPUS", writeFake(t, `{"devices": [{}, {}], "events": [
		{"after": "0s", "device": 1, "row_remap_pending": true},
		{"after": "50ms", "device": 0, "xid": 31}]}`))
	b, err := Open(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := b.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []Kind
	for len(got) < 2 {
		select {
		case e := <-ch:
			got = append(got, e.Kind)
		case <-time.After(5 * time.Second):
			t.Fatalf("events %v; want the first poll's and XID 31", got)
		}
	}
	if got[0] != KindRowRemapPending || got[1] != KindXID {
		t.Fatalf("events %v", got)
	}
}

func TestOpenErrors(t *testing.T) {
	t.Setenv("GORUN_FAKE_GPUS", "")
	t.Run("no library", func(t *testing.T) {
		lib := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
		b, err := Open(t.Context(), Options{LibraryPath: lib})
		if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "NVML library "+lib+" not found") {
			t.Fatalf("Open = %v, %v; want ErrNoDriver saying the library was not found", b, err)
		}
		t.Log(err)
	})
	t.Run("bad fake", func(t *testing.T) {
		b, err := Open(t.Context(), Options{Fake: "testdata/unknown-field.json"})
		if err == nil || errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "testdata/unknown-field.json") {
			t.Fatalf("Open = %v, %v; want an error naming the file", b, err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := Open(ctx, Options{Fake: "testdata/example.json"}); !errors.Is(err, context.Canceled) {
			t.Fatalf("Open = %v", err)
		}
	})
}

// TestNVMLFailures: NVML calls that fail give errors naming the call and
// the device (ErrNoDriver only for a missing library or driver), and
// NOT_SUPPORTED is not a failure.
func TestNVMLFailures(t *testing.T) {
	fail := func(r nvml.Return) func() nvml.Return { return func() nvml.Return { return r } }
	tests := []struct {
		name     string
		mutate   func(f *fake)
		err      string // Open's; "" = none
		noDriver bool
		check    func(t *testing.T, b *nvmlBackend, f *fake)
	}{
		{name: "library not found", mutate: func(f *fake) { f.lib.InitFunc = fail(nvml.ERROR_LIBRARY_NOT_FOUND) },
			err: "gpu: no NVIDIA driver: NVML library test not found", noDriver: true},
		{name: "driver not loaded", mutate: func(f *fake) { f.lib.InitFunc = fail(nvml.ERROR_DRIVER_NOT_LOADED) },
			err: "gpu: no NVIDIA driver: nvmlInit: the NVIDIA kernel driver is not loaded", noDriver: true},
		{name: "init", mutate: func(f *fake) { f.lib.InitFunc = fail(nvml.ERROR_NO_PERMISSION) },
			err: "gpu: nvmlInit: ERROR_NO_PERMISSION"},
		{name: "count", mutate: func(f *fake) {
			f.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		}, err: "gpu: nvmlDeviceGetCount: ERROR_UNKNOWN"},
		{name: "uuid", mutate: func(f *fake) {
			f.devs[1].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
		}, err: "gpu: nvmlDeviceGetUUID (GPU 1): ERROR_GPU_IS_LOST"},
		{name: "nvlink state", mutate: func(f *fake) {
			f.devs[0].GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		}, err: "gpu: nvmlDeviceGetNvLinkState(link 0) (GPU 0): ERROR_UNKNOWN"},
		{name: "not supported", mutate: func(f *fake) {
			f.devs[0].GetCpuAffinityFunc = func(int) ([]uint, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
			f.devs[0].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
			f.devs[0].GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED }
			f.devs[1].GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		}, check: func(t *testing.T, b *nvmlBackend, f *fake) {
			d := b.Devices()
			if d[0].CPUs != nil || d[0].MemoryBytes != 0 || !reflect.DeepEqual(d[0].NVLinks, []NVLink{{0, "", -1}}) || d[1].NVLinks != nil {
				t.Fatalf("devices %+v", d)
			}
		}},
		{name: "event set", mutate: func(f *fake) {
			f.lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
		}, check: func(t *testing.T, b *nvmlBackend, f *fake) {
			if _, err := b.Watch(t.Context()); err == nil || err.Error() != "gpu: nvmlEventSetCreate: ERROR_UNKNOWN" {
				t.Fatalf("Watch: %v", err)
			}
		}},
		{name: "register", mutate: func(f *fake) {
			f.devs[1].RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_GPU_IS_LOST }
		}, check: func(t *testing.T, b *nvmlBackend, f *fake) {
			_, err := b.Watch(t.Context())
			if err == nil || err.Error() != "gpu: nvmlDeviceRegisterEvents (GPU 1): ERROR_GPU_IS_LOST" {
				t.Fatalf("Watch: %v", err)
			}
			// The set was freed, and a later Watch may run.
			f.devs[1].RegisterEventsFunc = f.devs[0].RegisterEventsFunc
			ctx, cancel := context.WithCancel(t.Context())
			ch, err := b.Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			for range ch {
			}
		}},
		{name: "polling not supported", mutate: func(f *fake) {
			f.devs[0].GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
			f.devs[1].GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.ERROR_GPU_IS_LOST }
		}, check: func(t *testing.T, b *nvmlBackend, f *fake) {
			ctx, cancel := context.WithTimeout(t.Context(), 9500*time.Millisecond)
			defer cancel()
			ch, err := b.Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for e := range ch {
				t.Errorf("unexpected event %+v", e)
			}
			// Not supported: asked once. Failing: asked at every poll.
			if n := len(f.devs[0].GetRetiredPagesPendingStatusCalls()); n != 1 {
				t.Errorf("retired pages of GPU 0 asked %d times, want 1", n)
			}
			if n := len(f.devs[1].GetRemappedRowsCalls()); n != 10 {
				t.Errorf("remapped rows of GPU 1 asked %d times, want 10", n)
			}
		}},
	}
	h, err := parseFake([]byte(`{"devices": [{"cpus": [1], "nvlinks": ["0000:02:00.0"]}, {}]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(h)
			tc.mutate(f)
			synctest.Test(t, func(t *testing.T) {
				b, err := newNVMLBackend(f.lib, "test", Options{PollInterval: time.Second, Logger: testLogger(t)})
				if tc.err != "" {
					if err == nil || !strings.HasPrefix(err.Error(), tc.err) || errors.Is(err, ErrNoDriver) != tc.noDriver {
						t.Fatalf("open: %v; want an error starting %q (ErrNoDriver: %v)", err, tc.err, tc.noDriver)
					}
					inited := 0
					if f.lib.InitFunc() == nvml.SUCCESS {
						inited = 1
					}
					if n := len(f.lib.ShutdownCalls()); n != inited {
						t.Errorf("NVML shut down %d times, want %d", n, inited)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				tc.check(t, b, f)
			})
		})
	}
}

var _ nvml.Interface = (*mock.Interface)(nil)
