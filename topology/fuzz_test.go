package topology

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// lowerHostLimit lowers maxHosts for the duration of a fuzz test, so that
// the fuzzer explores the grammar instead of spending seconds on inputs
// that expand to a million hosts. The limit itself has unit tests.
func lowerHostLimit(f *testing.F) {
	old := maxHosts
	maxHosts = 5000
	f.Cleanup(func() { maxHosts = old })
}

// seedFiles returns the contents of the fixture and example hostfiles
// up to 8 KiB.
func seedFiles(f *testing.F) []string {
	f.Helper()
	var out []string
	for _, pattern := range []string{"testdata/good/*.hosts", "testdata/bad/*.hosts", "../hostfiles/*"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		for _, path := range files {
			data, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			if len(data) > 8<<10 {
				continue // large seeds (the long-line fixture) make minimization crawl
			}
			out = append(out, string(data))
		}
	}
	return out
}

// FuzzParseHostfile checks that ParseHostfile never panics, that failures
// are *HostfileError with a line in range wrapping a sentinel, and that
// successful parses satisfy the documented invariants.
func FuzzParseHostfile(f *testing.F) {
	lowerHostLimit(f)
	for _, s := range seedFiles(f) {
		f.Add(s)
	}
	for _, s := range []string{"", "a", "a:2", "[::1]:2", "n[1-3] slots=2 max_slots=4 rack=r switch=s spare", "a\na spare", "a,b:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		hosts, err := ParseHostfile(strings.NewReader(in), "f")
		if err != nil {
			var he *HostfileError
			if !errors.As(err, &he) {
				t.Fatalf("error %q (%T) is not a *HostfileError", err, err)
			}
			if lines := strings.Count(in, "\n") + 1; he.Line < 0 || he.Line > lines {
				t.Fatalf("error at line %d of a %d-line input: %v", he.Line, lines, err)
			}
			if !isSentinel(err) {
				t.Fatalf("error %q wraps no sentinel", err)
			}
			return
		}
		checkInvariants(t, hosts)
		for _, h := range hosts {
			if !strings.HasPrefix(h.Source, "f:") {
				t.Fatalf("host %q has source %q", h.Name, h.Source)
			}
		}
		// Any order-independent rank count fits the parsed hosts when
		// oversubscribing without limits, or fails cleanly.
		if _, err := MapRanks(hosts, MapOptions{NP: 3, By: MapByNode, Oversubscribe: true}); err != nil &&
			!errors.Is(err, ErrNoSlots) && !errors.Is(err, ErrTooManyRanks) {
			t.Fatalf("MapRanks: %v", err)
		}
	})
}

// FuzzExpandNodeList checks that ExpandNodeList never panics, that its
// names are valid, bounded and consistent with a plain list.
func FuzzExpandNodeList(f *testing.F) {
	lowerHostLimit(f)
	for _, s := range []string{"node[01-04,07],gpu[1-2]x,login", "rack[1-2]-node[01-04]", "n[001-128]", "r[1-2]n[1-2]", "a,b", "n[08-11]", "n[", "n[3-1]", "n[]", "a,,b", "10.0.0.[1-4]"} {
		f.Add(s)
	}
	for _, s := range seedFiles(f) {
		for _, line := range strings.Split(s, "\n") {
			if fields := strings.Fields(line); len(fields) > 0 && !strings.HasPrefix(fields[0], "#") {
				f.Add(fields[0])
			}
		}
	}
	f.Fuzz(func(t *testing.T, in string) {
		names, err := ExpandNodeList(in)
		if badInput(t, err) {
			return
		}
		if len(names) == 0 || len(names) > maxHosts {
			t.Fatalf("%d names", len(names))
		}
		for _, n := range names {
			if err := checkHostName(n); err != nil {
				t.Fatalf("name %q: %v", n, err)
			}
		}
		if !strings.ContainsAny(in, "[]") {
			if got := strings.Join(names, ","); got != in {
				t.Fatalf("plain list %q expanded to %q", in, got)
			}
		}
		// Expanding the expansion changes nothing.
		again, err := ExpandNodeList(strings.Join(names, ","))
		if err != nil || len(again) != len(names) {
			t.Fatalf("re-expanding %d names: %d, %v", len(names), len(again), err)
		}
	})
}

