package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

type rec struct {
	rank   int
	stream wire.Stream
	data   string
}

// frameOf encodes records as an agent would.
func frameOf(host int, recs ...rec) []byte {
	f := wire.NewOutputFrame(host)
	for _, r := range recs {
		f.Add(r.rank, r.stream, []byte(r.data))
	}
	return bytes.Clone(f.Bytes())
}

// frameHost is the host b names, which the launcher takes from the
// subject a frame came on.
func frameHost(t *testing.T, b []byte) int {
	t.Helper()
	host := 0
	_ = wire.DecodeOutputFrame(b, wire.MaxWorld, func(h int, _ wire.OutputRecord) { host = h })
	return host
}

func mustFrame(t *testing.T, m *outputMux, b []byte) {
	t.Helper()
	if err := m.frame(frameHost(t, b), b); err != nil {
		t.Fatalf("frame: %v", err)
	}
}

func TestOutputTagsEveryLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 16, true, false, "")
	mustFrame(t, m, frameOf(0,
		rec{3, wire.Stdout, "a\nbb\n\nccc\n"},
		rec{1, wire.Stderr, "err1\nerr2\n"},
		rec{12, wire.Stdout, "x\n"},
	))
	mustFrame(t, m, frameOf(1, rec{3, wire.Stdout, "again\n"}))
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if want := "[3] a\n[3] bb\n[3] \n[3] ccc\n[12] x\n[3] again\n"; stdout.String() != want {
		t.Errorf("stdout %q, want %q", stdout.String(), want)
	}
	if want := "[1] err1\n[1] err2\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
}

func TestOutputUntaggedIsRaw(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 4, false, false, "")
	mustFrame(t, m, frameOf(0,
		rec{0, wire.Stdout, "plain\nlines\n"},
		rec{2, wire.Stderr, "e\n"},
		rec{1, wire.Stdout, "[not a tag]\n"},
	))
	m.close()
	if stdout.String() != "plain\nlines\n[not a tag]\n" || stderr.String() != "e\n" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

const stampLayout = "2006-01-02T15:04:05.000000"

