package main

import (
	"bytes"
	"context"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
)

var ckptRegions = []durable.Region{{Name: "optimizer", Size: 3 << 20}, {Name: "meta", Size: 100}}

// ckptDir makes a job directory of two ranks: step 10 committed on both,
// step 20 on rank 0 only, and a batch of differentials on rank 1.
func ckptDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	m := &durable.Manifest{Job: "j1", World: 2, Regions: [][]durable.Region{ckptRegions, ckptRegions}, Protect: "diff", Codec: "none", Every: 10, Command: "c"}
	if err := durable.CreateManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	tab := crc32.MakeTable(crc32.Castagnoli)
	save := func(s *durable.Store, step int64) {
		src := [][]byte{bytes.Repeat([]byte{byte(step)}, 3<<20), bytes.Repeat([]byte{1}, 100)}
		sums := []uint32{crc32.Checksum(src[0], tab), crc32.Checksum(src[1], tab)}
		if err := s.Save(context.Background(), step, src, sums, nil); err != nil {
			t.Fatal(err)
		}
	}
	var stores [2]*durable.Store
	for r := range stores {
		s, err := durable.Open(dir, r, ckptRegions, durable.Options{Concurrency: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[r] = s
		save(s, 10)
	}
	if err := durable.Commit(dir, 10); err != nil {
		t.Fatal(err)
	}
	save(stores[0], 20)
	if err := durable.AppendBatch(dir, 1, 11, 12, [][]byte{[]byte("a"), []byte("b")}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCkptCommand(t *testing.T) {
	dir := ckptDir(t)
	bad := ckptDir(t)
	// One flipped byte in rank 1's data of step 10.
	base := filepath.Join(bad, "r1", "base.0")
	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-4096-100] ^= 1 // inside "optimizer", far from the header
	if err := os.WriteFile(base, b, 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "MANIFEST")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout []string // each in stdout
		stderr string   // in stderr
	}{
		{"ls", []string{"ls", dir}, 0, []string{
			"job j1, world size 2, a base every 10 steps; committed step 10",
			"        10          2/2  committed  6.0 MiB",
			"        20          1/2  partial    3.0 MiB",
			"footprint: ",
		}, ""},
		{"show", []string{"show", dir}, 0, []string{
			`protect mode "diff"`,
			"ranks 0-1: optimizer 3.0 MiB, meta 100 B",
			"rank 0: ",
			"  pointer: step 20, version 2",
			"committed step 10, version 1, 3.0 MiB",
			"complete step 20, version 2, 3.0 MiB",
			"  markers: 10 20",
			"  differentials: 1 batches, steps 11 to 12",
		}, ""},
		{"verify", []string{"verify", dir}, 0, []string{"every file verifies"}, ""},
		{"verify bad", []string{"verify", bad}, 1, []string{
			base + ": bytes [",
			`region "optimizer" bytes [`,
			"rank 1 has no complete version of the committed step 10",
		}, "problems"},
		{"ls bad", []string{"ls", bad}, 0, []string{"10          2/2  committed"}, ""},
		{"help", []string{"--help"}, 0, []string{"Usage: gorun ckpt"}, ""},
		{"no args", nil, 2, nil, "want a command and a directory"},
		{"no dir", []string{"ls"}, 2, nil, "want a command and a directory"},
		{"two dirs", []string{"ls", dir, dir}, 2, nil, "want a command and a directory"},
		{"unknown", []string{"rm", dir}, 2, nil, `unknown command "rm"`},
		{"missing", []string{"ls", filepath.Join(dir, "nope")}, 2, nil, "does not exist"},
		{"file", []string{"verify", file}, 2, nil, "is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(append([]string{"ckpt"}, tc.args...), nil, &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, stdout.String(), stderr.String())
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderr, stderr.String())
			}
		})
	}
}
