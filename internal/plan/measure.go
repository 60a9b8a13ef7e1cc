package plan

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"
)

// MeasureMemBW measures the local memory copy bandwidth (bytes/s): it
// copies a buffer of size bytes rounds times and divides the bytes by the
// time now says it took. now is injected so that tests control the clock.
func MeasureMemBW(size, rounds int, now func() time.Time) (float64, error) {
	if size < 1 || rounds < 1 {
		return 0, inputf("memory measurement of %d bytes x %d rounds", size, rounds)
	}
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	start := now()
	for range rounds {
		copy(dst, src)
	}
	el := now().Sub(start)
	if el <= 0 {
		return 0, fmt.Errorf("plan: memory copy of %d bytes took no measurable time", size*rounds)
	}
	return float64(size) * float64(rounds) / el.Seconds(), nil
}

// File is what MeasureDurableBW writes to.
type File interface {
	io.Writer
	Sync() error
	Close() error
	Name() string
}

// FS is the file system MeasureDurableBW uses; [OSFS] is the real one.
type FS interface {
	CreateTemp(dir, pattern string) (File, error)
	Remove(name string) error
}

// OSFS is the operating system's file system.
type OSFS struct{}

// CreateTemp is os.CreateTemp.
func (OSFS) CreateTemp(dir, pattern string) (File, error) { return os.CreateTemp(dir, pattern) }

// Remove is os.Remove.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// MeasureDurableBW measures the write bandwidth of dir (bytes/s): it
// writes size bytes to a new file in dir in chunks of 4 MiB, fsyncs it,
// and removes it whatever happens, so that nothing is left behind. The
// time runs from the first write to the end of the fsync.
func MeasureDurableBW(ctx context.Context, fsys FS, dir string, size int64, now func() time.Time) (bw float64, err error) {
	if size < 1 {
		return 0, inputf("durable measurement of %d bytes", size)
	}
	f, err := fsys.CreateTemp(dir, ".gorun-plan-*")
	if err != nil {
		return 0, fmt.Errorf("plan: measuring %s: %w", dir, err)
	}
	defer func() {
		cerr := f.Close()
		rerr := fsys.Remove(f.Name())
		if err == nil && cerr != nil {
			err = fmt.Errorf("plan: measuring %s: %w", dir, cerr)
		}
		if err == nil && rerr != nil {
			err = fmt.Errorf("plan: measuring %s: %w", dir, rerr)
		}
	}()
	chunk := make([]byte, min(size, 4<<20))
	for i := range chunk {
		chunk[i] = byte(i * 131) // not zeros, which some file systems compress
	}
	start := now()
	for left := size; left > 0; {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("plan: measuring %s: %w", dir, err)
		}
		n := min(left, int64(len(chunk)))
		if _, err := f.Write(chunk[:n]); err != nil {
			return 0, fmt.Errorf("plan: measuring %s: %w", dir, err)
		}
		left -= n
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("plan: measuring %s: %w", dir, err)
	}
	el := now().Sub(start)
	if el <= 0 {
		return 0, fmt.Errorf("plan: measuring %s: writing %d bytes took no measurable time", dir, size)
	}
	return float64(size) / el.Seconds(), nil
}
