package main

import (
	"runtime/debug"
	"testing"
)

// TestAgentGCPercent: the agent collects at GOGC=25 unless the
// environment sets GOGC, which then wins.
func TestAgentGCPercent(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "64GiB") // leaves the runtime's memory limit alone
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })
	for _, tc := range []struct {
		env  string
		want int
	}{{"", agentGOGC}, {"200", 100}} {
		t.Setenv("GOGC", tc.env)
		debug.SetGCPercent(100)
		setMemoryLimit()
		if got := debug.SetGCPercent(100); got != tc.want {
			t.Errorf("GOGC=%q: the agent's GC percent is %d, want %d", tc.env, got, tc.want)
		}
	}
}
