package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestPipeOutStall: a stall fills the shrunk pipe so that the writer
// blocks (the pipe is full at the release), and the text read afterwards
// is exactly what the writer wrote, the filler cut out, wherever it fell.
func TestPipeOutStall(t *testing.T) {
	o, err := newPipeOut()
	if err != nil {
		t.Fatal(err)
	}
	if o.size != pipeSize {
		t.Fatalf("pipe size %d, want %d", o.size, pipeSize)
	}
	const n = 3000
	cmd := exec.Command("sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo \"[0] step $i\"; i=$((i+1)); done", n))
	cmd.Stdout = o.w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	o.started()
	release, err := o.stall()
	if err != nil {
		t.Fatal(err)
	}
	// The writer blocks in its write to the full pipe (polled: it gets
	// there on its own time).
	for deadline := time.Now().Add(30 * time.Second); ; {
		blocked, err := writeBlocked(cmd.Process.Pid, 1)
		if err != nil {
			t.Fatal(err)
		}
		if blocked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer (pid %d) is not seen blocked writing to descriptor 1 after 30s", cmd.Process.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	full, err := release()
	if err != nil || !full {
		t.Errorf("release = %v, %v; want the pipe full", full, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	o.finish(10 * time.Second)
	var want strings.Builder
	for i := range n {
		fmt.Fprintf(&want, "[0] step %d\n", i)
	}
	if got := o.String(); got != want.String() {
		t.Errorf("read %d bytes, want the writer's %d (filler left: %v)", len(got), want.Len(), strings.Contains(got, "filler"))
	}
}

// TestWriteBlocked: a process that waits without writing is not blocked
// writing (the stall's landed test, round-2 review #7: the pipe full of
// filler alone is not gorun blocked).
func TestWriteBlocked(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if blocked, err := writeBlocked(cmd.Process.Pid, 1); err != nil || blocked {
		t.Errorf("writeBlocked(sleep) = %v, %v; want false", blocked, err)
	}
	if _, err := writeBlocked(-1, 1); err == nil {
		t.Errorf("writeBlocked(no such process): no error")
	}
	// A writer blocked on a duplicate of its descriptor 1, as gorun's
	// (cmd/gorun's undying) is.
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3: the duplicate descriptor's case is not run")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	dup := exec.Command(py, "-c", "import os\nfd = os.dup(1)\nwhile True:\n    os.write(fd, b'x' * 4096)\n")
	dup.Stdout = w
	if err := dup.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	defer dup.Wait()
	defer dup.Process.Kill()
	for deadline := time.Now().Add(30 * time.Second); ; {
		blocked, err := writeBlocked(dup.Process.Pid, 1)
		if err != nil {
			t.Fatal(err)
		}
		if blocked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a writer blocked on a duplicate of descriptor 1 is not seen blocked after 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
