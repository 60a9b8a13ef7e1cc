package crc32c

import "time"

var start = time.Now()

// nanotime is a monotonic clock in nanoseconds, for BenchmarkRatio.
func nanotime() int64 { return int64(time.Since(start)) }
