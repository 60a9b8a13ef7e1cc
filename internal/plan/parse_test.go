package plan

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
		err  string
	}{
		{"256MiB", 256 << 20, ""},
		{"10GB", 10e9, ""},
		{"1.5GiB", 1.5 * (1 << 30), ""},
		{"4096", 4096, ""},
		{"12 kB", 12e3, ""},
		{"12 KB", 12e3, ""},
		// units are case-sensitive; b is bits, which a size is not in
		{"12 kb", 0, `"kb" is bits`},
		{"10Gb", 0, `"Gb" is bits`},
		{"10gb", 0, `units are case-sensitive: GB`},
		{"10gib", 0, `units are case-sensitive: GiB`},
		{"10Gbit", 0, `"Gbit" is bits`},
		{"0", 0, ""},
		{"10XB", 0, `unknown unit "XB"`},
		{"-1GB", 0, "not a non-negative number"},
		{"GB", 0, "want a number"},
		{"", 0, "want a number"},
		{"1e400GB", 0, "not a non-negative number"},
	} {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseSize(c.in)
			check(t, got, err, c.want, c.err)
		})
	}
}

func TestParseBandwidth(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
		err  string
	}{
		{"10GB/s", 10e9, ""},
		{"800MiB/s", 800 << 20, ""},
		{"10GB", 0, "per second"},
		{"0GB/s", 0, "positive"},
		// b is bits: 8 to the byte
		{"10Gb/s", 10e9 / 8, ""},
		{"100Gbit/s", 100e9 / 8, ""},
		{"800Mbit/s", 100e6, ""},
		{"1kbit/s", 125, ""},
		{"10gb/s", 0, "units are case-sensitive: GB"},
		{"10GBit/s", 0, "unknown unit"},
	} {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseBandwidth(c.in)
			check(t, got, err, c.want, c.err)
		})
	}
}

func TestParseDuration(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"20s", 20 * time.Second, ""},
		{"1h30m", 90 * time.Minute, ""},
		{"30d", 30 * 24 * time.Hour, ""},
		{"1.5d", 36 * time.Hour, ""},
		{"d", 0, "want a duration"},
		{"-1d", 0, "want a duration"},
		{"20", 0, "want a duration"},
		{"9999999999d", 0, "too long"},
	} {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseDuration(c.in)
			check(t, float64(got), err, float64(c.want), c.err)
		})
	}
}

func check(t *testing.T, got float64, err error, want float64, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("err = %v, want an ErrInput containing %q", err, wantErr)
		}
		return
	}
	if err != nil || got != want {
		t.Errorf("= %v, %v; want %v", got, err, want)
	}
}

func TestParseTrace(t *testing.T) {
	for _, c := range []struct {
		name     string
		in       string
		want     []Failure
		line     int
		contains string
	}{
		{"seconds and durations, sorted", "# t,host\n7200,n2\n\n3600.5\n1h,n1\n", []Failure{
			{At: time.Hour, Host: "n1"}, {At: 3600500 * time.Millisecond}, {At: 2 * time.Hour, Host: "n2"}}, 0, ""},
		{"days", "2d,a\n", []Failure{{At: 48 * time.Hour, Host: "a"}}, 0, ""},
		{"negative", "10\n-5,n1\n", nil, 2, "negative"},
		{"bad time", "10\nsoon,n1\n", nil, 2, `time "soon"`},
		{"empty host", "10,\n", nil, 1, "empty host"},
		{"host with a space", "10,a b\n", nil, 1, "no spaces"},
		// real failure logs (review finding 11): extra columns, a header,
		// RFC 3339 timestamps (relative to the first, or to a start)
		{"extra columns ignored", "3600,n1,xid-79,GPU fell off the bus\n", []Failure{{At: time.Hour, Host: "n1"}}, 0, ""},
		{"header skipped", "time,host\n3600,n1\n", []Failure{{At: time.Hour, Host: "n1"}}, 0, ""},
		{"only the first line is a header", "3600,n1\ntime,host\n", nil, 2, `time "time"`},
		{"rfc3339 from the first", "2026-01-05T12:00:00Z,n2\n2026-01-05T10:00:00Z,n1\n", []Failure{
			{At: 0, Host: "n1"}, {At: 2 * time.Hour, Host: "n2"}}, 0, ""},
		{"rfc3339 with an offset", "2026-01-05T10:00:00Z,n1\n2026-01-05T12:30:00+02:00,n2\n", []Failure{
			{At: 0, Host: "n1"}, {At: 30 * time.Minute, Host: "n2"}}, 0, ""},
		{"absolute and relative mixed", "2026-01-05T10:00:00Z\n3600\n", nil, 2, "mixes"},
		{"empty file", "# nothing\n", nil, 0, "no failures"},
		{"overlong line", strings.Repeat("1", MaxTraceLine+1), nil, 1, "unreadable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseTrace(strings.NewReader(c.in), "trace.csv", time.Time{})
			checkTrace(t, got, err, c.want, c.line, c.contains)
		})
	}
}

