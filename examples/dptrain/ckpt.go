package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// The checkpoint-restart baseline (--ckpt-dir, --ckpt-every): what a
// torchrun user does. Every --ckpt-every steps each rank writes its
// optimizer shard to DIR/rank-<r>.ckpt, replacing it atomically, and keeps
// the one before as DIR/rank-<r>.ckpt.prev; at start every rank resumes
// from the newest step all ranks have, gathers the parameters and goes
// on, training again the steps since.
//
// A checkpoint file is:
//
//	offset  size  field
//	0       8     magic "dptckpt1"
//	8       8     step (little-endian uint64)
//	16      32    state key (trainer.stateKey: the flags and world it belongs to)
//	48      8     n, the shard's length in parameters (little-endian uint64)
//	56      8     zero
//	64      12n   m, v, master weights: little-endian float32
//	64+12n  32    SHA-256 of everything before
//
// A file that does not read back exactly so (short, long, another magic,
// a bad hash) is corrupt (errBadCheckpoint); one of another run or world
// (the key) is refused as a usage error: neither is ever resumed from.

var ckptMagic = [8]byte{'d', 'p', 't', 'c', 'k', 'p', 't', '1'}

// ckptHeaderSize is the header's size.
const ckptHeaderSize = 64

// errBadCheckpoint marks a checkpoint file that is not one dptrain wrote
// whole.
var errBadCheckpoint = errors.New("corrupt checkpoint")

// ckptPath is rank's checkpoint in dir; ckptPath+".prev" is the one before.
func ckptPath(dir string, rank int) string {
	return filepath.Join(dir, "rank-"+strconv.Itoa(rank)+".ckpt")
}

// writeCheckpoint writes the checkpoint of step with the shard (m, v,
// master: of equal lengths) to w.
func writeCheckpoint(w io.Writer, step int64, key [32]byte, m, v, master []float32) error {
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 1<<16)
	var hdr [ckptHeaderSize]byte
	copy(hdr[:], ckptMagic[:])
	binary.LittleEndian.PutUint64(hdr[8:], uint64(step))
	copy(hdr[16:48], key[:])
	binary.LittleEndian.PutUint64(hdr[48:], uint64(len(master)))
	bw.Write(hdr[:])
	var b [4]byte
	for _, x := range [][]float32{m, v, master} {
		for _, f := range x {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(f))
			bw.Write(b[:])
		}
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	_, err := w.Write(h.Sum(nil))
	return err
}

// readCheckpoint reads a checkpoint of a shard of len(master) parameters
// into m, v and master (which hold garbage if it fails) and returns its
// step. A file that is not exactly what writeCheckpoint writes wraps
// errBadCheckpoint; a whole file of another run or world (key) wraps
// errUsage.
func readCheckpoint(r io.Reader, key [32]byte, m, v, master []float32) (int64, error) {
	h := sha256.New()
	var hdr [ckptHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, fmt.Errorf("%w: header: %w", errBadCheckpoint, err)
	}
	h.Write(hdr[:])
	step := binary.LittleEndian.Uint64(hdr[8:])
	n := binary.LittleEndian.Uint64(hdr[48:])
	switch {
	case string(hdr[:8]) != string(ckptMagic[:]):
		return 0, fmt.Errorf("%w: not a dptrain checkpoint (magic %q)", errBadCheckpoint, hdr[:8])
	case step > maxStep:
		return 0, fmt.Errorf("%w: step %d", errBadCheckpoint, step)
	case string(hdr[56:]) != string(make([]byte, 8)):
		return 0, fmt.Errorf("%w: reserved header bytes are not zero", errBadCheckpoint)
	case n != uint64(len(master)):
		// Checked before the body is read: a shard of another size is
		// refused, whatever the file holds after the header.
		return 0, usageError("the checkpoint holds a shard of %d parameters, this rank's has %d (another run or world); not resuming from it", n, len(master))
	}
	buf := make([]byte, 4*min(len(master), 1<<14))
	for _, x := range [][]float32{m, v, master} {
		for a := 0; a < len(x); a += len(buf) / 4 {
			part := x[a:min(a+len(buf)/4, len(x))]
			b := buf[:4*len(part)]
			if _, err := io.ReadFull(r, b); err != nil {
				return 0, fmt.Errorf("%w: body: %w", errBadCheckpoint, err)
			}
			h.Write(b)
			getFloat32s(part, b)
		}
	}
	var sum, trailer [sha256.Size]byte
	h.Sum(sum[:0])
	if _, err := io.ReadFull(r, trailer[:]); err != nil {
		return 0, fmt.Errorf("%w: trailer: %w", errBadCheckpoint, err)
	}
	if trailer != sum {
		return 0, fmt.Errorf("%w: SHA-256 mismatch", errBadCheckpoint)
	}
	if _, err := io.ReadFull(r, make([]byte, 1)); err != io.EOF {
		return 0, fmt.Errorf("%w: bytes after the trailer", errBadCheckpoint)
	}
	if string(hdr[16:48]) != string(key[:]) {
		return 0, usageError("the checkpoint is from a run with other flags or another world; not resuming from it")
	}
	return int64(step), nil
}

