package gpu

import (
	"context"
	"log/slog"
	"os"
	"time"
)

// Backend is one host's GPUs: the devices found at [Open], and their
// health. Its methods may be called from several goroutines.
type Backend interface {
	// Devices returns the devices, by Index (a copy).
	Devices() []Device
	// Watch delivers health events until ctx ends or the backend is
	// closed; the channel is closed when it stops. At most one Watch runs
	// at a time: a second one while the first's channel is open is an
	// error.
	Watch(ctx context.Context) (<-chan Event, error)
	// Close stops a running Watch, waits for it, and releases the
	// driver. Later calls return nil.
	Close() error
}

// Options configure [Open]. The zero value opens NVML with the defaults.
type Options struct {
	Fake         string        // JSON file of the fake backend; "" = $GORUN_FAKE_GPUS; none = NVML
	Host         string        // this host's name, to pick a host section of the fake's JSON
	LibraryPath  string        // NVML library override ("" = default search, libnvidia-ml.so.1)
	PollInterval time.Duration // polling of retired pages / remapped rows; 0 = 30 s
	Logger       *slog.Logger  // nil = discard
}

// defaultPollInterval is Options.PollInterval's default.
const defaultPollInterval = 30 * time.Second

// Open returns this host's backend: the fake one when Options.Fake or
// $GORUN_FAKE_GPUS names a file, NVML otherwise. Without a driver (or in
// a cgo-free build, without a fake) the error wraps [ErrNoDriver]: the
// caller runs CPU-only. Any other NVML failure is a real error that names
// the call; so is a bad fake file, and a fake in a cgo-free build.
func Open(ctx context.Context, opt Options) (Backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opt.Fake == "" {
		opt.Fake = os.Getenv(envFakeGPUs)
	}
	if opt.PollInterval <= 0 {
		opt.PollInterval = defaultPollInterval
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Fake != "" {
		return openFake(opt)
	}
	return openNVML(opt)
}
