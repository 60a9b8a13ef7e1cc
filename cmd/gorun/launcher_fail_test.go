package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// restartScript is a rank for TestHostLostAfterRestart: in generation 0
// rank 0 ends well at once and rank 1 fails once the file $GO exists; in
// generation 1 every rank runs until it is stopped.
const restartScript = `
if [ "$GORUN_RESTART_COUNT" = 0 ]; then
	if [ "$GORUN_RANK" = 0 ]; then echo "job $GORUN_JOB_ID"; echo first done; exit 0; fi
	while [ ! -e "$GO" ]; do sleep 0.05; done
	echo failing; exit 3
fi
echo "generation $GORUN_RESTART_COUNT running"
exec sleep 600
`

// TestHostLostAfterRestart: a host whose ranks all ended before a restart
// takes part in the restart, and its loss afterwards (crash or partition)
// is noticed and stops the job.
func TestHostLostAfterRestart(t *testing.T) {
	tests := []struct {
		name      string
		fail      func(h *testcluster.Hosts, i int) error
		before    bool // fail host 0 before the restart, once its ranks are done
		partition bool
		code      int    // gorun's exit code
		want      string // in the report
	}{
		{"crash", (*testcluster.Hosts).KillAll, false, false, 1, "agent on host %s ended unexpectedly"},
		{"partition", (*testcluster.Hosts).LinkDown, false, true, 1, "host %s lost: no heartbeat"},
		// A restart cannot start ranks on a host whose agent is gone.
		{"crash before", (*testcluster.Hosts).KillAll, true, false, 3, "cannot restart the ranks: the agent on host %s has ended"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hosts := testcluster.NetnsHosts(t, 2)
			hf := hosts.WriteHostfile(t, t.TempDir(), 1)
			goFile := filepath.Join(t.TempDir(), "go")
			timeout := 1500 * time.Millisecond
			j := startJob(t, "", []string{"GO=" + goFile},
				"--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr,
				"--max-restarts", "1", "--kill-grace", "1",
				"--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5",
				"sh", "-c", restartScript)
			j.waitFor(regexp.MustCompile(`(?m)^\[0\] first done$`), 1, 60*time.Second)
			if tt.before {
				if err := tt.fail(hosts, 0); err != nil {
					t.Fatal(err)
				}
				waitStderr(t, j, regexp.MustCompile(`agent ended after its ranks`), 30*time.Second)
			}
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if !tt.before {
				j.waitFor(regexp.MustCompile(`(?m)^\[\d\] generation 1 running$`), 2, 60*time.Second)
				if err := tt.fail(hosts, 0); err != nil {
					t.Fatal(err)
				}
			}
			// Unfixed, gorun waited for ever: bound the wait generously
			// beyond the heartbeat timeout.
			res := j.wait(timeout + 30*time.Second)
			if !tt.partition {
				// The crashed host's agent could not remove its files (a
				// real host's /tmp goes with it); the other's did.
				left, _ := filepath.Glob(filepath.Join(os.TempDir(), "gorun-"+j.jobID()+"-*"))
				if len(left) > 1 {
					t.Errorf("job directories left: %v, want at most the crashed host's", left)
				}
				for _, d := range left {
					os.RemoveAll(d)
				}
			} else {
				checkNoJobFiles(t, j.jobID())
			}
			if want := fmt.Sprintf(tt.want, hosts.Names[0]); res.code != tt.code || !strings.Contains(res.stderr, want) {
				t.Fatalf("exit %d, want %d and %q\nstdout:\n%s\nstderr:\n%s", res.code, tt.code, want, res.stdout, res.stderr)
			}
		})
	}
}

// waitStderr polls gorun's stderr until it matches re.
func waitStderr(t *testing.T, j *job, re *regexp.Regexp, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if re.MatchString(j.stderr.String()) {
			return
		}
		select {
		case <-j.done:
			t.Fatalf("gorun exited early (code %d)\nstdout:\n%s\nstderr:\n%s", j.res.code, j.res.stdout, j.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("stderr does not match %v within %v\nstderr:\n%s", re, limit, j.stderr.String())
}