func TestOutputTimestamps(t *testing.T) {
	for _, tag := range []bool{true, false} {
		t.Run(fmt.Sprintf("tag=%v", tag), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			m := newOutputMux(&stdout, &stderr, 8, tag, true, "")
			before := time.Now().Truncate(time.Microsecond)
			mustFrame(t, m, frameOf(0, rec{5, wire.Stdout, "one\ntwo\n"}, rec{6, wire.Stderr, "three\n"}))
			after := time.Now()
			m.close()
			tagRE := ""
			if tag {
				tagRE = `\[(5|6)\] `
			}
			re := regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}) ` + tagRE + `(one|two|three)$`)
			lines := strings.Split(strings.TrimSuffix(stdout.String()+stderr.String(), "\n"), "\n")
			if len(lines) != 3 {
				t.Fatalf("lines %q", lines)
			}
			for _, l := range lines {
				sm := re.FindStringSubmatch(l)
				if sm == nil {
					t.Fatalf("line %q does not match %s", l, re)
				}
				ts, err := time.ParseInLocation(stampLayout, sm[1], time.Local)
				if err != nil {
					t.Fatal(err)
				}
				if ts.Before(before) || ts.After(after) {
					t.Errorf("timestamp %v not between %v and %v (local time expected)", ts, before, after)
				}
			}
			if !strings.HasSuffix(stdout.String(), "two\n") || !strings.HasSuffix(stderr.String(), "three\n") {
				t.Errorf("streams mixed up: stdout %q stderr %q", stdout.String(), stderr.String())
			}
		})
	}
}

func TestOutputToFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out") // created on demand
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 4, true, true, dir) // tags and stamps do not go to files
	mustFrame(t, m, frameOf(0,
		rec{0, wire.Stdout, "out 0 a\n"},
		rec{0, wire.Stderr, "err 0\n"},
		rec{3, wire.Stdout, "out 3\n"},
	))
	mustFrame(t, m, frameOf(1, rec{0, wire.Stdout, "out 0 b\nout 0 c\n"}))
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if stdout.Len() != 0 || stderr.Len() != 0 {
		t.Errorf("terminal got stdout %q stderr %q", stdout.String(), stderr.String())
	}
	want := map[string]string{
		"rank.0/stdout": "out 0 a\nout 0 b\nout 0 c\n",
		"rank.0/stderr": "err 0\n",
		"rank.3/stdout": "out 3\n",
	}
	for name, w := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != w {
			t.Errorf("%s: %q, %v; want %q", name, b, err, w)
		}
	}
	// A stream a rank never wrote on gets no file.
	for _, name := range []string{"rank.3/stderr", "rank.1", "rank.2"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists (%v)", name, err)
		}
	}
}

func TestOutputToFilesTruncates(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "rank.0"), 0o755)
	os.WriteFile(filepath.Join(dir, "rank.0", "stdout"), []byte("an older, longer run\n"), 0o644)
	m := newOutputMux(&bytes.Buffer{}, &bytes.Buffer{}, 1, false, false, dir)
	mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, "new\n"}))
	m.close()
	if b, _ := os.ReadFile(filepath.Join(dir, "rank.0", "stdout")); string(b) != "new\n" {
		t.Errorf("stdout file %q, want %q", b, "new\n")
	}
}

func TestOutputFileThatCannotBeCreated(t *testing.T) {
	dir := t.TempDir()
	// rank.1 is a file, so rank 1's directory cannot be made.
	if err := os.WriteFile(filepath.Join(dir, "rank.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 4, true, false, dir)
	for i := range 5 {
		mustFrame(t, m, frameOf(0,
			rec{1, wire.Stdout, fmt.Sprintf("lost %d\n", i)},
			rec{1, wire.Stderr, fmt.Sprintf("lost too %d\n", i)},
			rec{0, wire.Stdout, fmt.Sprintf("kept %d\n", i)},
		))
	}
	err := m.close()
	if err == nil {
		t.Error("close reports no error after output was lost")
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout %q", stdout.String())
	}
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "gorun: cannot write output of rank 1: ") {
		t.Errorf("stderr %q, want one report about rank 1", stderr.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "rank.0", "stdout")); string(b) != "kept 0\nkept 1\nkept 2\nkept 3\nkept 4\n" {
		t.Errorf("rank 0's output %q", b)
	}
}

func TestOutputDirIsAFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(dir, nil, 0o644)
	var stderr bytes.Buffer
	m := newOutputMux(&bytes.Buffer{}, &stderr, 2, true, false, dir)
	mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, "a\n"}, rec{1, wire.Stderr, "b\n"}))
	if m.close() == nil {
		t.Error("no error")
	}
	if n := strings.Count(stderr.String(), "\n"); n != 1 || !strings.Contains(stderr.String(), "cannot write output") {
		t.Errorf("stderr %q, want one report line", stderr.String())
	}
}

func TestOutputReportAndAgentLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 1, true, true, "")
	m.report("rank %d on host %s %s", 2, "h", "exited with code 3")
	m.agentLine("node7", []byte("something broke\n\n"))
	m.agentLine("node7", []byte("no newline"))
	m.close()
	want := "gorun: rank 2 on host h exited with code 3\n" +
		"gorun agent node7: something broke\n" +
		"gorun agent node7: no newline\n"
	if stderr.String() != want || stdout.Len() != 0 {
		t.Errorf("stderr %q, want %q; stdout %q", stderr.String(), want, stdout.String())
	}
}

func TestOutputInvalidFrame(t *testing.T) {
	good := frameOf(0, rec{0, wire.Stdout, "fine\n"}, rec{1, wire.Stdout, "also fine\n"})
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"bad magic", append([]byte("X"), good[1:]...)},
		{"bad version", append([]byte{'O', 9}, good[2:]...)},
		{"truncated", good[:len(good)-3]},
		{"rank out of world", frameOf(0, rec{0, wire.Stdout, "ok\n"}, rec{2, wire.Stdout, "rank 2 of 2\n"})},
		{"bad stream", frameOf(0, rec{0, wire.Stdout, "ok\n"}, rec{1, 3, "?\n"})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			m := newOutputMux(&stdout, &stderr, 2, true, false, "")
			err := m.frame(0, tt.b)
			if !errors.Is(err, wire.ErrMalformed) {
				t.Errorf("frame = %v, want ErrMalformed", err)
			}
			m.drain(nil)
			// Nothing of a bad frame is written, not even its valid first records.
			if stdout.Len() != 0 || stderr.Len() != 0 {
				t.Errorf("wrote stdout %q stderr %q", stdout.String(), stderr.String())
			}
			// The mux goes on working.
			mustFrame(t, m, good)
			m.close()
			if stdout.String() != "[0] fine\n[1] also fine\n" {
				t.Errorf("after a bad frame: %q", stdout.String())
			}
		})
	}
}
