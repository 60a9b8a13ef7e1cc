package ckpt

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFilesAndDir(t *testing.T) {
	base := t.TempDir()
	t.Chdir(base)
	for _, tc := range []struct {
		name    string
		dir     string // Options.Dir, relative to base unless absolute
		regions []Region
	}{
		{"usual", "", testRegions},
		{"relative dir", "sub", testRegions},
		{"dot dot dir", "sub/../other", []Region{{"params", 4096}, {"a", 1}}},
		{"sixteen regions", "many", func() []Region {
			rs := make([]Region, maxRegions)
			for i := range rs {
				rs[i] = Region{Name: string(rune('a'+i)) + "x", Size: int64(4095 + i)}
			}
			return rs
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.dir
			if dir == "" {
				dir = filepath.Join(base, "abs")
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			abs, _ := filepath.Abs(dir)
			s, err := Create(testJob, 3, tc.regions, Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			r, err := Open(testJob, 3, nil, Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			for _, x := range []*Slots{s, r} {
				if x.Dir() != abs || !filepath.IsAbs(x.Dir()) {
					t.Fatalf("Dir() = %q, want %q", x.Dir(), abs)
				}
				files := x.Files()
				if len(files) != len(tc.regions) {
					t.Fatalf("Files() has %d files, want %d", len(files), len(tc.regions))
				}
				for i, f := range files {
					rg := tc.regions[i]
					want := RegionFile{Name: rg.Name, Size: rg.Size, Stride: (rg.Size + 4095) / 4096 * 4096, Path: filepath.Join(abs, "gorun-"+testJob+".r3."+rg.Name)}
					if f != want {
						t.Fatalf("Files()[%d] = %+v, want %+v", i, f, want)
					}
					fi, err := os.Stat(f.Path)
					if err != nil || fi.Size() != 2*f.Stride {
						t.Fatalf("%s: %v, size %d, want %d", f.Path, err, fi.Size(), 2*f.Stride)
					}
				}
			}
			// Files survive Close (they are the layout's, not the
			// mappings').
			r.Close()
			if len(r.Files()) != len(tc.regions) || r.Dir() != abs {
				t.Fatal("Files or Dir changed by Close")
			}
		})
	}
}

// TestMapData plays a rank service (the Slots, which stages and commits)
// and a rank client (which writes the regions through MapData's views),
// in one process, and checks that Newest and At read what the client
// wrote, in this mapping and in a fresh one.
func TestMapData(t *testing.T) {
	for _, tc := range []struct {
		name    string
		regions []Region
	}{
		{"usual", testRegions},
		{"one byte", []Region{{"meta", 1}}},
		{"only empty", []Region{{"empty", 0}}},
		{"page multiple", []Region{{"params", 2 * 4096}, {"x", 4097}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, opt := create(t, tc.regions)
			files := s.Files()
			views := make([][2][]byte, len(files))
			unmaps := make([]func() error, len(files))
			for i, f := range files {
				v, unmap, err := MapData(f)
				if err != nil {
					t.Fatalf("MapData(%+v): %v", f, err)
				}
				for slot := range 2 {
					if int64(len(v[slot])) != f.Size || int64(cap(v[slot])) != f.Size {
						t.Fatalf("%s: view of slot %d: len %d cap %d, want %d", f.Name, slot, len(v[slot]), cap(v[slot]), f.Size)
					}
				}
				views[i], unmaps[i] = v, unmap
			}
			for step := uint64(1); step <= 5; step++ {
				st, err := s.Stage(step)
				if err != nil {
					t.Fatal(err)
				}
				for i := range files {
					fill(step, i, views[i][st.Slot()])
				}
				if err := st.Commit(); err != nil {
					t.Fatal(err)
				}
				checkNewest(t, s, step, st.Slot(), false)
				checkNewest(t, reopen(t, opt), step, st.Slot(), false)
				if step > 1 {
					checkAt(t, s, step-1, 1-st.Slot())
				}
				// What the service's Staged views wrote, the client
				// sees.
				for i, f := range files {
					if !bytes.Equal(views[i][st.Slot()], want(step, i, f.Size)) {
						t.Fatalf("region %q: the client's view differs from step %d", f.Name, step)
					}
				}
			}
			// The service's writes through Staged, read by the client.
			st, err := s.Stage(6)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range st.Views() {
				fill(6, i, v)
				if !bytes.Equal(views[i][st.Slot()], want(6, i, files[i].Size)) {
					t.Fatalf("region %q: the client does not see the service's writes", files[i].Name)
				}
			}
			for _, unmap := range unmaps {
				if err := unmap(); err != nil {
					t.Fatal(err)
				}
				if err := unmap(); err != nil {
					t.Fatalf("second unmap: %v", err)
				}
			}
			if err := st.Commit(); err != nil {
				t.Fatal(err)
			}
			checkNewest(t, s, 6, st.Slot(), false)
		})
	}
}

func TestMapDataRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		file  func(f RegionFile) RegionFile // edits the RegionFile of optimizer
		setup func(t *testing.T, path string)
		is    error
		msg   string
	}{
		{name: "negative size", file: func(f RegionFile) RegionFile { f.Size = -1; return f }, msg: "size -1 outside"},
		{name: "size over the limit", file: func(f RegionFile) RegionFile { f.Size, f.Stride = MaxRegionSize+1, MaxRegionSize+4096; return f }, msg: "outside"},
		{name: "stride not rounded", file: func(f RegionFile) RegionFile { f.Stride = f.Size; return f }, msg: "stride 10000, want 12288"},
		{name: "stride of another size", file: func(f RegionFile) RegionFile { f.Stride = 4096; return f }, msg: "stride 4096, want 12288"},
		{name: "zero stride", file: func(f RegionFile) RegionFile { f.Stride = 0; return f }, msg: "stride 0"},
		{name: "size of another stride", file: func(f RegionFile) RegionFile { f.Size, f.Stride = 5000, 8192; return f }, is: ErrLayout, msg: "24576 bytes, want 16384"},
		{name: "empty region, file not", file: func(f RegionFile) RegionFile { f.Size, f.Stride = 0, 0; return f }, is: ErrLayout, msg: "24576 bytes, want 0"},
		{name: "truncated file", setup: func(t *testing.T, p string) {
			if err := os.Truncate(p, 12288); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "12288 bytes, want 24576"},
		{name: "long file", setup: func(t *testing.T, p string) {
			if err := os.Truncate(p, 24577); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "24577 bytes, want 24576"},
		{name: "missing file", setup: func(t *testing.T, p string) {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}, is: fs.ErrNotExist},
		{name: "symbolic link", setup: func(t *testing.T, p string) {
			if err := os.Rename(p, p+"-real"); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(p+"-real", p); err != nil {
				t.Fatal(err)
			}
		}, msg: "symbolic link"},
		{name: "directory", setup: func(t *testing.T, p string) {
			os.Remove(p)
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}, msg: "is a directory"},
		{name: "FIFO", setup: func(t *testing.T, p string) {
			os.Remove(p)
			if err := mkfifo(p); err != nil {
				t.Skip(err)
			}
		}, is: ErrLayout, msg: "not a regular file"},
		{name: "writable by group", setup: func(t *testing.T, p string) {
			if err := os.Chmod(p, 0o620); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "writable by others"},
		{name: "writable by others", setup: func(t *testing.T, p string) {
			if err := os.Chmod(p, 0o602); err != nil {
				t.Fatal(err)
			}
		}, is: ErrLayout, msg: "writable by others"},
		{name: "another user's", setup: func(t *testing.T, p string) {
			if os.Geteuid() != 0 {
				t.Skip("only root can give a file away")
			}
			if err := os.Chown(p, 54321, 54321); err != nil {
				t.Skip(err)
			}
		}, is: ErrLayout, msg: "owned by uid 54321"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := create(t, testRegions)
			commit(t, s, 1)
			f := s.Files()[0]
			if tc.setup != nil {
				tc.setup(t, f.Path)
			}
			if tc.file != nil {
				f = tc.file(f)
			}
			views, unmap, err := MapData(f)
			if err == nil {
				unmap()
				t.Fatal("MapData succeeded")
			}
			if unmap != nil || views[0] != nil || views[1] != nil {
				t.Fatal("MapData failed but returned views or an unmap")
			}
			if tc.is != nil && !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), "ckpt: ") {
				t.Fatalf("MapData: %q, want an error wrapping %v saying %q", err, tc.is, tc.msg)
			}
		})
	}
}
