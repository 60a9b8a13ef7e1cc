package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/nats-io/nkeys"
)

func TestParseStatus(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want statusOpts
		bad  string // in the usage error
	}{
		{args: nil, want: statusOpts{interval: 2 * time.Second, timeout: 10 * time.Second}},
		{args: []string{"abc"}, want: statusOpts{job: "abc", interval: 2 * time.Second, timeout: 10 * time.Second}},
		{args: []string{"--json", "abc", "--ranks"}, want: statusOpts{job: "abc", json: true, ranks: true, interval: 2 * time.Second, timeout: 10 * time.Second}},
		{args: []string{"abc", "--watch", "--interval", "500ms"}, want: statusOpts{job: "abc", watch: true, interval: 500 * time.Millisecond, timeout: 10 * time.Second}},
		{args: []string{"-watch", "-interval=1s", "-timeout=3s"}, want: statusOpts{watch: true, interval: time.Second, timeout: 3 * time.Second}},
		{args: []string{"--interval", "1s"}, bad: "--interval is for --watch"},
		{args: []string{"--watch", "--interval", "0s"}, bad: "--interval 0s"},
		{args: []string{"--watch", "--interval", "soon"}, bad: "-interval"},
		{args: []string{"--timeout", "-1s"}, bad: "--timeout"},
		{args: []string{"--bogus"}, bad: "-bogus"},
		{args: []string{"a", "b"}, bad: `more than one job given ("a" and "b")`},
		{args: []string{""}, bad: "empty job id"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			o, err := parseStatus(tt.args)
			if tt.bad != "" {
				if err == nil || !strings.Contains(err.Error(), tt.bad) {
					t.Fatalf("parseStatus: %v, want an error naming %q", err, tt.bad)
				}
				if _, ok := err.(*usageError); !ok {
					t.Fatalf("parseStatus: %T, want a usage error", err)
				}
				return
			}
			if err != nil || *o != tt.want {
				t.Fatalf("parseStatus = %+v, %v; want %+v", o, err, tt.want)
			}
		})
	}
}

// TestStatusExitCodes: -h is usage on stdout (0), a bad flag exits 2
// naming it, no running job exits 1 saying so. (The last two look in an
// empty registry of their own: the user's real ones, which gorun status
// searches whatever the environment, may hold the jobs of tests running
// beside this one.)
func TestStatusExitCodes(t *testing.T) {
	empty := []string{filepath.Join(t.TempDir(), "gorun")}
	// A registry holding another job (this process: a live launcher).
	other := filepath.Join(t.TempDir(), "gorun")
	remove, err := jobstatus.Register(other, &jobstatus.Entry{Job: "zzzother1", PID: os.Getpid(), Start: time.Now(), Prog: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	for _, tt := range []struct {
		args       []string
		code       int
		out, errIn string
		dir        string // the registry searched: empty's when ""
	}{
		{[]string{"status", "-h"}, exitOK, "Usage: gorun status", "", ""},
		{[]string{"status", "--help"}, exitOK, "Usage: gorun status", "", ""},
		{[]string{"status", "--nope"}, exitUsage, "", "-nope", ""},
		{[]string{"status", "--interval", "1s"}, exitUsage, "", "--interval is for --watch", ""},
		{[]string{"status"}, exitError, "", "no running gorun job", ""},
		{[]string{"status", "abc", "--json"}, exitError, "", "no running gorun job", ""},
		// Not "jobstatus: no running job with id": the same words
		// whether other jobs run or not.
		{[]string{"status", "abc"}, exitError, "", `no running gorun job of yours with id "abc"`, other},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := 0
			if tt.code == exitError {
				o, err := parseStatus(tt.args[1:])
				if err != nil {
					t.Fatal(err)
				}
				dirs := empty
				if tt.dir != "" {
					dirs = []string{tt.dir}
				}
				code = runStatus(context.Background(), o, dirs, &out, &errb)
			} else {
				code = Main(tt.args, nil, &out, &errb)
			}
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tt.code, errb.String())
			}
			if !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.errIn) {
				t.Fatalf("stdout %q, stderr %q; want %q, %q", out.String(), errb.String(), tt.out, tt.errIn)
			}
		})
	}
}

