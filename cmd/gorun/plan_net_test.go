package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/testcluster"
)

// commPair makes a world of two ranks on loopback, rank r's data-plane
// key keys[r] (the same key: one job).
func commPair(t *testing.T, ctx context.Context, keys [2]jobkey.Key) ([2]*comm.Comm, [2]error) {
	t.Helper()
	var lns [2]net.Listener
	var addrs []string
	for i := range lns {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = l
		addrs = append(addrs, l.Addr().String())
	}
	var cs [2]*comm.Comm
	var errs [2]error
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			cs[r], errs[r] = comm.NewComm(ctx, comm.CommConfig{Rank: r, Size: 2, Epoch: 1, Job: "plan-probe-test",
				Key: keys[r], Listener: lns[r], Addrs: addrs})
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	})
	return cs, errs
}

func testKey(t *testing.T) jobkey.Key {
	s, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	return s.DataKey()
}

// The probe's two ranks over gorun's data plane on loopback: rank 1 gets
// the acknowledgement only after rank 0 has received every byte.
func TestNetProbeLoopback(t *testing.T) {
	ctx := context.Background()
	k := testKey(t)
	cs, errs := commPair(t, ctx, [2]jobkey.Key{k, k})
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	served := make(chan error, 1)
	go func() { _, err := probe(ctx, cs[0], 9<<20+5); served <- err }()
	el, err := probe(ctx, cs[1], 9<<20+5)
	if err != nil || el <= 0 {
		t.Fatalf("rank 1: %v, %v", el, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("rank 0: %v", err)
	}
}

// The probe is authenticated (review finding 12: rank 0 accepted the
// first TCP connection): a rank 1 without the job's data-plane key never
// gets a link to rank 0, so it sends nothing.
func TestNetProbeAuthenticated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, errs := commPair(t, ctx, [2]jobkey.Key{testKey(t), testKey(t)})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrPeerLost) {
			t.Errorf("rank %d with another job's key: %v, want no link (ErrPeerLost)", r, err)
		}
	}
}

func TestMeasureNet(t *testing.T) {
	errJob := errors.New("job failed")
	for _, c := range []struct {
		name    string
		out     string
		err     error
		want    float64
		wantErr string
	}{
		{"result", "noise\ngorun-plan-net bytes=1048576 seconds=0.5\n", nil, 2 << 20, ""},
		{"no line", "something else\n", nil, 0, "no result line"},
		{"bad line", "gorun-plan-net bytes=x seconds=1\n", nil, 0, "bad result line"},
		{"zero time", "gorun-plan-net bytes=10 seconds=0\n", nil, 0, "bad result line"},
		{"job fails", "", errJob, 0, "job failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var args []string
			run := func(_ context.Context, a []string) ([]byte, error) { args = a; return []byte(c.out), c.err }
			got, err := measureNet(context.Background(), run, "h1", "h2", 1<<20, "ip netns exec", "10.0.0.1")
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Errorf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Errorf("= %v, %v; want %v", got, err, c.want)
			}
			for _, want := range [][]string{{"-H", "h1,h2"}, {"-np", "2"}, {"--map-by", "node"}, {"--rsh", "ip netns exec"}, {"--bind", "10.0.0.1"}, {"plan", "net-probe", "1048576"}} {
				if i := slices.Index(args, want[0]); i < 0 || !slices.Equal(args[i:min(len(args), i+len(want))], want) {
					t.Errorf("job args %q lack %q", args, want)
				}
			}
		})
	}
}

func TestPlanHostfileNet(t *testing.T) {
	hf := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(hf, []byte("a slots=8\nb slots=8\nc slots=8\nd slots=8 spare\n"), 0o644)
	var out strings.Builder
	var errb strings.Builder
	deps := planDeps{now: nil, stdout: &out,
		memBW: func() (float64, error) { return 1e9, nil },
		net: func(_ context.Context, a []string) ([]byte, error) {
			return []byte("gorun-plan-net bytes=1000 seconds=0.000001\n"), nil
		}}
	code := runPlan(context.Background(), []string{"--hostfile", hf, "--ranks-per-host", "8", "--mttf", "365d",
		"--job-length", "7d", "--step", "1s", "--state", "1GB", "--durable-bw", "1GB/s", "--json", "--runs", "10"}, deps, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got planOutput
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]planInput{
		"hosts":  {Name: "hosts", Value: "3", Source: "hostfile", Raw: 3},
		"spares": {Name: "spares", Value: "1", Source: "hostfile", Raw: 1},
		"net-bw": {Name: "net-bw", Value: "1 GB/s", Source: "measured between a and b", Raw: 1e9},
	}
	for _, in := range got.Inputs {
		if w, ok := want[in.Name]; ok {
			if in != w {
				t.Errorf("input %+v, want %+v", in, w)
			}
			delete(want, in.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("inputs lack %v", want)
	}
}

// The network measured on namespace hosts by a real 2-rank gorun job
// (root and network namespaces; skipped without them).
func TestPlanNetMeasuredE2E(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	hf := hosts.WriteHostfile(t, t.TempDir(), 1)
	cmd := exec.Command(gorunBin, "plan", "--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr,
		"--measure-size", "32MiB", "--mem-bw", "10GB/s", "--durable-bw", "1GB/s",
		"--mttf", "365d", "--job-length", "1d", "--step", "1s", "--state", "1GB", "--runs", "10", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gorun plan: %v\n%s", err, stderr.String())
	}
	var got planOutput
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, in := range got.Inputs {
		if in.Name == "net-bw" {
			if want := "measured between " + hosts.Names[0] + " and " + hosts.Names[1]; in.Source != want || !(in.Raw > 0) {
				t.Errorf("net-bw %+v, want %s and a positive figure", in, want)
			}
			t.Logf("net-bw %s, %s", in.Value, in.Source)
			return
		}
	}
	t.Errorf("no net-bw input in %s", out)
}

// SIGTERM while the network is being measured on namespace hosts: gorun
// plan exits saying so, and nothing of the measurement job (the
// launcher, its rsh children, the probe ranks) is left running (review
// finding 5).
func TestPlanNetSignalE2E(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	hf := hosts.WriteHostfile(t, t.TempDir(), 1)
	size := "107374182417" // ~100 GiB: the probe runs for a while; the figure marks its processes
	cmd := exec.Command(gorunBin, "plan", "--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr,
		"--measure-size", size+"B", "--mem-bw", "10GB/s", "--durable-bw", "1GB/s",
		"--mttf", "365d", "--job-length", "1d", "--step", "1s", "--state", "1GB", "--runs", "10")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	probes := func() []int { return procsWith("plan\x00net-probe\x00" + size) }
	deadline := time.Now().Add(60 * time.Second)
	for len(probes()) < 3 { // the launcher and both ranks; polling external processes to a deadline
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the probe ranks never ran; stderr %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("measurement job processes: %v", probes())
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitError || !strings.Contains(stderr.String(), "--net-bw") {
		t.Errorf("after SIGTERM: %v, stderr %q; want exit %d from the cancelled measurement", err, stderr.String(), exitError)
	}
	for deadline = time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left := probes()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				syscall.Kill(p, syscall.SIGKILL)
			}
			t.Fatalf("probe processes %v outlived gorun plan", left)
		}
	}
}

// procsWith returns the running processes whose NUL-separated command
// line contains s.
func procsWith(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), s) && procRunning(pid) {
			out = append(out, pid)
		}
	}
	return out
}