// With a start, absolute times count from it; one before it is an error.
func TestParseTraceStart(t *testing.T) {
	start := time.Date(2026, 1, 5, 9, 0, 0, 0, time.UTC)
	got, err := ParseTrace(strings.NewReader("2026-01-05T10:00:00Z,n1\n"), "trace.csv", start)
	checkTrace(t, got, err, []Failure{{At: time.Hour, Host: "n1"}}, 0, "")
	_, err = ParseTrace(strings.NewReader("2026-01-05T10:00:00Z\n2026-01-05T08:00:00Z\n"), "trace.csv", start)
	checkTrace(t, nil, err, nil, 2, "before the trace's start")
}

func checkTrace(t *testing.T, got []Failure, err error, want []Failure, line int, contains string) {
	t.Helper()
	if contains != "" {
		if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), contains) || !strings.HasPrefix(err.Error(), "trace.csv: ") {
			t.Fatalf("err = %v, want ErrTrace from trace.csv containing %q", err, contains)
		}
		var te *TraceError
		if line > 0 && (!errors.As(err, &te) || te.Line != line) {
			t.Errorf("err = %v, want line %d", err, line)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("[%d] = %v, want %v", i, got[i], want[i])
		}
	}
}

func FuzzParseTrace(f *testing.F) {
	for _, s := range []string{"3600,n1\n7200\n", "# c\n\n1h,a\n", "-1\n", "1,,\n", "2d\n", "1e308\n", "99999999999999999999\n",
		"time,host\n2026-01-05T10:00:00Z,n1,79\n", "0001-01-01T00:00:00Z\n9999-12-31T23:59:59Z\n", "2026-01-05T10:00:00+14:00\n3600\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fs, err := ParseTrace(strings.NewReader(s), "f", time.Time{})
		if err != nil {
			if !errors.Is(err, ErrTrace) {
				t.Fatalf("error %v does not wrap ErrTrace", err)
			}
			return
		}
		for i, f := range fs {
			if f.At < 0 || (i > 0 && fs[i-1].At > f.At) || strings.ContainsAny(f.Host, ", \t") {
				t.Fatalf("bad failure %d: %+v", i, f)
			}
		}
	})
}

func FuzzParseUnits(f *testing.F) {
	for _, s := range []string{"256MiB", "10GB/s", "1h30m", "30d", "-1", "1e999GB", ".d", "NaNGB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := ParseSize(s); err == nil && !(v >= 0) {
			t.Fatalf("ParseSize(%q) = %v", s, v)
		} else if err != nil && !errors.Is(err, ErrInput) {
			t.Fatalf("ParseSize(%q): %v does not wrap ErrInput", s, err)
		}
		if v, err := ParseBandwidth(s); err == nil && !(v > 0) {
			t.Fatalf("ParseBandwidth(%q) = %v", s, v)
		}
		if _, err := ParseDuration(s); err != nil && !errors.Is(err, ErrInput) {
			t.Fatalf("ParseDuration(%q): %v does not wrap ErrInput", s, err)
		}
	})
}