// TestMetricsFlag: a --metrics address without a port, or with a port
// that is not one, is a usage error naming the flag.
func TestMetricsFlag(t *testing.T) {
	for _, bad := range []string{"9400", "localhost", ":http", ":70000", ""} {
		var out, errb bytes.Buffer
		if code := Main([]string{"--metrics", bad, "-np", "1", "true"}, nil, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "--metrics") {
			t.Errorf("--metrics %q: exit %d, stderr %q; want 2 naming --metrics", bad, code, errb.String())
		}
	}
}

// TestMetricsBusyPort: a --metrics port another process holds is a
// runtime error (exit 1) naming the address, found before anything is
// made: no --events file is left behind (before, a 0-byte one was).
func TestMetricsBusyPort(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ev := filepath.Join(t.TempDir(), "ev.jsonl")
	var out, errb bytes.Buffer
	code := Main([]string{"--metrics", l.Addr().String(), "--events", ev, "-np", "1", "true"}, nil, &out, &errb)
	if code != exitError || !strings.Contains(errb.String(), l.Addr().String()) || !strings.Contains(errb.String(), "--metrics") {
		t.Errorf("exit %d, stderr %q; want 1 naming --metrics %s", code, errb.String(), l.Addr())
	}
	if _, err := os.Stat(ev); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the events file was made: %v", err)
	}
}

// TestStatusSeveralJobs: with several jobs running and none named,
// gorun status lists them and exits 1 (it did not show a job), in the
// table, under --watch (at once) and under --json (a JSON list of the
// jobs, without their credentials); before, the table exited 0 and
// --json failed with "several running jobs match".
func TestStatusSeveralJobs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "reg")
	for _, id := range []string{"aaaa1111", "bbbb2222"} {
		rm, err := jobstatus.Register(dir, &jobstatus.Entry{Job: id, PID: os.Getpid(), Start: time.Now(), Prog: "train", URL: "nats://127.0.0.1:1", Seed: "SUAsecretseed"})
		if err != nil {
			t.Fatal(err)
		}
		defer rm()
	}
	for _, tt := range []struct {
		name string
		o    statusOpts
	}{
		{"table", statusOpts{}},
		{"watch", statusOpts{watch: true}},
		{"json", statusOpts{json: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			o.interval, o.timeout = time.Second, 5*time.Second
			var out, errb bytes.Buffer
			if code := runStatus(t.Context(), &o, []string{dir}, &out, &errb); code != exitError {
				t.Fatalf("exit %d, want 1; stdout %q stderr %q", code, out.String(), errb.String())
			}
			if !strings.Contains(errb.String(), "2 running jobs; name one") {
				t.Errorf("stderr %q", errb.String())
			}
			if strings.Contains(out.String(), "SUAsecretseed") {
				t.Errorf("the status credential is shown: %s", out.String())
			}
			if !o.json {
				if !strings.Contains(out.String(), "aaaa1111") || !strings.Contains(out.String(), "bbbb2222") {
					t.Errorf("stdout %q lists not both jobs", out.String())
				}
				return
			}
			var jobs []struct {
				Job  string `json:"job"`
				PID  int    `json:"pid"`
				Prog string `json:"prog"`
			}
			if err := json.Unmarshal(out.Bytes(), &jobs); err != nil || len(jobs) != 2 || jobs[0].Job != "aaaa1111" || jobs[1].PID != os.Getpid() || jobs[1].Prog != "train" {
				t.Errorf("JSON list %q: %+v, %v", out.String(), jobs, err)
			}
		})
	}
}

// TestStatusRefusedIsStale: an entry whose launcher runs (its PID and
// start time match) but whose control plane refuses connections is a job
// that is ending, or a launcher whose server is gone: gorun status says
// the job ended and removes the entry, so that it no longer makes a bare
// gorun status ambiguous. Before, it exited 1 "does not answer" and the
// entry stayed.
func TestStatusRefusedIsStale(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "reg")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	if _, err := jobstatus.Register(dir, &jobstatus.Entry{Job: "refused1", PID: os.Getpid(), Start: time.Now(), Prog: "train", URL: "nats://" + closed, Seed: string(seed)}); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	o := statusOpts{interval: time.Second, timeout: 5 * time.Second}
	if code := runStatus(t.Context(), &o, []string{dir}, &out, &errb); code != exitError || !strings.Contains(errb.String(), "job refused1 ended") {
		t.Errorf("exit %d, stderr %q; want 1, job refused1 ended", code, errb.String())
	}
	if es, err := jobstatus.List(dir); err != nil || len(es) != 0 {
		t.Errorf("registry after: %v, %v; want the entry removed", es, err)
	}
}
