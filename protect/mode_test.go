package protect

import (
	"math"
	"testing"

	"github.com/gorun/gorun/replay"
)

func TestParseDiffCodec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want replay.Options
		bad  bool
	}{
		{in: "raw", want: replay.Options{Lossless: true}},
		{in: "int8", want: replay.Options{Threshold: math.MaxInt}},
		{in: "int8:64", want: replay.Options{Threshold: math.MaxInt, BlockSize: 64}},
		{in: "topk:0.01", want: replay.Options{Threshold: 1, K: 0.01}},
		{in: "topk:1", want: replay.Options{Threshold: 1, K: 1}},
		{in: "", bad: true},
		{in: "raw:1", bad: true},
		{in: "int8:0", bad: true},
		{in: "int8:x", bad: true},
		{in: "topk", bad: true},
		{in: "topk:0", bad: true},
		{in: "topk:1.5", bad: true},
		{in: "topk:NaN", bad: true},
		{in: "zstd", bad: true},
	} {
		got, err := ParseDiffCodec(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseDiffCodec(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseDiffCodec(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseProtectMode(t *testing.T) {
	for in, want := range map[string]ProtectMode{"full": ModeFull, "diff": ModeDiff, "": "", "Diff": "", "delta": ""} {
		got, err := ParseProtectMode(in)
		if (err == nil) != (want != "") || got != want {
			t.Errorf("ParseProtectMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
