package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"
)

// buildPMIAbort builds libgorun-pmi.so and testdata/pmiabort.c into dir.
func buildPMIAbort(t *testing.T, dir string) string {
	t.Helper()
	gcc := gortest.Tool(t, "gcc", "apt-get install gcc: it builds the PMI-1 client library")
	libdir, err := filepath.Abs(filepath.Join("..", "..", "libpmi"))
	if err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, "libgorun-pmi.so")
	driver := filepath.Join(dir, "pmiabort")
	for _, args := range [][]string{
		libPMIArgs(t, libdir, so),
		{"-O1", "-Wall", "-Werror", "-I", libdir, "-o", driver, filepath.Join("testdata", "pmiabort.c"), so, "-lpthread", "-Wl,-rpath," + dir},
	} {
		if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return driver
}

// TestPMIAbort: PMI_Abort reaches the server while another thread of the
// rank waits in PMI_Barrier (it once waited for the barrier's lock
// forever), and the rank exits with the abort's code once the server
// closes the connection, even with errno EINTR when PMI_Abort was called
// (its wait for the close once spun on that).
func TestPMIAbort(t *testing.T) {
	driver := buildPMIAbort(t, t.TempDir())
	for _, mode := range []string{"plain", "barrier"} {
		t.Run(mode, func(t *testing.T) {
			mine, theirs, err := pmiSocketPair()
			if err != nil {
				t.Fatal(err)
			}
			defer mine.Close()
			cmd := exec.Command(driver, mode)
			cmd.Env = []string{"PMI_FD=3", "PMI_RANK=0", "PMI_SIZE=2"}
			cmd.ExtraFiles = []*os.File{theirs}
			in, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			theirs.Close()
			exited := make(chan struct{}) // closed once waitErr is set
			var waitErr error
			go func() { _, _ = io.Copy(io.Discard, out); waitErr = cmd.Wait(); close(exited) }()
			defer func() {
				_ = cmd.Process.Kill()
				<-exited
			}()

			// The server: answers the library's start, holds a barrier's
			// reply, and sends each line it gets to lines.
			lines := make(chan string, 16)
			go func() {
				defer close(lines)
				r := bufio.NewReader(mine)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					line = strings.TrimSuffix(line, "\n")
					var reply string
					switch {
					case strings.HasPrefix(line, "cmd=init "):
						reply = "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
					case line == "cmd=get_maxes":
						reply = "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0"
					case line == "cmd=get_my_kvsname":
						reply = "cmd=my_kvsname kvsname=gorun-abort rc=0"
					case line == "cmd=gorun_kvs_keys":
						reply = "cmd=gorun_kvs_keys_result rc=0 keys=0"
					}
					if reply != "" {
						if _, err := fmt.Fprintln(mine, reply); err != nil {
							return
						}
					}
					lines <- line
				}
			}()
			// next returns the next line the server got (bounded: a wait
			// past it is the deadlock this test is about).
			next := func() string {
				t.Helper()
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatal("the rank closed its PMI connection")
					}
					return l
				case <-exited:
					t.Fatalf("the rank exited: %v", waitErr)
				case <-time.After(20 * time.Second):
					t.Fatal("no line from the rank in 20 s")
				}
				return ""
			}
			for _, want := range []string{"cmd=init", "cmd=get_maxes", "cmd=get_my_kvsname", "cmd=gorun_kvs_keys"} {
				if l := next(); !strings.HasPrefix(l, want) {
					t.Fatalf("got %q, want %s", l, want)
				}
			}
			if mode == "barrier" {
				if l := next(); l != "cmd=barrier_in" {
					t.Fatalf("got %q, want cmd=barrier_in", l)
				}
				if _, err := in.Write([]byte{1}); err != nil { // PMI_Abort, now
					t.Fatal(err)
				}
			}
			l := next()
			if !strings.HasPrefix(l, "cmd=abort exitcode=7 message=rank 0") {
				t.Fatalf("got %q, want the abort", l)
			}
			mine.Close() // as the agent's kill would
			select {
			case <-exited:
				var ee *exec.ExitError
				if !errors.As(waitErr, &ee) || ee.ExitCode() != 7 {
					t.Fatalf("the rank ended with %v, want exit 7", waitErr)
				}
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Signal(syscall.SIGKILL)
				t.Fatal("PMI_Abort did not return in 20 s once its connection closed")
			}
		})
	}
}
