package durable

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
)

// The test binary plays the writer that TestKillDuringSaves kills: with
// GORUN_DURABLE_HELPER set, TestMain runs the helper it names instead of
// the tests.
func TestMain(m *testing.M) {
	switch h := os.Getenv("GORUN_DURABLE_HELPER"); h {
	case "":
		os.Exit(m.Run())
	case "saveloop":
		if err := saveLoop(os.Getenv("GORUN_DURABLE_DIR")); err != nil {
			fmt.Fprintln(os.Stderr, "saveloop:", err)
			os.Exit(1)
		}
		os.Exit(0)
	default:
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", h)
		os.Exit(2)
	}
}

// killRegions are large enough for a kill to land inside a save often.
var killRegions = []Region{
	{Name: "optimizer", Size: 4 << 20},
	{Name: "params", Size: 2<<20 + 1000},
	{Name: "meta", Size: 100},
}

// killData returns killRegions' bytes at step, and their CRC32Cs.
func killData(step int64) ([][]byte, []uint32) {
	r := rand.New(rand.NewPCG(uint64(step), 99))
	src := make([][]byte, len(killRegions))
	sums := make([]uint32, len(killRegions))
	for i, reg := range killRegions {
		b := make([]byte, (reg.Size+7)&^7)
		for j := 0; j < len(b); j += 8 {
			le.PutUint64(b[j:], r.Uint64())
		}
		src[i] = b[:reg.Size]
		sums[i] = crc32c.Checksum(src[i])
	}
	return src, sums
}

// saveLoop is the helper: it resumes the job in dir at its commit record
// and saves, commits and reclaims steps after it, two saves at a time,
// until it is killed, printing "committed N" after each commit.
func saveLoop(dir string) error {
	s, err := Open(dir, 0, killRegions, Options{Concurrency: 2, Writers: 3, ChunkSize: 64 << 10})
	if err != nil {
		return err
	}
	committed, err := ReadCommitted(dir)
	switch {
	case errors.Is(err, ErrNotCommitted):
		committed = 0
	case err != nil:
		return err
	default:
		if err := s.Truncate(committed); err != nil {
			return err
		}
		if _, err := s.Reclaim(committed); err != nil {
			return err
		}
	}
	var mu sync.Mutex // serializes the commits and the output
	sem := make(chan struct{}, 2)
	errc := make(chan error, 1)
	for step := committed + 1; ; step++ {
		select {
		case err := <-errc:
			return err
		case sem <- struct{}{}:
		}
		go func() {
			defer func() { <-sem }()
			src, sums := killData(step)
			err := s.Save(context.Background(), step, src, sums, nil)
			if errors.Is(err, ErrBusy) {
				return
			}
			if err == nil {
				mu.Lock()
				defer mu.Unlock()
				if err = Commit(dir, step); err == nil {
					var c int64
					if c, err = ReadCommitted(dir); err == nil {
						fmt.Printf("committed %d\n", c)
						_, err = s.Reclaim(c)
					}
				}
			}
			if err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		}()
	}
}

// TestKillDuringSaves SIGKILLs a process that saves, commits and
// reclaims versions in a loop at varied moments, restarts it on the same
// directory, and after every kill checks that Verify finds nothing wrong
// and that the committed version (at least the last one the process
// reported) loads intact.
func TestKillDuringSaves(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary repeatedly")
	}
	dir := t.TempDir()
	m := &Manifest{Job: "kill", World: 1, Regions: [][]Region{killRegions}, Protect: "full", Every: 1, Command: "saveloop"}
	if err := CreateManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	var reported int64 = -1
	for round := range 30 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "GORUN_DURABLE_HELPER=saveloop", "GORUN_DURABLE_DIR="+dir)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Let it commit 1 to 3 steps, then kill it a little later (the
		// pause picks the moment; it synchronizes nothing).
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		for range 1 + round%3 {
			var line string
			var ok bool
			select {
			case line, ok = <-lines:
			case <-time.After(2 * time.Minute): // a hang guard
			}
			if !ok {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: the helper stopped committing: %s", round, stderr.String())
			}
			c, err := strconv.ParseInt(strings.TrimPrefix(line, "committed "), 10, 64)
			if err != nil {
				t.Fatalf("round %d: the helper said %q", round, line)
			}
			if c < reported {
				t.Errorf("round %d: the commit record went back from %d to %d", round, reported, c)
			}
			reported = c
		}
		time.Sleep(time.Duration(r.IntN(30_000)) * time.Microsecond)
		cmd.Process.Kill()
		for range lines { // until the pipe closes
		}
		cmd.Wait()

		c, err := ReadCommitted(dir)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if c < reported {
			t.Errorf("round %d: committed %d, the helper reported %d", round, c, reported)
		}
		reported = c
		checkVerify(t, dir)
		dst := make([][]byte, len(killRegions))
		for i, reg := range killRegions {
			dst[i] = make([]byte, reg.Size)
		}
		if err := Load(context.Background(), dir, 0, c, dst); err != nil {
			t.Fatalf("round %d: Load(%d): %v", round, c, err)
		}
		want, _ := killData(c)
		for i := range want {
			if !bytes.Equal(dst[i], want[i]) {
				t.Fatalf("round %d: step %d: region %q differs", round, c, killRegions[i].Name)
			}
		}
		t.Logf("round %d: killed at committed step %d", round, c)
	}
}
