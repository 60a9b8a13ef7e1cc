package plan

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// byteUnits is the multiplier of each size unit: decimal (kB or KB, MB,
// GB, TB: powers of 1000) and binary (KiB, MiB, GiB, TiB: powers of
// 1024). Units are case-sensitive: b is a bit, B a byte.
var byteUnits = map[string]float64{
	"":    1,
	"B":   1,
	"kB":  1e3,
	"KB":  1e3,
	"MB":  1e6,
	"GB":  1e9,
	"TB":  1e12,
	"KiB": 1 << 10,
	"MiB": 1 << 20,
	"GiB": 1 << 30,
	"TiB": 1 << 40,
}

// bitUnits is the multiplier, in bytes, of each bit unit a bandwidth may
// be given in: "10Gbit/s" and "10Gb/s" are 1.25 GB/s.
var bitUnits = map[string]float64{
	"b": 1.0 / 8, "bit": 1.0 / 8,
	"kb": 1e3 / 8, "Kb": 1e3 / 8, "kbit": 1e3 / 8, "Kbit": 1e3 / 8,
	"Mb": 1e6 / 8, "Mbit": 1e6 / 8,
	"Gb": 1e9 / 8, "Gbit": 1e9 / 8,
	"Tb": 1e12 / 8, "Tbit": 1e12 / 8,
}

const byteUnitList = "B, kB, MB, GB, TB, KiB, MiB, GiB or TiB"

// ParseSize parses a size in bytes: a non-negative decimal number and an
// optional unit, "256MiB", "10GB", "1.5GiB", "4096". Units are
// case-sensitive, and bits ("10Gb") are refused with a hint. Errors wrap
// [ErrInput] and name the unit when it is the unit that is wrong.
func ParseSize(s string) (float64, error) { return parseQuantity(s, s, false) }

// parseQuantity parses a number and a unit of byteUnits, or of bitUnits
// too when bits; whole is what errors quote.
func parseQuantity(s, whole string, bits bool) (float64, error) {
	num, unit := splitUnit(strings.TrimSpace(s))
	if num == "" {
		return 0, inputf("%q: want a number and a unit, e.g. 256MiB or 10GB", shorten(whole))
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, inputf("%q: %q is not a non-negative number", shorten(whole), shorten(num))
	}
	scale, ok := byteUnits[unit]
	if !ok && bits {
		scale, ok = bitUnits[unit]
	}
	if !ok {
		if _, isBits := bitUnits[unit]; isBits { // and not bits
			return 0, inputf("%q: %q is bits: a size is in bytes (%s)", shorten(whole), unit, byteUnitList)
		}
		for u := range byteUnits {
			if u != "" && strings.EqualFold(u, unit) {
				return 0, inputf("%q: unknown unit %q: units are case-sensitive: %s (b is bits, B bytes)", shorten(whole), shorten(unit), u)
			}
		}
		if bits {
			return 0, inputf("%q: unknown unit %q: want %s, or bits: bit, kbit, Mbit, Gbit, Tbit (or b, kb, Mb, Gb, Tb)", shorten(whole), shorten(unit), byteUnitList)
		}
		return 0, inputf("%q: unknown unit %q: want %s", shorten(whole), shorten(unit), byteUnitList)
	}
	v *= scale
	if math.IsInf(v, 0) {
		return 0, inputf("%q: too large", shorten(whole))
	}
	return v, nil
}

// ParseBandwidth parses a bandwidth in bytes per second: a size and "/s",
// "10GB/s", "800MiB/s", or bits per second, "100Gbit/s" or "100Gb/s"
// (12.5 GB/s). Errors wrap [ErrInput].
func ParseBandwidth(s string) (float64, error) {
	t := strings.TrimSpace(s)
	size, ok := strings.CutSuffix(t, "/s")
	if !ok {
		return 0, inputf("%q: want a size per second, e.g. 10GB/s or 100Gbit/s", shorten(s))
	}
	v, err := parseQuantity(size, size, true)
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
