package plan

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// unitScale is the multiplier of each size unit ParseSize takes: decimal
// (kB, MB, GB, TB: powers of 1000) and binary (KiB, MiB, GiB, TiB: powers
// of 1024). Matching ignores case except that "b" alone is bytes.
var unitScale = map[string]float64{
	"":    1,
	"b":   1,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
}

// ParseSize parses a size in bytes: a non-negative decimal number and an
// optional unit, "256MiB", "10GB", "1.5GiB", "4096". Errors wrap [ErrInput]
// and name the unit when it is the unit that is wrong.
func ParseSize(s string) (float64, error) {
	num, unit := splitUnit(strings.TrimSpace(s))
	if num == "" {
		return 0, inputf("%q: want a number and a unit, e.g. 256MiB or 10GB", shorten(s))
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, inputf("%q: %q is not a non-negative number", shorten(s), shorten(num))
	}
	scale, ok := unitScale[strings.ToLower(unit)]
	if !ok {
		return 0, inputf("%q: unknown unit %q: want B, kB, MB, GB, TB, KiB, MiB, GiB or TiB", shorten(s), shorten(unit))
	}
	v *= scale
	if math.IsInf(v, 0) {
		return 0, inputf("%q: too large", shorten(s))
	}
	return v, nil
}

// ParseBandwidth parses a bandwidth in bytes per second: a size and "/s",
// "10GB/s", "800MiB/s". Errors wrap [ErrInput].
func ParseBandwidth(s string) (float64, error) {
	t := strings.TrimSpace(s)
	size, ok := strings.CutSuffix(t, "/s")
	if !ok {
		return 0, inputf("%q: want a size per second, e.g. 10GB/s", shorten(s))
	}
	v, err := ParseSize(size)
	if err != nil {
		return 0, err
	}
	if v == 0 {
		return 0, inputf("%q: a bandwidth must be positive", shorten(s))
	}
	return v, nil
}

// ParseDuration parses a duration as time.ParseDuration does ("20s",
// "1h30m"), or a number of days, "30d", "1.5d". Errors wrap [ErrInput].
func ParseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(t, "d"); ok {
		v, err := strconv.ParseFloat(days, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || !digitsDot(days) {
			return 0, inputf("%q: want a duration, e.g. 20s, 1h30m or 30d", shorten(s))
		}
		d := v * 24 * float64(time.Hour)
		if d >= math.MaxInt64 {
			return 0, inputf("%q: too long", shorten(s))
		}
		return time.Duration(d), nil
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, inputf("%q: want a duration, e.g. 20s, 1h30m or 30d", shorten(s))
	}
	return d, nil
}

// splitUnit splits "256MiB" into "256" and "MiB".
func splitUnit(s string) (num, unit string) {
	i := len(s)
	for i > 0 {
		c := s[i-1]
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') {
			i--
			continue
		}
		break
	}
	return strings.TrimSpace(s[:i]), s[i:]
}

// digitsDot reports whether s is digits with at most one dot.
func digitsDot(s string) bool {
	if s == "" {
		return false
	}
	dots := 0
	for _, c := range s {
		switch {
		case c == '.':
			dots++
		case c < '0' || c > '9':
			return false
		}
	}
	return dots <= 1 && s != "."
}

// shorten keeps error messages bounded whatever the input.
func shorten(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// FormatBytes writes n bytes with a binary unit: "256 MiB".
func FormatBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.3g %s", n, units[i])
}

// FormatBandwidth writes a bandwidth with a decimal unit: "10 GB/s".
func FormatBandwidth(bps float64) string {
	units := []string{"B/s", "kB/s", "MB/s", "GB/s", "TB/s"}
	i := 0
	for bps >= 1000 && i < len(units)-1 {
		bps /= 1000
		i++
	}
	return fmt.Sprintf("%.3g %s", bps, units[i])
}
