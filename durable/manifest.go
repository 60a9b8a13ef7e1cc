package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// CreateManifest writes DIR/MANIFEST (atomic replacement; see the
// package comment) after checking m. It fails, writing nothing, with an
// error wrapping fs.ErrExist if the directory has a manifest already.
func CreateManifest(dir string, m *Manifest) error {
	if err := m.check(); err != nil {
		return err
	}
	b, err := encodeManifest(m)
	if err != nil {
		return err
	}
	p := filepath.Join(dir, manifestName)
	if _, err := os.Lstat(p); err == nil {
		return fmt.Errorf("durable: %s: %w", p, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("durable: %w", err)
	}
	return writeAtomic(dir, manifestName, [][]byte{b}, nil)
}

// ReadManifest reads and checks DIR/MANIFEST. No manifest is an error
// wrapping ErrNoManifest, a bad one an error wrapping ErrCorrupt.
func ReadManifest(dir string) (*Manifest, error) {
	p := filepath.Join(dir, manifestName)
	b, err := readSmall(p, manifestHdr+maxManifestLen)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNoManifest, dir)
	}
	if err != nil {
		return nil, err
	}
	return parseManifest(b, p)
}

// CheckManifest compares the directory's manifest with m, what a resumed
// job expects: an error wrapping ErrMismatch names the first field that
// differs ("world size 8, the directory's job has 4", "rank 3's region
// 1 \"optimizer\": 2097152 bytes, the directory's job has 1048576"). No
// manifest is an error wrapping ErrNoManifest. m.Job is compared only if
// it is not empty (a resumed job has a job id of its own).
func CheckManifest(dir string, m *Manifest) error {
	have, err := ReadManifest(dir)
	if err != nil {
		return err
	}
	return compareManifests(have, m)
}

// compareManifests returns an error wrapping ErrMismatch naming the
// first field of want that differs from have's.
func compareManifests(have, want *Manifest) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrMismatch}, args...)...)
	}
	switch {
	case want.Job != "" && want.Job != have.Job:
		return bad("job %q, the directory holds job %q", want.Job, have.Job)
	case want.World != have.World:
		return bad("world size %d, the directory's job has %d", want.World, have.World)
	case len(want.Regions) != len(have.Regions):
		return bad("regions of %d ranks, the directory's job has %d", len(want.Regions), len(have.Regions))
	}
	for r := range want.Regions {
		w, h := want.Regions[r], have.Regions[r]
		if len(w) != len(h) {
			return bad("rank %d has %d regions, the directory's job has %d", r, len(w), len(h))
		}
		for i := range w {
			switch {
			case w[i].Name != h[i].Name:
				return bad("rank %d's region %d is %q, the directory's job has %q", r, i, w[i].Name, h[i].Name)
			case w[i].Size != h[i].Size:
				return bad("rank %d's region %d %q: %d bytes, the directory's job has %d", r, i, w[i].Name, w[i].Size, h[i].Size)
			}
		}
	}
	switch {
	case want.Protect != have.Protect:
		return bad("protect mode %q, the directory's job has %q", want.Protect, have.Protect)
	case want.Codec != have.Codec:
		return bad("diff codec %q, the directory's job has %q", want.Codec, have.Codec)
	case want.Every != have.Every:
		return bad("ckpt-every %d, the directory's job has %d", want.Every, have.Every)
	case want.Command != have.Command:
		return bad("command %q, the directory's job ran %q", want.Command, have.Command)
	}
	return nil
}

// CheckDir checks that dir exists, is a directory and is writable (it
// creates, fsyncs and removes a probe file), for a clear error at start
// (gorun exits 2 on it).
func CheckDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("durable: %s does not exist", dir)
	case err != nil:
		return fmt.Errorf("durable: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("durable: %s is not a directory", dir)
	}
	p := filepath.Join(dir, tempName(".probe"))
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("durable: %s is not writable: %w", dir, err)
	}
	_, err = f.Write([]byte("gorun\n"))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if rerr := os.Remove(p); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("durable: %s is not writable: %w", dir, err)
	}
	return nil
}
