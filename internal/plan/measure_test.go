package plan

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// fakeClock advances by step on every call.
func fakeClock(step time.Duration) func() time.Time {
	t := time.Unix(0, 0)
	return func() time.Time { t = t.Add(step); return t }
}

type fakeFile struct {
	name              string
	written           int64
	writeErr, syncErr error
	closed            bool
}

func (f *fakeFile) Write(p []byte) (int, error) {
	if f.writeErr != nil {
		return 0, f.writeErr
	}
	f.written += int64(len(p))
	return len(p), nil
}
func (f *fakeFile) Sync() error  { return f.syncErr }
func (f *fakeFile) Close() error { f.closed = true; return nil }
func (f *fakeFile) Name() string { return f.name }

type fakeFS struct {
	file    *fakeFile
	removed []string
}

func (fs *fakeFS) CreateTemp(dir, pattern string) (File, error) { return fs.file, nil }
func (fs *fakeFS) Remove(name string) error                     { fs.removed = append(fs.removed, name); return nil }

func TestMeasureDurableBW(t *testing.T) {
	errDisk := errors.New("disk full")
	for _, c := range []struct {
		name    string
		file    fakeFile
		wantBW  float64
		wantErr error
	}{
		{"ok: 10 MiB in the clock's 1 s", fakeFile{name: "d/x"}, 10 << 20, nil},
		{"write fails", fakeFile{name: "d/x", writeErr: errDisk}, 0, errDisk},
		{"fsync fails", fakeFile{name: "d/x", syncErr: errDisk}, 0, errDisk},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := &fakeFS{file: &c.file}
			bw, err := MeasureDurableBW(context.Background(), fs, "d", 10<<20, fakeClock(time.Second))
			if !errors.Is(err, c.wantErr) || bw != c.wantBW {
				t.Errorf("= %v, %v; want %v, %v", bw, err, c.wantBW, c.wantErr)
			}
			if !c.file.closed || len(fs.removed) != 1 || fs.removed[0] != "d/x" {
				t.Errorf("closed %v, removed %v: want the file closed and removed", c.file.closed, fs.removed)
			}
		})
	}
}

// The real file system: the measurement leaves the directory as it was.
func TestMeasureDurableBWLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	bw, err := MeasureDurableBW(context.Background(), OSFS{}, dir, 1<<20, time.Now)
	if err != nil || !(bw > 0) {
		t.Fatalf("= %v, %v", bw, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
	if _, err := MeasureDurableBW(context.Background(), OSFS{}, dir+"/missing", 1<<20, time.Now); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing dir: %v, want ErrNotExist", err)
	}
}

func TestMeasureMemBW(t *testing.T) {
	bw, err := MeasureMemBW(1<<20, 4, fakeClock(time.Second))
	if err != nil || bw != 4<<20 {
		t.Errorf("= %v, %v; want 4 MiB/s by the fake clock", bw, err)
	}
	if _, err := MeasureMemBW(0, 1, time.Now); !errors.Is(err, ErrInput) {
		t.Errorf("size 0: %v", err)
	}
}
