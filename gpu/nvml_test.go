//go:build linux && cgo

package gpu

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
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