// maxStep bounds a checkpoint's step (as the state protection does).
const maxStep = 1<<53 - 1

// checkpoint writes the checkpoint after step s when it is due.
func (t *trainer) checkpoint(s int) error {
	if t.cfg.CkptEvery <= 0 || (s+1)%t.cfg.CkptEvery != 0 {
		return nil
	}
	if err := saveCheckpoint(t.cfg.CkptDir, t.rank, int64(s), t.stateKey(), t.m, t.v, t.master); err != nil {
		return fmt.Errorf("checkpoint of step %d: %w", s, err)
	}
	return nil
}

// saveCheckpoint writes rank's checkpoint atomically: to a temporary file,
// synced, then renamed over rank-<r>.ckpt (the previous one renamed to
// rank-<r>.ckpt.prev first), and the directory synced. A crash at any
// point leaves a whole checkpoint of the newest or of the one before.
func saveCheckpoint(dir string, rank int, step int64, key [32]byte, m, v, master []float32) error {
	path := ckptPath(dir, rank)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = writeCheckpoint(f, step, key, m, v, master)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = os.Rename(path, path+".prev"); errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// syncDir makes the renames in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// resumeCheckpoint resumes from the newest step that every rank has a
// checkpoint of (its own newest or the one before: a crash during a
// checkpoint leaves ranks one checkpoint apart at most), if any, and
// returns the first step to run. Every rank calls it.
func (t *trainer) resumeCheckpoint(ctx context.Context) (int, error) {
	// The steps this rank has: newest, then the one before; -1 for none.
	paths := []string{ckptPath(t.cfg.CkptDir, t.rank), ckptPath(t.cfg.CkptDir, t.rank) + ".prev"}
	var mine [16]byte
	steps := []int64{-1, -1}
	for i, p := range paths {
		s, err := t.loadCheckpoint(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		steps[i] = s
	}
	for i, s := range steps {
		binary.LittleEndian.PutUint64(mine[8*i:], uint64(s))
	}
	all, err := t.c.Allgather(ctx, mine[:])
	if err != nil {
		return 0, fmt.Errorf("comparing checkpoints: %w", err)
	}
	// have[s]: how many ranks have step s.
	have := map[int64]int{}
	anyone := false
	for r, b := range all {
		if len(b) != len(mine) {
			return 0, fmt.Errorf("comparing checkpoints: rank %d sent %d bytes", r, len(b))
		}
		a, c := int64(binary.LittleEndian.Uint64(b)), int64(binary.LittleEndian.Uint64(b[8:]))
		for _, s := range []int64{a, c} {
			if s >= 0 {
				have[s]++
				anyone = true
			}
		}
		if a >= 0 && a == c {
			have[a]-- // the same step twice on one rank counts once
		}
	}
	if !anyone {
		return 0, nil // join resets the state
	}
	best := int64(-1)
	for s, n := range have {
		if n == t.size && s > best {
			best = s
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("the ranks' checkpoints in %s have no step in common (this rank has %v); remove them to start afresh", t.cfg.CkptDir, steps)
	}
	i := 0
	if steps[0] != best {
		i = 1
	}
	s, err := t.loadCheckpoint(paths[i])
	if err != nil {
		return 0, err
	}
	if s != best {
		return 0, fmt.Errorf("checkpoint %s changed while resuming: step %d, was %d", paths[i], s, best)
	}
	if _, err := t.paramsFromShards(ctx); err != nil {
		return 0, err
	}
	return int(best) + 1, nil
}

// loadCheckpoint reads the checkpoint at path into the trainer's shard
// and returns its step.
func (t *trainer) loadCheckpoint(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s, err := readCheckpoint(f, t.stateKey(), t.m, t.v, t.master)
	if err != nil {
		return 0, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return s, nil
}