// FuzzParseHostList checks ParseHostList like FuzzParseHostfile.
func FuzzParseHostList(f *testing.F) {
	lowerHostLimit(f)
	for _, s := range []string{"h1:2,h2,node[01-03]:4", "[::1]:2,b", "a,a", "", "a:0", "n[1-2]:x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		hosts, err := ParseHostList(in)
		if badInput(t, err) {
			return
		}
		checkInvariants(t, hosts)
		for _, h := range hosts {
			if h.MaxSlots != 0 || h.Rack != "" || h.Switch != "" || h.Spare {
				t.Fatalf("host list gave attributes: %+v", h)
			}
		}
	})
}

// badInput reports whether err is set, failing t unless it wraps one of the
// package's sentinels and starts "topology: ".
func badInput(t *testing.T, err error) bool {
	t.Helper()
	if err != nil && (!isSentinel(err) || !strings.HasPrefix(err.Error(), "topology: ")) {
		t.Fatalf("error %q", err)
	}
	return err != nil
}

func isSentinel(err error) bool {
	for _, s := range []error{ErrSyntax, ErrBadValue, ErrBadHostName, ErrBadNodeList, ErrConflict,
		ErrTooLarge, ErrNoHosts, ErrNoSlots, ErrTooManyRanks, ErrBadMapBy, ErrBadNP} {
		if errors.Is(err, s) {
			return true
		}
	}
	// Read errors are not sentinels, but strings.Reader never fails.
	return false
}

// FuzzSlurmCounts checks that ParseSlurmCounts never panics, stays within
// its bounds, and reads back its own compressed form.
func FuzzSlurmCounts(f *testing.F) {
	lowerHostLimit(f)
	for _, s := range []string{"2(x3),1", "40,8", "1", "0", "2(x", "(x2)", "1(x1000000)", "3(x2),3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		counts, err := ParseSlurmCounts(in)
		if badInput(t, err) {
			return
		}
		if len(counts) == 0 || len(counts) > maxHosts {
			t.Fatalf("%d counts", len(counts))
		}
		for _, c := range counts {
			if c < 1 || c > maxSlots {
				t.Fatalf("count %d", c)
			}
		}
		again, err := ParseSlurmCounts(SlurmCountsString(counts))
		if err != nil || !slices.Equal(again, counts) {
			t.Fatalf("round trip of %v through %q: %v, %v", counts, SlurmCountsString(counts), again, err)
		}
	})
}

// FuzzSlurmHosts checks that SlurmHosts never panics and agrees with
// ExpandNodeList on the node count.
func FuzzSlurmHosts(f *testing.F) {
	lowerHostLimit(f)
	f.Add("gr[0-2]", "2(x3)", "1(x3)", "", "", "", "")
	f.Add("rack[1-2]-node[01-04]", "", "8", "", "2", "", "")
	f.Add("n[001-128]", "64(x128)", "", "4", "", "", "0")
	f.Add("a,b", "3,1", "", "", "1", "", "")
	f.Add("h[0-2]", "2(x3)", "1", "", "1", "h0", "")
	f.Add("h[0-1]", "2(x2)", "1(x2)", "", "2", "h[0-1]", "4")
	f.Fuzz(func(t *testing.T, list, cpus, tasks, perTask, ntasks, step, gpus string) {
		env := map[string]string{"SLURM_JOB_NODELIST": list, "SLURM_JOB_CPUS_PER_NODE": cpus, "SLURM_TASKS_PER_NODE": tasks, "SLURM_CPUS_PER_TASK": perTask, "SLURM_NTASKS": ntasks, "SLURM_CPUS_ON_NODE": cpus,
			"SLURM_STEP_NODELIST": step, "SLURM_GPUS_ON_NODE": gpus}
		hosts, err := SlurmHosts(func(k string) string { return env[k] }, 1)
		if badInput(t, err) {
			return
		}
		names, err := ExpandNodeList(list)
		if err != nil || len(names) != len(hosts) {
			t.Fatalf("%d hosts from %q, ExpandNodeList: %d, %v", len(hosts), list, len(names), err)
		}
		for i, h := range hosts {
			if h.Name != names[i] || h.Slots < 1 || h.Slots > maxSlots {
				t.Fatalf("host %d: %+v", i, h)
			}
		}
	})
}
