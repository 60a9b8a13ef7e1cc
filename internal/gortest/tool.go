package gortest

import (
	"os"
	"os/exec"
	"testing"
)

// Tool returns the path of the program name, found on PATH. Without it
// the test is skipped, saying what installs it, or fails under
// GORUN_TESTCLUSTER_REQUIRE=1 (CI, which installs every tool the tests
// use).
func Tool(tb testing.TB, name, install string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("GORUN_TESTCLUSTER_REQUIRE") == "1" {
			tb.Fatalf("%s not found (%s)", name, install)
		}
		tb.Skipf("no %s (%s)", name, install)
	}
	return p
}
