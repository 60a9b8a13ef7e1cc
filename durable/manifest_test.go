package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testManifest() *Manifest {
	return &Manifest{
		Job: "abc123", World: 4, Protect: "diff", Codec: "fp16", Every: 10, Command: "sha256:feed",
		Regions: [][]Region{
			{{"optimizer", 1 << 20}, {"params", 4096}, {"meta", 64}},
			{{"optimizer", 1 << 20}, {"params", 4096}, {"meta", 64}},
			{{"optimizer", 1 << 20}, {"params", 4096}, {"meta", 64}},
			{{"optimizer", 1 << 20}, {"params", 4096}, {"meta", 64}},
		},
	}
}

func TestManifest(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadManifest(dir); !errors.Is(err, ErrNoManifest) {
		t.Errorf("ReadManifest of an empty directory: %v, want ErrNoManifest", err)
	}
	if err := CheckManifest(dir, testManifest()); !errors.Is(err, ErrNoManifest) {
		t.Errorf("CheckManifest of an empty directory: %v, want ErrNoManifest", err)
	}
	if err := CreateManifest(dir, testManifest()); err != nil {
		t.Fatal(err)
	}
	if err := CreateManifest(dir, testManifest()); !errors.Is(err, fs.ErrExist) {
		t.Errorf("a second CreateManifest: %v, want fs.ErrExist", err)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := compareManifests(m, testManifest()); err != nil {
		t.Errorf("the manifest read back differs: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Manifest)
		want   string // in the error
	}{
		{"same", func(*Manifest) {}, ""},
		{"another run of the job", func(m *Manifest) { m.Job = "" }, ""},
		{"job", func(m *Manifest) { m.Job = "other" }, `job "other", the directory holds job "abc123"`},
		{"world", func(m *Manifest) { m.World = 8 }, "world size 8, the directory's job has 4"},
		{"region count", func(m *Manifest) { m.Regions[2] = m.Regions[2][:2] }, "rank 2 has 2 regions"},
		{"region name", func(m *Manifest) { m.Regions[1] = []Region{{"optimizer", 1 << 20}, {"weights", 4096}, {"meta", 64}} }, `rank 1's region 1 is "weights"`},
		{"region size", func(m *Manifest) { m.Regions[3] = []Region{{"optimizer", 2 << 20}, {"params", 4096}, {"meta", 64}} },
			`rank 3's region 0 "optimizer": 2097152 bytes, the directory's job has 1048576`},
		{"protect", func(m *Manifest) { m.Protect = "full" }, "protect mode"},
		{"codec", func(m *Manifest) { m.Codec = "int8" }, "diff codec"},
		{"every", func(m *Manifest) { m.Every = 20 }, "ckpt-every 20"},
		{"command", func(m *Manifest) { m.Command = "sha256:beef" }, "command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testManifest()
			tc.change(m)
			err := CheckManifest(dir, m)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("CheckManifest: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("CheckManifest: %v, want ErrMismatch saying %q", err, tc.want)
			}
		})
	}
}

func TestCreateManifestChecks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Manifest)
	}{
		{"job", func(m *Manifest) { m.Job = "Bad Job" }},
		{"world", func(m *Manifest) { m.World = 0 }},
		{"regions", func(m *Manifest) { m.Regions = m.Regions[:3] }},
		{"every", func(m *Manifest) { m.Every = 0 }},
		{"region name", func(m *Manifest) { m.Regions[0] = []Region{{"hdr", 1}} }},
		{"region size", func(m *Manifest) { m.Regions[0] = []Region{{"a", -1}} }},
	} {
		m := testManifest()
		tc.change(m)
		dir := t.TempDir()
		if err := CreateManifest(dir, m); err == nil {
			t.Errorf("%s: CreateManifest succeeded", tc.name)
		}
		if _, err := os.Stat(filepath.Join(dir, manifestName)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: a manifest was written", tc.name)
		}
	}
}

func TestCheckDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want string
	}{
		{dir, ""},
		{filepath.Join(dir, "missing"), "does not exist"},
		{file, "is not a directory"},
	} {
		err := CheckDir(tc.path)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckDir(%s): %v", tc.path, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckDir(%s): %v, want %q", tc.path, err, tc.want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("CheckDir left files behind: %v", ents)
	}
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		if err := CheckDir(ro); err == nil || !strings.Contains(err.Error(), "not writable") {
			t.Errorf("CheckDir of a read-only directory: %v", err)
		}
	}
}
