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
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testcluster"
)

// The probe's two halves over loopback: rank 1 gets the acknowledgement
// only after rank 0 has read every byte.
func TestNetProbeLoopback(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	served := make(chan error, 1)
	go func() { served <- probeServe(ctx, l, 9<<20) }()
	el, err := probeSend(ctx, l.Addr().String(), 9<<20)
	if err != nil || el <= 0 {
		t.Fatalf("probeSend = %v, %v", el, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("probeServe: %v", err)
	}
}

// A short sender: the server reports it instead of acknowledging.
func TestNetProbeShort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- probeServe(context.Background(), l, 1<<20) }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("short"))
	c.Close()
	if err := <-served; err == nil || !strings.Contains(err.Error(), "receiving") {
		t.Errorf("probeServe = %v, want a receiving error", err)
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
