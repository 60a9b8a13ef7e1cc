package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// wantFence checks that every rank was welcomed as itself and left the
// fence with every rank's value.
func wantFence(t *testing.T, res result, np int) {
	t.Helper()
	if res.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	var all []string
	for r := range np {
		all = append(all, fmt.Sprintf("k%d=v%d", r, r))
	}
	slices.Sort(all)
	want := strings.Join(all, ",")
	re := regexp.MustCompile(`(?m)^\[(\d+)\] welcome rank=(\d+) world=(\d+) key=64 fence=(\S+)$`)
	got := re.FindAllStringSubmatch(res.stdout, -1)
	if len(got) != np {
		t.Fatalf("%d ranks went through the fence, want %d\n%s\n%s", len(got), np, res.stdout, res.stderr)
	}
	for _, m := range got {
		if m[1] != m[2] || m[3] != fmt.Sprint(np) || m[4] != want {
			t.Errorf("rank %s: welcomed as %s of %s, fence %s (want %s)", m[1], m[2], m[3], m[4], want)
		}
	}
}

func TestRankSocketFence(t *testing.T) {
	res := runJob(t, "fence", nil, "-np", "5", "--oversubscribe", os.Args[0])
	wantFence(t, res, 5)
	rsh := fakeRsh(t, `exec "$@"`)
	res = runJob(t, "fence", nil, "-H", "fakehost1:2,fakehost2:3,localhost:1", "--bind", "127.0.0.1", "--rsh", rsh, os.Args[0])
	wantFence(t, res, 6)
}

func TestRankSocketRefusesBadInput(t *testing.T) {
	res := runJob(t, "abuse", nil, "-np", "2", "--oversubscribe", os.Args[0])
	wantFence(t, res, 2)
}

func TestMultiHostFence(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 3)
	res := multiHostJob(t, hosts, 2, "fence").wait(90 * time.Second)
	wantFence(t, res, 6)
}
