package gortest

import (
	"os"
	"strconv"
	"testing"
)

// EnvMiB is the positive number of MiB the environment variable name
// gives a benchmark (e.g. GORUN_BENCH_STATE_MIB=256 from make bench-ec),
// or def when it is unset. Anything else fails the benchmark, naming the
// variable.
func EnvMiB(tb testing.TB, name string, def int) int {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		tb.Fatalf("%s=%q: want a positive number of MiB", name, s)
	}
	return v
}
