package keeper

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/gorun/gorun/internal/crc32c"
)

// FuzzParseECHdr: no sub-header panics the parser, and what it accepts
// is in range and encodes back to the same bytes.
func FuzzParseECHdr(f *testing.F) {
	var b [ecHdrSize]byte
	(&ecHdr{group: 1, stripe: 2, row: 1, member: 3, crc: 7, off: 64, n: 4096, epoch: 5}).put(b[:])
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < ecHdrSize {
			return
		}
		e, err := parseECHdr(in[:ecHdrSize])
		if err != nil {
			return
		}
		if e.off < 0 || e.n < 0 || e.off+e.n > maxShard || e.row >= 256 || e.member >= 256 {
			t.Fatalf("accepted %+v", e)
		}
		var out [ecHdrSize]byte
		e.put(out[:])
		if !bytes.Equal(out[:], in[:ecHdrSize]) {
			t.Fatalf("%x encodes back as %x", in[:ecHdrSize], out)
		}
	})
}

// FuzzReadMembers: no ecGet answer panics the members' reader, and what
// it accepts is consistent.
func FuzzReadMembers(f *testing.F) {
	f.Add(appendMembers(nil, []ecMember{{rank: 1, gen: 2, epoch: 3, length: 12, table: []tableEntry{{name: "optimizer", size: 12, sum: 9}}}}))
	f.Add(appendMembers(nil, []ecMember{{rank: 1, length: 0}, {rank: 2, length: 0}}))
	f.Fuzz(func(t *testing.T, in []byte) {
		ms, err := readMembers(bytes.NewReader(in))
		if err != nil {
			return
		}
		for _, m := range ms {
			if m.length < 0 || int64(tableBytes(m.table)) != m.length {
				t.Fatalf("accepted %+v", m)
			}
		}
		if !bytes.HasPrefix(in, appendMembers(nil, ms)) {
			t.Fatal("the members do not encode back to the input")
		}
	})
}

// TestReadSum: readSum fills its buffer from reads of any size (more than
// readPiece, a byte at a time) and returns the CRC32C of all its bytes; a
// stream that ends early is an io.ErrUnexpectedEOF, a failed read that
// read's error.
func TestReadSum(t *testing.T) {
	data := make([]byte, 3*readPiece+123)
	for i := range data {
		data[i] = byte(i*31 + i>>9)
	}
	broken := errors.New("broken")
	for _, tc := range []struct {
		name string
		n    int // bytes to read
		r    io.Reader
		err  error
	}{
		{"whole", len(data), bytes.NewReader(data), nil},
		{"one byte at a time", readPiece + 5, iotest.OneByteReader(bytes.NewReader(data)), nil},
		{"half reads", len(data), iotest.HalfReader(bytes.NewReader(data)), nil},
		{"short", len(data), bytes.NewReader(data[:len(data)-1]), io.ErrUnexpectedEOF},
		{"failed", len(data), io.MultiReader(bytes.NewReader(data[:readPiece+7]), iotest.ErrReader(broken)), broken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := make([]byte, tc.n)
			sum, err := readSum(tc.r, d)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if want := crc32c.Checksum(data[:tc.n]); sum != want {
				t.Errorf("CRC32C %08x, want %08x", sum, want)
			}
			if !bytes.Equal(d, data[:tc.n]) {
				t.Error("the bytes read differ")
			}
		})
	}
}
