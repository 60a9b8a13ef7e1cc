package topology

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/good/*.golden from the parser's output")

// formatHosts renders hosts one per line for golden files.
func formatHosts(hosts []Host) string {
	var b strings.Builder
	for _, h := range hosts {
		fmt.Fprintf(&b, "%s slots=%d max_slots=%d rack=%q switch=%q spare=%t source=%s\n",
			h.Name, h.Slots, h.MaxSlots, h.Rack, h.Switch, h.Spare, h.Source)
	}
	return b.String()
}

// TestGoodFixtures parses testdata/good/*.hosts and compares the result
// with the .golden file beside each (go test -update rewrites them).
func TestGoodFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/good/*.hosts")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, path := range files {
		name := strings.TrimPrefix(filepath.ToSlash(path), "testdata/")
		t.Run(name, func(t *testing.T) {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			hosts, err := ParseHostfile(f, name)
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, hosts)
			got := formatHosts(hosts)
			golden := strings.TrimSuffix(path, ".hosts") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("%s:\n got:\n%s\nwant:\n%s", name, got, want)
			}
		})
	}
}

// sentinels maps names used in "# want:" headers to errors.
var sentinels = map[string]error{
	"ErrSyntax": ErrSyntax, "ErrBadValue": ErrBadValue, "ErrBadHostName": ErrBadHostName,
	"ErrBadNodeList": ErrBadNodeList, "ErrConflict": ErrConflict, "ErrTooLarge": ErrTooLarge,
	"ErrNoHosts": ErrNoHosts,
}

// TestBadFixtures parses testdata/bad/*.hosts, each starting with a
// "# want: LINE SENTINEL MESSAGE" comment, and checks the error.
func TestBadFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.hosts")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, path := range files {
		name := strings.TrimPrefix(filepath.ToSlash(path), "testdata/")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			header, _, _ := strings.Cut(string(data), "\n")
			spec, ok := strings.CutPrefix(header, "# want: ")
			fields := strings.SplitN(spec, " ", 3)
			if !ok || len(fields) != 3 {
				t.Fatalf("first line %q is not # want: LINE SENTINEL MESSAGE", header)
			}
			line, err := strconv.Atoi(fields[0])
			kind := sentinels[fields[1]]
			if err != nil || kind == nil {
				t.Fatalf("bad header %q", header)
			}
			_, err = ParseHostfile(strings.NewReader(string(data)), name)
			checkHostfileError(t, err, name, line, kind, fields[2])
		})
	}
}

// TestExampleHostfiles parses every file in ../hostfiles, the examples
// shipped for users.
func TestExampleHostfiles(t *testing.T) {
	files, err := filepath.Glob("../hostfiles/*")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("found %d example hostfiles in ../hostfiles, want at least 4", len(files))
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			hosts, err := ReadHostfile(path)
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, hosts)
			if _, err := MapRanks(hosts, MapOptions{NP: 1}); err != nil {
				t.Errorf("MapRanks(NP=1): %v", err)
			}
		})
	}
}

// checkInvariants checks what every successful parse guarantees.
func checkInvariants(t testing.TB, hosts []Host) {
	t.Helper()
	if len(hosts) == 0 || len(hosts) > maxHosts {
		t.Fatalf("parse returned %d hosts", len(hosts))
	}
	seen := make(map[string]bool, len(hosts))
	for i, h := range hosts {
		if h.Name == "" || seen[h.Name] {
			t.Fatalf("host %d: empty or repeated name %q", i, h.Name)
		}
		seen[h.Name] = true
		if strings.Contains(h.Name, ":") {
			if a, err := netip.ParseAddr(h.Name); err != nil || !a.Is6() {
				t.Fatalf("host %d: name %q has ':' but is not an IPv6 address", i, h.Name)
			}
		} else if err := checkHostName(h.Name); err != nil {
			t.Fatalf("host %d: %v", i, err)
		}
		if h.Slots < 1 || h.Slots > maxSlots {
			t.Fatalf("host %d (%s): slots %d", i, h.Name, h.Slots)
		}
		if h.MaxSlots != 0 && (h.MaxSlots < h.Slots || h.MaxSlots > maxSlots) {
			t.Fatalf("host %d (%s): max_slots %d with slots %d", i, h.Name, h.MaxSlots, h.Slots)
		}
		if h.Source == "" {
			t.Fatalf("host %d (%s): no source", i, h.Name)
		}
		for _, l := range []string{h.Rack, h.Switch} {
			if _, err := parseLabel("label", l); err != nil {
				t.Fatalf("host %d (%s): %v", i, h.Name, err)
			}
		}
	}
}
