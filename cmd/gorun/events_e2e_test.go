package main

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/gorun/gorun/internal/events"
)

// TestEventsFileHostLoss: a real job on namespace hosts (two working
// hosts, one spare) loses a host mid-run; its --events file reads back
// with events.Reader without error and holds, in order, the launch, the
// rendezvous, samples, the failure, the recovery's stages and the exit.
// With GORUN_RECORD_EVENTS=FILE the file is copied there (how
// testdata/hostloss.events.jsonl was recorded).
func TestEventsFileHostLoss(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	r := c.start(t, []string{"--recovery", "in-place"}, "--protect", "--steps", "120")
	// The failure after two samples of running ranks.
	waitEvents(t, r, func(evs []events.Record) bool { return len(ofKind[events.Sample](evs)) >= 2 })
	if err := c.hosts.KillAll(1); err != nil {
		t.Fatal(err)
	}
	res := r.finish(t, 0)
	f, err := os.Open(r.events)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := events.ReadAll(f)
	if err != nil {
		t.Fatalf("reading the events file: %v\nstderr:\n%s", err, res.stderr)
	}
	if p := os.Getenv("GORUN_RECORD_EVENTS"); p != "" {
		copyFile(t, r.events, p)
	}
	checkJobRecord(t, recs, c.hosts.Names[1], c.hosts.Names[2])

	// gorun report makes a page of it, with the failure on it.
	var page, stderr bytes.Buffer
	if code := Main([]string{"report", r.events}, nil, &page, &stderr); code != 0 || !bytes.Contains(page.Bytes(), []byte(`data-marker="failure"`)) {
		t.Fatalf("gorun report: exit %d, %d bytes without a failure marker\n%s", code, page.Len(), stderr.String())
	}
}

// checkJobRecord checks the record of a job that lost host lost and
// spliced in spare: the kinds in order, and what they say.
func checkJobRecord(t *testing.T, recs []events.Record, lost, spare string) {
	t.Helper()
	var kinds []string
	for _, r := range recs {
		if k := r.Event.Kind(); len(kinds) == 0 || kinds[len(kinds)-1] != k {
			kinds = append(kinds, k)
		}
	}
	want := []string{"launch", "rendezvous", "sample", "failure", "fence", "splice", "publish",
		"detected", "classified", "replaced", "published", "restored", "resumed", "timeline", "sample", "exit"}
	i := 0
	for _, k := range kinds {
		if i < len(want) && k == want[i] {
			i++
		}
	}
	if i < len(want) || kinds[0] != "launch" || kinds[len(kinds)-1] != "exit" {
		t.Fatalf("kinds %v: want %v in order, launch first, exit last", kinds, want)
	}
	l := recs[0].Event.(events.Launch)
	if l.Schema != events.SchemaVersion || l.NP != 4 || l.Spares != 1 || len(l.Hosts) != 3 || l.Hosts[2].Role != events.RoleSpare || l.Hosts[2].Name != spare {
		t.Errorf("launch %+v", l)
	}
	var fails []events.Failure
	var tl bool
	var tlEpoch uint64
	for _, r := range recs {
		switch e := r.Event.(type) {
		case events.Failure:
			fails = append(fails, e)
		case events.Timeline:
			if e.Resumed != nil && e.Replaced != nil {
				tl, tlEpoch = true, e.Epoch
			}
		case events.Sample:
			if len(e.Min) != len(l.Hosts) || len(e.Wait) != len(l.Hosts) {
				t.Errorf("sample of %d hosts for %d", len(e.Min), len(l.Hosts))
			}
		case events.Exit:
			if e.Code != 0 || e.Duration <= 0 {
				t.Errorf("exit %+v", e)
			}
		}
	}
	// One failure record for the one incident (not one per way it was
	// seen), classified, with its reason and the recovery epoch.
	failed := len(fails) == 1 && fails[0].Host == lost && fails[0].Class == "host-loss" && fails[0].Decision == "splice" &&
		fails[0].Msg != "" && fails[0].Epoch == tlEpoch
	if !failed || !tl {
		t.Errorf("failure records %+v (want one of %s, class host-loss, decision splice, with msg, epoch %d), a resumed replacement's timeline %v", fails, lost, tlEpoch, tl)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
