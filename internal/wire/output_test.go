package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// decodeAll decodes b and returns its host and records; it fails the test
// if records come from more than one host.
func decodeAll(t *testing.T, b []byte, world int) (int, []wire.OutputRecord, error) {
	t.Helper()
	host := -1
	var recs []wire.OutputRecord
	err := wire.DecodeOutputFrame(b, world, func(h int, r wire.OutputRecord) {
		if host != -1 && h != host {
			t.Errorf("record from host %d after host %d", h, host)
		}
		host = h
		recs = append(recs, r)
	})
	return host, recs, err
}

func TestOutputFrameRoundTrip(t *testing.T) {
	mib := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	recs := []wire.OutputRecord{
		{Rank: 0, Stream: wire.Stdout, Data: []byte{}},
		{Rank: 3, Stream: wire.Stderr, Data: []byte("a\x00b\x00\xff")},
		{Rank: 1, Stream: wire.Stdout, Data: []byte("line 1\nline 2\n")},
		{Rank: 300, Stream: wire.Stdout, Data: mib},
		{Rank: 0, Stream: wire.Stderr, Data: []byte("\n")},
	}
	for _, host := range []int{0, 7, 200, wire.MaxHosts - 1} {
		f := wire.NewOutputFrame(host)
		if !f.Empty() || f.Host() != host {
			t.Fatalf("new frame: Empty() = %v, Host() = %d", f.Empty(), f.Host())
		}
		for _, r := range recs {
			f.Add(r.Rank, r.Stream, r.Data)
		}
		if f.Empty() {
			t.Fatal("Empty() after Add")
		}
		if f.Len() != len(f.Bytes()) {
			t.Errorf("Len() = %d, len(Bytes()) = %d", f.Len(), len(f.Bytes()))
		}
		if f.Len() > len(mib)+100 {
			t.Errorf("frame is %d bytes for %d bytes of data", f.Len(), len(mib)+21)
		}
		h, got, err := decodeAll(t, f.Bytes(), 301)
		if err != nil {
			t.Fatalf("host %d: %v", host, err)
		}
		if h != host {
			t.Errorf("decoded host %d, want %d", h, host)
		}
		if !reflect.DeepEqual(got, recs) {
			t.Fatalf("host %d: decoded %d records, want %d (or data differs)", host, len(got), len(recs))
		}
	}
}

// TestOutputFrameDataAliases checks that decoded data aliases the frame but
// is capped, so appending to one record cannot overwrite the next.
func TestOutputFrameDataAliases(t *testing.T) {
	f := wire.NewOutputFrame(0)
	f.Add(0, wire.Stdout, []byte("ab"))
	f.Add(1, wire.Stdout, []byte("cd"))
	b := bytes.Clone(f.Bytes())
	_, recs, err := decodeAll(t, b, 2)
	if err != nil {
		t.Fatal(err)
	}
	if cap(recs[0].Data) != 2 {
		t.Errorf("cap(Data) = %d, want 2", cap(recs[0].Data))
	}
	_ = append(recs[0].Data, "XXXXXX"...)
	if string(recs[1].Data) != "cd" {
		t.Errorf("appending to record 0 changed record 1 to %q", recs[1].Data)
	}
}

