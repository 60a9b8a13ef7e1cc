package diffstore

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/gorun/gorun/replay"
)

// FuzzAppend feeds Append differentials of random bytes and fields: it
// must never panic, a refused one must leave the store unchanged, and an
// accepted one must restore.
func FuzzAppend(f *testing.F) {
	o := newOwner(30, 16, lossless)
	good := o.next(f)
	f.Add(int64(1), 100, float32(1e-3), float32(0.01), good.Record, good.Other[metaName])
	int8, _ := replay.Compress(0, make([]float32, 16), replay.Options{})
	rec, _ := (&replay.Record{Step: 1, Tensors: []*replay.Tensor{int8}}).AppendBinary(nil)
	f.Add(int64(1), 100, float32(1e-3), float32(0), rec, make([]byte, metaSize))
	f.Add(int64(2), 1, float32(-1), float32(0), []byte("GRDF"), []byte{})
	f.Fuzz(func(t *testing.T, step int64, tt int, lr, wd float32, record, meta []byte) {
		o := newOwner(30, 16, lossless)
		s := o.newStore(t)
		sendBase(t, s, o, 0)
		before := observe(s)
		d := Diff{Step: step, Hyper: replay.Hyper{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: wd, T: tt}, Record: record, Other: map[string][]byte{metaName: meta}}
		d.Seal()
		if err := s.Append(d); err != nil {
			if after := observe(s); after != before {
				t.Fatalf("a refused Append changed the store: %+v, was %+v", after, before)
			}
			return
		}
		got, err := restore(s, step, replay.ReplayOptions{})
		if err != nil {
			t.Fatalf("restore of an accepted differential: %v", err)
		}
		if !bytes.Equal(got[metaName], meta) {
			t.Fatal("the restored meta is not the differential's")
		}
	})
}

// FuzzBaseWriter writes random chunks into a refresh and commits it with
// random checksums: it must never panic, and a refused commit must leave
// the store unchanged.
func FuzzBaseWriter(f *testing.F) {
	f.Add(uint8(0), int64(0), []byte{1, 2, 3}, uint32(0), uint8(0))
	f.Add(uint8(1), int64(60), []byte{1, 2, 3, 4, 5}, uint32(7), uint8(1))
	f.Add(uint8(2), int64(-1), []byte{}, uint32(7), uint8(2))
	f.Fuzz(func(t *testing.T, region uint8, off int64, data []byte, sum uint32, how uint8) {
		o := newOwner(31, 16, lossless)
		s := o.newStore(t)
		sendBase(t, s, o, 0)
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
		before := observe(s)
		w, err := s.BeginBase(1)
		if err != nil {
			t.Fatal(err)
		}
		name := []string{optName, metaName, "x", ""}[region%4]
		_ = w.Write(name, off, data)
		st := sums(o.states[1])
		switch how % 3 {
		case 0:
			st[name] = sum
		case 1:
			delete(st, metaName)
		case 2:
			st = map[string]uint32{optName: sum, string(data): binary.LittleEndian.Uint32(append(data, 0, 0, 0, 0))}
		}
		if err := w.Commit(int64(how%2), st); err != nil {
			after := observe(s)
			if before.stats.RefreshBytes, after.stats.RefreshBytes = 0, 0; after != before {
				t.Fatalf("a refused Commit changed the store: %+v, was %+v", after, before)
			}
			checkRange(t, s, o, 0, 1, replay.ReplayOptions{})
			return
		}
		checkRange(t, s, o, 1, 1, replay.ReplayOptions{})
	})
}
