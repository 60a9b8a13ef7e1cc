package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSweepOMPIDirs: an Open MPI directory an agent holds (makeHeldDir)
// survives the sweep of another agent of the host; one nobody holds (its
// agent was killed) is removed with its files; what is not an Open MPI
// directory is left alone. Once its holder lets go, the held one goes too.
func TestSweepOMPIDirs(t *testing.T) {
	dir := t.TempDir()
	held, err := makeHeldDir(filepath.Join(dir, "gorun-joba-h0-g0"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	orphan := filepath.Join(dir, "gorun-jobb-h2-g1")
	if err := os.Mkdir(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan, "vader_segment.0"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	others := []string{"gorun-jobc-x", "gorun-jobd-h1", "gorun-jobe-hx-g0", "other"}
	for _, o := range others {
		if err := os.Mkdir(filepath.Join(dir, o), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// A slot file's name, not a directory.
	if err := os.WriteFile(filepath.Join(dir, "gorun-jobf-h0-g0"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	// The Open MPI directories of job ("": any) that sweepShm removes.
	sweepOMPI := func(job string) ([]string, error) {
		s, err := sweepShm(dir, job, false, mpichSweep{})
		return s.OMPIDirs, err
	}
	swept, err := sweepOMPI("")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(swept, []string{"gorun-jobb-h2-g1"}) {
		t.Errorf("swept %q, want only the orphan", swept)
	}
	for _, keep := range append(others, "gorun-joba-h0-g0", "gorun-jobf-h0-g0") {
		if _, err := os.Lstat(filepath.Join(dir, keep)); err != nil {
			t.Errorf("%s: %v (must be left)", keep, err)
		}
	}
	if _, err := os.Lstat(orphan); !os.IsNotExist(err) {
		t.Errorf("the orphan is still there: %v", err)
	}

	// An agent's end sweeps its own job's only.
	for _, o := range []string{"gorun-jobg-h0-g0", "gorun-jobg-h1-g2", "gorun-jobh-h0-g0", "gorun-jobg-h1-g0-h0-g0"} {
		if err := os.Mkdir(filepath.Join(dir, o), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	swept, err = sweepOMPI("jobg")
	if slices.Sort(swept); err != nil || !slices.Equal(swept, []string{"gorun-jobg-h0-g0", "gorun-jobg-h1-g2"}) {
		t.Errorf("job jobg's sweep: %q, %v; want its two directories", swept, err)
	}
	if swept, err = sweepOMPI(""); err != nil || len(swept) != 2 {
		t.Errorf("the other jobs' directories: swept %q, %v; want two", swept, err)
	}

	held.Close()
	if swept, err = sweepOMPI(""); err != nil || !slices.Equal(swept, []string{"gorun-joba-h0-g0"}) {
		t.Errorf("after its holder closed it: swept %q, %v", swept, err)
	}
}

// TestMakeHeldDirAgain: a directory that exists (an agent's second table
// of the same generation) is taken as it is and held.
func TestMakeHeldDirAgain(t *testing.T) {
	d := filepath.Join(t.TempDir(), "gorun-j-h0-g0")
	for range 2 {
		f, err := makeHeldDir(d)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
}

func TestOMPIDirName(t *testing.T) {
	for name, want := range map[string]bool{
		"gorun-abc-h0-g0":           true,
		"gorun-a-b-h12-g3":          true,
		"gorun-abc-h0":              false,
		"gorun-abc-hx-g0":           false,
		"gorun-abc-h0-gx":           false,
		"gorun--h0-g0":              false,
		"gorun-abc-h0-g0.lock":      false,
		"other-abc-h0-g0":           false,
		"gorun-abc-h99999999999-g0": false,
		"gorun-ABC-h0-g0":           false,
	} {
		if got := ompiDirName(name); got != want {
			t.Errorf("ompiDirName(%q) = %v, want %v", name, got, want)
		}
	}
}
