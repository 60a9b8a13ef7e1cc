package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// runWithStdin runs gorun with stdin as its standard input.
func runWithStdin(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	mark := newMark()
	cmd := exec.Command(gorunBin, append([]string{"-x", "GORUNTEST_MARK=" + mark}, args...)...)
	cmd.Env = append(os.Environ(), "GORUNTEST_MARK="+mark)
	var stdout, stderr syncBuffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("gorun did not exit\nstderr:\n%s", stderr.String())
	}
	(&job{t: t, mark: mark}).checkNoOrphans()
	return result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode(), elapsed: time.Since(start)}
}

func TestStdinGoesToOneRank(t *testing.T) {
	rsh := fakeRsh(t, `exec "$@"`)
	cat := []string{"sh", "-c", `while read l; do echo "got $l"; done; echo eof`}
	tests := []struct {
		name string
		args []string
		to   string // tag of the rank that must read the input
	}{
		{"default rank 0", []string{"-np", "3", "--oversubscribe"}, "0"},
		{"rank 2", []string{"-np", "3", "--oversubscribe", "--stdin", "2"}, "2"},
		{"none", []string{"-np", "2", "--oversubscribe", "--stdin", "none"}, ""},
		{"remote host", []string{"-H", "fakehost1:2,fakehost2:2", "--bind", "127.0.0.1", "--rsh", rsh, "--stdin", "3"}, "3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runWithStdin(t, strings.NewReader("alpha\nbeta\n"), append(tt.args, cat...)...)
			if res.code != 0 {
				t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
			}
			got := tagged.FindAllStringSubmatch(res.stdout, -1)
			for _, m := range got {
				if strings.HasPrefix(m[2], "got ") && m[1] != tt.to {
					t.Errorf("rank %s read stdin: %q", m[1], m[2])
				}
			}
			// Other ranks' lines may come between the reader's.
			var mine []string
			for _, m := range got {
				if m[1] == tt.to {
					mine = append(mine, m[2])
				}
			}
			if tt.to != "" && strings.Join(mine, "|") != "got alpha|got beta|eof" {
				t.Errorf("rank %s did not read the input in order:\n%s", tt.to, res.stdout)
			}
			if n := strings.Count(res.stdout, "] eof\n"); n != strings.Count(res.stdout, "\n")-strings.Count(res.stdout, "] got ") {
				t.Errorf("a rank did not see end of file:\n%s", res.stdout)
			}
		})
	}
}

func TestStdinLargeInputArrivesWhole(t *testing.T) {
	in := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16) // 3 MiB, many chunks
	sum := sha256.Sum256(in)
	res := runWithStdin(t, bytes.NewReader(in), "-np", "2", "--oversubscribe", "sha256sum")
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
	if want := "[0] " + hex.EncodeToString(sum[:]) + "  -"; !strings.Contains(res.stdout, want) {
		t.Fatalf("rank 0 hashed something else:\n%s\nwant %s", res.stdout, want)
	}
}

func TestStdinNotReadDoesNotHoldTheJob(t *testing.T) {
	// An endless stdin and ranks that never read it: the job ends with its ranks.
	yes := exec.Command("yes")
	out, err := yes.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := yes.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { yes.Process.Kill(); yes.Wait() }()
	res := runWithStdin(t, out, "-np", "2", "--oversubscribe", "sh", "-c", "sleep 0.3")
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
}

func TestStdinBadRank(t *testing.T) {
	for _, arg := range []string{"5", "-1", "all", ""} {
		res := runJob(t, "", nil, "-np", "2", "--oversubscribe", "--stdin", arg, "true")
		if res.code != 2 || !strings.Contains(res.stderr, "--stdin") {
			t.Errorf("--stdin %q: exit %d\n%s", arg, res.code, res.stderr)
		}
	}
}
