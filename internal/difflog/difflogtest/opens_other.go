//go:build !linux

package difflogtest

import (
	"strings"
	"testing"
)

// WatchOpens skips the test: seeing which files are opened needs
// inotify (Linux).
func WatchOpens(t testing.TB, dir string) func() []string {
	t.Helper()
	t.Skip("no inotify on this platform: cannot see which files are opened")
	return nil
}

// BatchesOpened returns the batch files (diff.*) among names.
func BatchesOpened(names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "diff.") {
			out = append(out, n)
		}
	}
	return out
}
