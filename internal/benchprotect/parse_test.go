package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReadStdout(t *testing.T) {
	in := `[0] dptrain: 4 ranks, 8 parameters
[0] step 0 loss 0.8
[1] step 1 loss 0.7
[0] step 1 loss 0.7
[0] step 2 loss 0.5
[0] dptrain: 3 steps in 2.100s, 700.400 ms/step
[0] dptrain: protection per step: copy 1.8ms, commit 7.6ms, overwrite-rule wait 0s, trainer wait 5.5ms
`
	base := time.Unix(0, 0)
	n := 0
	res := readStdout(strings.NewReader(in), func() stamp {
		n++
		return stamp{at: base.Add(time.Duration(n) * time.Second), wire: uint64(1000 * n * n)}
	})
	if res.badLine != nil {
		t.Fatal(res.badLine)
	}
	if res.msStep != 700.4 {
		t.Errorf("msStep %v", res.msStep)
	}
	want := clientStats{copy: 1800 * time.Microsecond, commit: 7600 * time.Microsecond, wait: 5500 * time.Microsecond}
	if res.client == nil || *res.client != want {
		t.Errorf("client %+v, want %+v", res.client, want)
	}
	ds, err := stepTimes(res.stepAt, 1, 2)
	if err != nil || len(ds) != 2 || ds[0] != 2*time.Second || ds[1] != time.Second {
		t.Errorf("stepTimes = %v, %v; want [2s 1s] (rank 1's line is not rank 0's)", ds, err)
	}
	if _, err := stepTimes(res.stepAt, 1, 3); err == nil {
		t.Error("stepTimes past the last step: no error")
	}
	// Lines 2, 4 and 5 are rank 0's steps 0, 1 and 2: wire 4000, 16000, 25000.
	if w, err := wirePerStep(res.stepWire, 1, 2); err != nil || w != (25000-4000)/2 {
		t.Errorf("wirePerStep(1, 2) = %v, %v; want %v", w, err, (25000-4000)/2)
	}
	if _, err := wirePerStep(res.stepWire, 1, 3); err == nil {
		t.Error("wirePerStep past the last step: no error")
	}
}

func TestParseTable(t *testing.T) {
	log := `gorun: time=x level=DEBUG msg="control plane up" url=nats://10.77.1.1:4222 job=abc123 hosts=2 ranks=4
gorun: state protection: G = 11 (the step every rank can resume from)
    rank  committed replicated   stages    rule wait    repl/step  repl MB/s
       0         11         11       12           0s    1.759s        154
       1         11         10       12        1.5ms            -          -
gorun agent h0: time=y level=INFO msg="exiting as told"
`
	tab, job := parseTable(log)
	if job != "abc123" {
		t.Errorf("job %q", job)
	}
	if tab == nil || tab.g != 11 || len(tab.rows) != 2 {
		t.Fatalf("table %+v", tab)
	}
	r0, r1 := tab.rows[0], tab.rows[1]
	if r0.stages != 12 || r0.replPerStep != 1759*time.Millisecond || r0.replMBps != 154 {
		t.Errorf("row 0 %+v", r0)
	}
	if r1.rank != 1 || r1.replicated != 10 || r1.ruleWait != 1500*time.Microsecond || r1.replPerStep != 0 {
		t.Errorf("row 1 %+v", r1)
	}
	rw, repl, mbps, minRepl := tab.services()
	if rw != 1500*time.Microsecond/24 || repl != 1759*time.Millisecond || mbps != 154 || minRepl != 10 {
		t.Errorf("services = %v %v %v %v", rw, repl, mbps, minRepl)
	}
}

// TestParseTableCodedBase: in diff mode under EC the table has the coded
// base as an eighth column, and the title names H.
func TestParseTableCodedBase(t *testing.T) {
	log := `gorun: state protection: G = 151 (the step every rank can resume from), H = 144 (the newest coded base every rank has: a decode restores it and replays to G), mode diff (fold 8, base every 8 steps, codec raw)
    rank  committed replicated   stages    rule wait    repl/step  repl MB/s coded base
       0        151        151      152    1.514192s    139.837ms        880        144
       1        151        150      152     1.71503s            -          -         -1
       2        151        151      152     1.71503s    139.837ms        880       base
`
	tab, _ := parseTable(log)
	if tab == nil || tab.g != 151 || len(tab.rows) != 2 {
		t.Fatalf("table %+v, want G 151 and 2 rows (the third's base is not a step)", tab)
	}
	if r := tab.rows[0]; r.replicated != 151 || r.replPerStep != 139837*time.Microsecond || r.replMBps != 880 {
		t.Errorf("row 0 %+v", r)
	}
	if r := tab.rows[1]; r.replicated != 150 || r.replPerStep != 0 {
		t.Errorf("row 1 %+v", r)
	}
}

// TestParseDiffSources: the sources of -v's last differential-protection
// table, by rank.
func TestParseDiffSources(t *testing.T) {
	log := `differential protection, per rank:
    rank    sent/step   bases/step   diffs/step      source
       0        1.5MB            -            -     network
differential protection, per rank:
    rank    sent/step   bases/step   diffs/step      source
       0        1.5MB        100kB          2MB  local-peer
       1        2.1MB        100kB          2MB       mixed
holders' replay per folded step: host 0 139µs (32 steps); host 1 137µs (32 steps);
gorun: done
`
	got := parseDiffSources(log)
	if want := []string{"local-peer", "mixed"}; !slices.Equal(got, want) {
		t.Errorf("parseDiffSources = %q, want %q", got, want)
	}
	if got := parseDiffSources("no table"); got != nil {
		t.Errorf("parseDiffSources without a table = %q", got)
	}
	if s := sourceOf([]string{"local-peer", "local-peer"}); s != "local peer" {
		t.Errorf("sourceOf = %q", s)
	}
}
