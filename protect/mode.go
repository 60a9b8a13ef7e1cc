package protect

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gorun/gorun/replay"
)

// ParseProtectMode parses gorun --protect-mode: "full" or "diff".
func ParseProtectMode(s string) (ProtectMode, error) {
	switch m := ProtectMode(s); m {
	case ModeFull, ModeDiff:
		return m, nil
	}
	return "", fmt.Errorf("protect mode %q: want full or diff", s)
}

// ParseDiffCodec parses gorun --diff-codec, how differential protection
// encodes each step's gradient:
//
//	raw       lossless (the default): a restore is bitwise
//	int8[:B]  8-bit blocks of B elements (default 256), lossy
//	topk:K    the fraction K in (0, 1] of the largest entries, lossy
//
// A lossy codec restores an approximation of the state; it is never
// called bitwise.
func ParseDiffCodec(s string) (replay.Options, error) {
	name, arg, hasArg := strings.Cut(s, ":")
	switch name {
	case "raw":
		if hasArg {
			return replay.Options{}, fmt.Errorf("diff codec %q: raw takes no argument", s)
		}
		return replay.Options{Lossless: true}, nil
	case "int8":
		o := replay.Options{Threshold: math.MaxInt}
		if hasArg {
			b, err := strconv.Atoi(arg)
			if err != nil || b < 1 || b > 1<<30 {
				return replay.Options{}, fmt.Errorf("diff codec %q: want int8:B with a block of 1 to 2^30 elements", s)
			}
			o.BlockSize = b
		}
		return o, nil
	case "topk":
		k, err := strconv.ParseFloat(arg, 64)
		if !hasArg || err != nil || !(k > 0 && k <= 1) {
			return replay.Options{}, fmt.Errorf("diff codec %q: want topk:K with 0 < K ≤ 1 (the fraction of entries kept)", s)
		}
		return replay.Options{Threshold: 1, K: k}, nil
	}
	return replay.Options{}, fmt.Errorf("diff codec %q: want raw, int8[:B] or topk:K", s)
}
