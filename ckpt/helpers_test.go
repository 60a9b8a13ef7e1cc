package ckpt

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"
)

// The test binary plays the other processes (the crashing writer, the
// writer beside a reading parent): TestMain runs the helper named by
// helperEnv instead of the tests. Every helper is used by a test.
const (
	helperEnv = "GORUN_CKPT_TEST_HELPER"
	dirEnv    = "GORUN_CKPT_TEST_DIR"
	argEnv    = "GORUN_CKPT_TEST_ARG"
	testJob   = "job0test"
)

var helpers = map[string]func(dir, arg string) error{
	"stage":  helperStage,
	"writer": helperWriter,
}

func TestMain(m *testing.M) {
	run := map[string]func() int{}
	for name, fn := range helpers {
		run[name] = func() int {
			if err := fn(os.Getenv(dirEnv), os.Getenv(argEnv)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			return 0
		}
	}
	gortest.RunHelper(helperEnv, run)
	os.Exit(m.Run())
}

// testRegions is the usual layout of the tests: sizes that are not
// multiples of the slot alignment, one that is, one empty region.
var testRegions = []Region{
	{Name: "optimizer", Size: 10_000},
	{Name: "params", Size: 3 * 4096},
	{Name: "meta", Size: 100},
	{Name: "empty", Size: 0},
}

// fill writes the bytes of region index region at step into b: a
// different sequence for every (step, region).
func fill(step uint64, region int, b []byte) {
	x := step*0x9E3779B97F4A7C15 ^ uint64(region+1)*0xBF58476D1CE4E5B9 | 1
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
}

// want returns the bytes of region index region at step.
func want(step uint64, region int, size int64) []byte {
	b := make([]byte, size)
	fill(step, region, b)
	return b
}

// commit stages step, fills every region and commits it.
func commit(t testing.TB, s *Slots, step uint64) {
	t.Helper()
	st, err := s.Stage(step)
	if err != nil {
		t.Fatalf("Stage(%d): %v", step, err)
	}
	for i, v := range st.Views() {
		fill(step, i, v)
	}
	if err := st.Commit(); err != nil {
		t.Fatalf("Commit of step %d: %v", step, err)
	}
}

// writeSteps stages and commits steps 1 to steps, each filled as commit
// fills it, as fast as it can (the writer of the concurrency tests).
func writeSteps(w *Slots, steps uint64) error {
	for step := uint64(1); step <= steps; step++ {
		st, err := w.Stage(step)
		if err != nil {
			return err
		}
		for i, v := range st.Views() {
			fill(step, i, v)
		}
		if err := st.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// checkNewest checks that Newest returns step, in slot (unless slot < 0),
// with its exact bytes, and no fallback unless fallback.
func checkNewest(t testing.TB, s *Slots, step uint64, slot int, fallback bool) *Snapshot {
	t.Helper()
	sn, err := s.Newest()
	if err != nil {
		t.Fatalf("Newest: %v (want step %d)", err, step)
	}
	if sn.Step != step || (slot >= 0 && sn.Slot != slot) {
		t.Fatalf("Newest is step %d in slot %d, want step %d in slot %d", sn.Step, sn.Slot, step, slot)
	}
	if (sn.Fallback != nil) != fallback {
		t.Fatalf("Newest's Fallback is %v, want a fallback: %v", sn.Fallback, fallback)
	}
	if sn.Fallback != nil && !errors.Is(sn.Fallback, ErrCorrupt) {
		t.Fatalf("Fallback %v does not wrap ErrCorrupt", sn.Fallback)
	}
	for i, r := range s.Regions() {
		if got := sn.Region(r.Name); !bytes.Equal(got, want(step, i, r.Size)) {
			t.Fatalf("region %q of step %d: bytes differ from what was committed", r.Name, step)
		}
	}
	return sn
}

// create makes slots of testRegions in a fresh directory.
func create(t testing.TB, regions []Region) (*Slots, Options) {
	t.Helper()
	opt := Options{Dir: t.TempDir()}
	s, err := Create(testJob, 0, regions, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, opt
}

// reopen maps the files afresh, as a restarted process would.
func reopen(t testing.TB, opt Options) *Slots {
	t.Helper()
	s, err := Open(testJob, 0, nil, opt)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// helper is a running helper process.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startHelper starts the test binary as helper name.
func startHelper(t *testing.T, name, dir, arg string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+name, dirEnv+"="+dir, argEnv+"="+arg)
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return h
}

// line reads the helper's next line of output.
func (h *helper) line(t *testing.T) string {
	t.Helper()
	l, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the helper's output: %v", err)
	}
	return strings.TrimSpace(l)
}

// kill kills the helper with SIGKILL and waits for it.
func (h *helper) kill(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := h.cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v, want killed by SIGKILL", err)
	}
}

// block says where the helper is, then waits to be killed (or for its
// stdin to close, should the test die first).
func block(where string) {
	fmt.Println(where)
	io.Copy(io.Discard, os.Stdin)
	os.Exit(97)
}

// helperStage opens rank 0's slots of testJob in dir and stages the step
// after the newest, stopping (and waiting to be killed) where arg says:
// "write=K" before the K-th header write of Stage and Commit, "data"
// with half of every region written, "committed" after Commit.
func helperStage(dir, arg string) error {
	s, err := Open(testJob, 0, nil, Options{Dir: dir})
	if err != nil {
		return err
	}
	steps, ok := s.Committed()
	step := max(steps[0], steps[1]) + 1
	if !ok[0] && !ok[1] {
		step = 1
	}
	if k, found := strings.CutPrefix(arg, "write="); found {
		stop, err := strconv.Atoi(k)
		if err != nil {
			return err
		}
		testWriteHook = func(w int) bool {
			if w == stop {
				block(arg)
			}
			return false
		}
	}
	st, err := s.Stage(step)
	if err != nil {
		return err
	}
	for i, v := range st.Views() {
		if arg == "data" {
			fill(step, i, v[:len(v)/2])
			continue
		}
		fill(step, i, v)
	}
	if arg == "data" {
		block(arg)
	}
	if err := st.Commit(); err != nil {
		return err
	}
	block(arg)
	return nil
}

// helperWriter opens rank 0's slots of testJob in dir and commits steps
// 1 to arg as fast as it can.
func helperWriter(dir, arg string) error {
	n, err := strconv.ParseUint(arg, 10, 64)
	if err != nil {
		return err
	}
	s, err := Open(testJob, 0, nil, Options{Dir: dir})
	if err != nil {
		return err
	}
	defer s.Close()
	if err := writeSteps(s, n); err != nil {
		return err
	}
	fmt.Println("done")
	return nil
}
