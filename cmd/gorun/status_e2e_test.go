//go:build !race

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/jobstatus"
)

// statusJSON runs `gorun status JOB --json` and decodes its snapshot
// (nil, with the output, when it does not give one).
func statusJSON(t *testing.T, id string) (*jobstatus.Snapshot, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, gorunBin, "status", id, "--json").CombinedOutput()
	if err != nil {
		return nil, string(out)
	}
	var s jobstatus.Snapshot
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("gorun status --json: %v\n%s", err, out)
	}
	return &s, string(out)
}

// pollStatus polls gorun status --json until ok holds, for a minute.
func pollStatus(t *testing.T, r *hsRun, id, what string, ok func(*jobstatus.Snapshot) bool) *jobstatus.Snapshot {
	t.Helper()
	var last string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		s, out := statusJSON(t, id)
		if s != nil && ok(s) {
			return s
		}
		last = out
		select {
		case <-r.done:
			t.Fatalf("gorun exited (code %d) before the status showed %s; last:\n%s", r.res.code, what, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("the status never showed %s; last:\n%s", what, last)
	return nil
}

func host(s *jobstatus.Snapshot, name string) *jobstatus.Host {
	for i := range s.Hosts {
		if s.Hosts[i].Name == name {
			return &s.Hosts[i]
		}
	}
	return nil
}

// TestStatusHostLoss: gorun status against a live job on namespace hosts,
// before and after a host loss. Before: every working host running its
// ranks, the spare listed, G moving. After the host is killed: the
// failure listed as a host loss spliced onto the spare, with its
// recovery time (in the table too), the spare running the lost ranks, no
// spare left; the events file's failure record has the same class,
// decision, epoch and reason; the job still exits 0.
func TestStatusHostLoss(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	names := c.hosts.Names
	r := c.start(t, []string{"--max-restarts", "2"}, "--protect", "--steps", "400")
	r.waitStep(t, 3)
	id := r.jobID()

	before := pollStatus(t, r, id, "the job running with G >= 0", func(s *jobstatus.Snapshot) bool { return s.G >= 0 && s.State == "running" })
	if before.Job != id || before.NP != 4 || len(before.Hosts) != 3 || len(before.Failures) != 0 || len(before.Ranks) != 4 {
		t.Fatalf("before: %+v", before)
	}
	for i, want := range []struct{ state, ranks string }{{jobstatus.HostRunning, "0-1"}, {jobstatus.HostRunning, "2-3"}, {jobstatus.HostSpare, ""}} {
		if h := host(before, names[i]); h == nil || h.State != want.state || h.Ranks != want.ranks {
			t.Errorf("before: host %s is %+v, want %s with ranks %q", names[i], h, want.state, want.ranks)
		}
	}
	if len(before.Spares) != 1 || before.Spares[0] != names[2] {
		t.Errorf("before: spares %v, want [%s]", before.Spares, names[2])
	}
	// The table, as a person sees it.
	out, err := exec.Command(gorunBin, "status", id[:6]).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "spares left: 1 ("+names[2]+")") {
		t.Errorf("gorun status (table): %v\n%s", err, out)
	}

	if err := c.hosts.KillAll(0); err != nil {
		t.Fatal(err)
	}
	after := pollStatus(t, r, id, "the recovered host loss", func(s *jobstatus.Snapshot) bool {
		return len(s.Failures) == 1 && s.Failures[0].RecoverySeconds != nil
	})
	f := after.Failures[0]
	t.Logf("failure: %+v, recovered in %.3fs", f, *f.RecoverySeconds)
	if f.Class != "host-loss" || f.Decision != "splice" || f.Epoch != 1 || f.Host != names[0] || f.Rank != -1 || f.With != names[2] || !f.Spare || f.Ranks != "0-1" ||
		f.Why == "" || f.Cause == "" || *f.RecoverySeconds <= 0 || f.Superseded || !f.Done {
		t.Errorf("after: failure %+v", f)
	}
	if h := host(after, names[0]); h == nil || h.State != jobstatus.HostLost {
		t.Errorf("after: the lost host is %+v", h)
	}
	if h := host(after, names[2]); h == nil || h.State != jobstatus.HostRunning || h.Ranks != "0-1" {
		t.Errorf("after: the spare is %+v, want running ranks 0-1", h)
	}
	if len(after.Spares) != 0 || after.Epoch < 1 {
		t.Errorf("after: spares %v, epoch %d; want none left, epoch >= 1", after.Spares, after.Epoch)
	}
	if after.Ranks[0].Host != names[2] {
		t.Errorf("after: rank 0 on %s", after.Ranks[0].Host)
	}
	if out, err := exec.Command(gorunBin, "status", id).CombinedOutput(); err != nil || !regexp.MustCompile(`(?m)^1 .* host-loss +splice +`+regexp.QuoteMeta(names[0])+` `).Match(out) {
		t.Errorf("gorun status (table) after the loss: %v; want its failure row (epoch 1, host-loss, splice, %s)\n%s", err, names[0], out)
	}
	// Nothing of the lost host is left either: its hosts share /tmp and
	// /dev/shm with the others, whose agents sweep what it left.
	r.finish(t, 0)
	// The events file says the same of the failure.
	eb, err := os.ReadFile(r.events)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := events.ReadAll(bytes.NewReader(eb))
	if err != nil {
		t.Fatalf("reading the events file: %v", err)
	}
	var rec []events.Failure
	for _, x := range recs {
		if e, ok := x.Event.(events.Failure); ok {
			rec = append(rec, e)
		}
	}
	if len(rec) != 1 || rec[0].Class != f.Class || rec[0].Decision != f.Decision || rec[0].Epoch != f.Epoch || rec[0].Host != f.Host || rec[0].Msg != f.Why {
		t.Errorf("events file failures %+v; want one, as gorun status's %+v", rec, f)
	}
	// The job's end took its registry entry with it.
	if s, out := statusJSON(t, id); s != nil || !strings.Contains(out, "no running gorun job") {
		t.Errorf("gorun status after the job: %s", out)
	}
}