func TestOutputFrameReset(t *testing.T) {
	f := wire.NewOutputFrame(1)
	f.Add(0, wire.Stdout, bytes.Repeat([]byte("x"), 1000))
	f.Add(1, wire.Stderr, []byte("old\n"))

	f.Reset(9)
	if !f.Empty() || f.Host() != 9 {
		t.Fatalf("after Reset: Empty() = %v, Host() = %d", f.Empty(), f.Host())
	}
	h, recs, err := decodeAll(t, f.Bytes(), 2)
	if err != nil || len(recs) != 0 {
		t.Fatalf("empty frame decoded to %v, %v", recs, err)
	}
	if h != -1 {
		t.Errorf("callback called for an empty frame")
	}

	f.Add(1, wire.Stderr, []byte("new\n"))
	h, recs, err = decodeAll(t, f.Bytes(), 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []wire.OutputRecord{{Rank: 1, Stream: wire.Stderr, Data: []byte("new\n")}}
	if h != 9 || !reflect.DeepEqual(recs, want) {
		t.Errorf("after Reset and Add: host %d records %+v, want host 9 %+v", h, recs, want)
	}

	// Reset to a host whose index takes more bytes, then back.
	f.Reset(1 << 19)
	f.Reset(0)
	if f.Len() != 3 {
		t.Errorf("Len() of an empty frame for host 0 = %d, want 3", f.Len())
	}
}

func TestDecodeOutputFrameRejects(t *testing.T) {
	const world = 4
	frame := func(host int, recs ...wire.OutputRecord) []byte {
		f := wire.NewOutputFrame(host)
		for _, r := range recs {
			f.Add(r.Rank, r.Stream, r.Data)
		}
		return bytes.Clone(f.Bytes())
	}
	ok := wire.OutputRecord{Rank: 1, Stream: wire.Stdout, Data: []byte("fine\n")}
	good := frame(2, ok, ok)
	uv := func(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }
	overflow := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}

	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"magic only", []byte{'O'}},
		{"bad magic", append([]byte{'T'}, good[1:]...)},
		{"version 0", append([]byte{'O', 0}, good[2:]...)},
		{"version 2", append([]byte{'O', 2}, good[2:]...)},
		{"no host", []byte{'O', 1}},
		{"truncated host", []byte{'O', 1, 0x80}},
		{"host varint overflow", append([]byte{'O', 1}, overflow...)},
		{"host MaxHosts", frame(wire.MaxHosts)},
		{"rank is world", frame(0, ok, wire.OutputRecord{Rank: world, Stream: wire.Stdout})},
		{"negative rank", frame(0, ok, wire.OutputRecord{Rank: -1, Stream: wire.Stdout})},
		{"rank varint overflow", append(frame(0, ok), overflow...)},
		{"truncated rank", append(frame(0, ok), 0x80)},
		{"missing stream", append(frame(0, ok), 1)},
		{"stream 0", frame(0, ok, wire.OutputRecord{Rank: 0, Stream: 0})},
		{"stream 3", frame(0, ok, wire.OutputRecord{Rank: 0, Stream: 3})},
		{"missing length", append(frame(0, ok), 1, byte(wire.Stdout))},
		{"truncated length", append(frame(0, ok), 1, byte(wire.Stdout), 0x80)},
		{"length varint overflow", append(append(frame(0, ok), 1, byte(wire.Stdout)), overflow...)},
		{"length one past end", uv(append(frame(0, ok), 1, byte(wire.Stdout)), 1)},
		{"length past end", append(uv(append(frame(0, ok), 1, byte(wire.Stdout)), 10), "short"...)},
		{"huge length", append(uv(append(frame(0, ok), 1, byte(wire.Stdout)), 1<<63), "x"...)},
		{"max length", append(uv(append(frame(0, ok), 1, byte(wire.Stdout)), ^uint64(0)), "x"...)},
		{"truncated data", good[:len(good)-1]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			called := 0
			err := wire.DecodeOutputFrame(tc.in, world, func(int, wire.OutputRecord) { called++ })
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("DecodeOutputFrame(%s) = %v, want ErrMalformed", short(tc.in), err)
			}
			if called != 0 {
				t.Errorf("callback called %d times for an invalid frame", called)
			}
		})
	}
}

// TestDecodeOutputFrameWorld checks the world bound: a rank must be below
// world, and a world outside [1, MaxWorld] is refused.
func TestDecodeOutputFrameWorld(t *testing.T) {
	f := wire.NewOutputFrame(0)
	if err := wire.DecodeOutputFrame(f.Bytes(), 0, func(int, wire.OutputRecord) {
		t.Error("callback called for an empty frame")
	}); !errors.Is(err, wire.ErrMalformed) {
		t.Errorf("empty frame, world 0: %v, want ErrMalformed", err)
	}
	f.Add(wire.MaxWorld-1, wire.Stdout, nil)
	for _, tc := range []struct {
		world int
		ok    bool
	}{{0, false}, {1, false}, {wire.MaxWorld - 1, false}, {wire.MaxWorld, true}} {
		err := wire.DecodeOutputFrame(f.Bytes(), tc.world, func(int, wire.OutputRecord) {})
		if (err == nil) != tc.ok {
			t.Errorf("rank %d, world %d: err = %v, want ok=%v", wire.MaxWorld-1, tc.world, err, tc.ok)
		}
	}
}

func BenchmarkOutputFrame(b *testing.B) {
	line := bytes.Repeat([]byte("x"), 127)
	line = append(line, '\n')
	f := wire.NewOutputFrame(3)
	b.SetBytes(64 * int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		f.Reset(3)
		for r := range 64 {
			f.Add(r, wire.Stdout, line)
		}
		if err := wire.DecodeOutputFrame(f.Bytes(), 64, func(int, wire.OutputRecord) {}); err != nil {
			b.Fatal(err)
		}
	}
}
