package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/topology"
)

// watchJob runs a job of 2 ranks in this process, registered in dir,
// until the file it returns exists; done is closed when Run returned.
func watchJob(t *testing.T, dir string) (stop string, done chan struct{}) {
	t.Helper()
	stop = filepath.Join(t.TempDir(), "stop")
	var out syncBuffer
	cfg := launcher.Config{Hosts: []topology.Host{{Name: "localhost", Slots: 2}}, NP: 2, Prog: "sh",
		Args: []string{"-c", `while [ ! -e ` + stop + ` ]; do sleep 0.02; done`}, Dir: t.TempDir(), Registry: dir, Stdout: &out, Stderr: &out}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // t.Context ends before the cleanup stops the job
	done = make(chan struct{})
	go func() {
		defer close(done)
		if code, err := launcher.Run(ctx, cfg); code != 0 || err != nil {
			t.Errorf("the job: exit %d, %v\n%s", code, err, out.String())
		}
	}()
	t.Cleanup(func() {
		os.WriteFile(stop, nil, 0o600)
		<-done
		cancel()
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if es, _ := jobstatus.List(dir); len(es) == 1 {
			return stop, done
		}
		if time.Now().After(deadline) {
			t.Fatal("the job did not register")
		}
	}
}

// TestStatusWatch: --watch on a pipe prints successive tables (no
// terminal control), and when the job ends says so and exits 0.
func TestStatusWatch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "reg")
	stop, done := watchJob(t, dir)
	var out, errb syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- runStatus(t.Context(), &statusOpts{watch: true, interval: 20 * time.Millisecond, timeout: 10 * time.Second}, []string{dir}, &out, &errb)
	}()
	for deadline := time.Now().Add(30 * time.Second); strings.Count(out.String(), "spares left:") < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no second table:\n%s\n%s", out.String(), errb.String())
		}
	}
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	<-done
	select {
	case c := <-code:
		if c != exitOK || !strings.Contains(out.String(), " ended\n") || strings.Contains(out.String(), "\x1b[") {
			t.Errorf("exit %d\nstdout:\n%q\nstderr:\n%s", c, out.String(), errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("--watch did not stop when the job ended")
	}
}

// TestStatusWatchInterrupted: an interrupt (the context's end, as
// SIGINT/SIGTERM make it) stops --watch cleanly, exit 0.
func TestStatusWatchInterrupted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "reg")
	watchJob(t, dir)
	ctx, cancel := context.WithCancel(t.Context())
	var out, errb syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- runStatus(ctx, &statusOpts{watch: true, json: true, interval: 20 * time.Millisecond, timeout: 10 * time.Second}, []string{dir}, &out, &errb)
	}()
	for deadline := time.Now().Add(30 * time.Second); strings.Count(out.String(), `"version"`) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no second snapshot:\n%s\n%s", out.String(), errb.String())
		}
	}
	cancel()
	select {
	case c := <-code:
		if c != exitOK {
			t.Errorf("exit %d; stderr %s", c, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("--watch did not stop on the interrupt")
	}
}
