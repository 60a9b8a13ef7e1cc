package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestCheckpointRestart is the baseline's crash and rerun: rank 1 crashes
// at the start of step 13 of a run checkpointing every 4 steps; the rerun
// resumes after step 11 (the newest checkpoint every rank has) and ends
// with the hashes of a run without failure.
func TestCheckpointRestart(t *testing.T) {
	const size = 3
	want := mustRunWorld(t, size, testConfig(t), runOptions{})
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, dir string) // after the crash, before the rerun
		resume string
	}{
		{"newest", func(*testing.T, string) {}, "resuming after step 11"},
		{
			// Rank 2 died while writing step 11's checkpoint: it has
			// step 7's only. Every rank goes back to step 7.
			"one rank behind", func(t *testing.T, dir string) {
				if err := os.Rename(ckptPath(dir, 2)+".prev", ckptPath(dir, 2)); err != nil {
					t.Fatal(err)
				}
			}, "resuming after step 7",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(t, "--ckpt-dir", dir, "--ckpt-every", "4", "--fail-at-step", "13", "--fail-rank", "1")
			_, errs := runWorld(t, size, cfg, runOptions{})
			if !errors.Is(errs[1], errCrashed) {
				t.Fatalf("rank 1: %v, want errCrashed", errs[1])
			}
			tc.before(t, dir)
			cfg.FailAtStep = -1 // as gorun's restart does
			var out bytes.Buffer
			got := mustRunWorld(t, size, cfg, runOptions{out: &out})
			if !strings.Contains(out.String(), tc.resume+"\n") {
				t.Errorf("the rerun did not say %q:\n%s", tc.resume, out.String())
			}
			if got.ParamsHash != want.ParamsHash || got.OptimizerHash != want.OptimizerHash {
				t.Errorf("after the restart: hashes %x %x, want %x %x", got.ParamsHash, got.OptimizerHash, want.ParamsHash, want.OptimizerHash)
			}
		})
	}
}

// TestCheckpointRefused: a corrupt checkpoint, one of a run with other
// flags and one of another world are errors, never resumed from.
func TestCheckpointRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spoil  func(t *testing.T, dir string)
		size   int
		extra  []string
		want   error
		inText string
	}{
		{"corrupt", func(t *testing.T, dir string) { flipByte(t, ckptPath(dir, 1), 200) }, 3, nil, errBadCheckpoint, "SHA-256 mismatch"},
		{"truncated", func(t *testing.T, dir string) {
			if err := os.Truncate(ckptPath(dir, 1)+".prev", 100); err != nil {
				t.Fatal(err)
			}
		}, 3, nil, errBadCheckpoint, "body"},
		{"other flags", func(*testing.T, string) {}, 3, []string{"--lr", "0.02"}, errUsage, "other flags"},
		{"other world", func(*testing.T, string) {}, 2, nil, errUsage, "another"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mustRunWorld(t, 3, testConfig(t, "--ckpt-dir", dir, "--ckpt-every", "4", "--steps", "10"), runOptions{})
			tc.spoil(t, dir)
			_, errs := runWorld(t, tc.size, testConfig(t, append([]string{"--ckpt-dir", dir, "--ckpt-every", "4"}, tc.extra...)...), runOptions{})
			found := false
			for _, err := range errs {
				if errors.Is(err, tc.want) && strings.Contains(err.Error(), tc.inText) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors %v, want one matching %v and saying %q", errs, tc.want, tc.inText)
			}
		})
	}
}

// flipByte inverts the byte at off of the file at path.
func flipByte(t *testing.T, path string, off int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0xFF
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointNoTemporaryLeft: the writes leave only the two
// checkpoints of each rank.
func TestCheckpointNoTemporaryLeft(t *testing.T) {
	dir := t.TempDir()
	mustRunWorld(t, 2, testConfig(t, "--ckpt-dir", dir, "--ckpt-every", "3"), runOptions{})
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"rank-0.ckpt", "rank-0.ckpt.prev", "rank-1.ckpt", "rank-1.ckpt.prev"}; !slices.Equal(names, want) {
		t.Errorf("files %v, want %v", names, want)
	}
}

// ckptSample is a valid checkpoint of a shard of 3 parameters at step 5.
func ckptSample(t testing.TB) (b []byte, key [32]byte) {
	key = sha256.Sum256([]byte("a run"))
	var buf bytes.Buffer
	if err := writeCheckpoint(&buf, 5, key, []float32{1, 2, 3}, []float32{4, 5, 6}, []float32{7, 8, -9}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), key
}

// rehash fixes b's trailer after a change.
func rehash(b []byte) []byte {
	s := sha256.Sum256(b[:len(b)-sha256.Size])
	return append(b[:len(b)-sha256.Size], s[:]...)
}

func TestReadCheckpoint(t *testing.T) {
	good, key := ckptSample(t)
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name string
		file []byte
		n    int
		want error // nil: accepted
	}{
		{"valid", good, 3, nil},
		{"empty", nil, 3, errBadCheckpoint},
		{"short header", good[:40], 3, errBadCheckpoint},
		{"no trailer", good[:len(good)-sha256.Size], 3, errBadCheckpoint},
		{"short trailer", good[:len(good)-1], 3, errBadCheckpoint},
		{"extra byte", append(bytes.Clone(good), 0), 3, errBadCheckpoint},
		{"bad magic", edit(func(b []byte) []byte { b[0] = 'x'; return rehash(b) }), 3, errBadCheckpoint},
		{"step too large", edit(func(b []byte) []byte { b[15] = 0xFF; return rehash(b) }), 3, errBadCheckpoint},
		{"reserved", edit(func(b []byte) []byte { b[60] = 1; return rehash(b) }), 3, errBadCheckpoint},
		{"body flipped", edit(func(b []byte) []byte { b[70] ^= 1; return b }), 3, errBadCheckpoint},
		{"trailer flipped", edit(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), 3, errBadCheckpoint},
		{"other shard size", good, 4, errUsage},
		{"other key", edit(func(b []byte) []byte { b[20] ^= 1; return rehash(b) }), 3, errUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, v, w := make([]float32, tc.n), make([]float32, tc.n), make([]float32, tc.n)
			step, err := readCheckpoint(bytes.NewReader(tc.file), key, m, v, w)
			if tc.want == nil {
				if err != nil || step != 5 || !slices.Equal(m, []float32{1, 2, 3}) || !slices.Equal(v, []float32{4, 5, 6}) || !slices.Equal(w, []float32{7, 8, -9}) {
					t.Errorf("got step %d, %v %v %v, %v", step, m, v, w, err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("got step %d, %v; want %v", step, err, tc.want)
			}
		})
	}
}

// FuzzReadCheckpoint: the reader never panics, and what it accepts is
// exactly what the writer writes for the values it read.
func FuzzReadCheckpoint(f *testing.F) {
	good, key := ckptSample(f)
	f.Add(good)
	f.Add(good[:64])
	f.Add(append(bytes.Clone(good), 1))
	f.Add([]byte("dptckpt1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, v, w := make([]float32, 3), make([]float32, 3), make([]float32, 3)
		step, err := readCheckpoint(bytes.NewReader(b), key, m, v, w)
		if err != nil {
			if !errors.Is(err, errBadCheckpoint) && !errors.Is(err, errUsage) {
				t.Fatalf("error of no kind: %v", err)
			}
			return
		}
		var again bytes.Buffer
		if err := writeCheckpoint(&again, step, key, m, v, w); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Bytes(), b) {
			t.Fatalf("accepted %x, which the writer writes as %x", b, again.Bytes())
		}
	})
}
