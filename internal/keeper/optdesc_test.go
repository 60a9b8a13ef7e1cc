package keeper

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
)

// optDescTable is the table the optimizer descriptor tests name regions of.
var optDescTable = []tableEntry{{"optimizer", 4096, 0}, {"meta", 64, 0}}

func optDescBytes(idx uint32, reserved uint32, n, w, m, v int64) []byte {
	b := binary.BigEndian.AppendUint32(nil, idx)
	b = binary.BigEndian.AppendUint32(b, reserved)
	for _, x := range []int64{n, w, m, v} {
		b = binary.BigEndian.AppendUint64(b, uint64(x))
	}
	return b
}

// TestParseOptDesc: a base's and a logBegin's optimizer descriptor names
// a region of the frame's table and keeps its reserved bytes zero;
// anything else is refused with an error naming it (the holders used to
// read the reserved bytes without looking at them).
func TestParseOptDesc(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want diffstore.Optimizer
		err  string
	}{
		{"valid", optDescBytes(0, 0, 256, 0, 1024, 2048), diffstore.Optimizer{Region: "optimizer", N: 256, WOff: 0, MOff: 1024, VOff: 2048}, ""},
		{"second region", optDescBytes(1, 0, 4, 0, 16, 32), diffstore.Optimizer{Region: "meta", N: 4, WOff: 0, MOff: 16, VOff: 32}, ""},
		{"short", optDescBytes(0, 0, 1, 2, 3, 4)[:optDescSize-1], diffstore.Optimizer{}, "descriptor of 39 bytes"},
		{"region past the table", optDescBytes(2, 0, 1, 0, 4, 8), diffstore.Optimizer{}, "optimizer region 2 of 2"},
		{"huge region index", optDescBytes(0xffffffff, 0, 1, 0, 4, 8), diffstore.Optimizer{}, "optimizer region 4294967295 of 2"},
		{"reserved bytes set", optDescBytes(0, 1, 256, 0, 1024, 2048), diffstore.Optimizer{}, "reserved bytes 0x1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseOptDesc(tc.in, optDescTable)
			if tc.err != "" {
				if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.err)) {
					t.Fatalf("parseOptDesc = %+v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseOptDesc = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// FuzzOptDesc: parseOptDesc never panics, and a descriptor it and
// diffstore accept is the one appendOptDesc writes for that layout.
func FuzzOptDesc(f *testing.F) {
	f.Add(optDescBytes(0, 0, 256, 0, 1024, 2048))
	f.Add(optDescBytes(1, 0, 4, 0, 16, 32))
	f.Add(optDescBytes(0, 7, 256, 0, 1024, 2048))
	f.Add(optDescBytes(0, 0, -1, 0, 0, 0))
	f.Add(optDescBytes(0, 0, 1<<61, 1<<62, 0, 4))
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		opt, err := parseOptDesc(in, optDescTable)
		if err != nil {
			return
		}
		if len(in) < optDescSize || binary.BigEndian.Uint32(in[4:]) != 0 {
			t.Fatalf("accepted %x as %+v", in, opt)
		}
		regions := make([]diffstore.Region, len(optDescTable))
		idx := -1
		for i, e := range optDescTable {
			regions[i] = diffstore.Region{Name: e.name, Size: e.size}
			if e.name == opt.Region {
				idx = i
			}
		}
		if _, err := diffstore.NewLog(regions, opt); err != nil {
			return // the layout is diffstore's to refuse
		}
		back := appendOptDesc(nil, idx, &protect.Optimizer{Region: opt.Region, N: opt.N, W: opt.WOff, M: opt.MOff, V: opt.VOff})
		if !bytes.Equal(back, in[:optDescSize]) {
			t.Fatalf("descriptor %x parses as %+v, which encodes as %x", in[:optDescSize], opt, back)
		}
	})
}
