package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeFlagRows returns the flag names of each row of README's flag table
// (section "Using gorun"), as written in its first column: the backquoted
// spans' first words, up to an argument or [=false] ("`-x VAR=value`": -x).
func readmeFlagRows(t *testing.T, readme string) [][]string {
	t.Helper()
	_, sec, ok := strings.Cut(readme, "\n## Using gorun\n")
	if !ok {
		t.Fatal(`README.md has no section "## Using gorun"`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	_, table, ok := strings.Cut(sec, "\n| flag | what it does |\n|---|---|\n")
	if !ok {
		t.Fatal(`README.md's "Using gorun" has no "| flag | what it does |" table`)
	}
	span := regexp.MustCompile("`([^`]*)`")
	name := regexp.MustCompile(`^-{1,2}[A-Za-z][A-Za-z0-9-]*`)
	var rows [][]string
	for line := range strings.SplitSeq(table, "\n") {
		if !strings.HasPrefix(line, "|") {
			break // the table's end
		}
		// The first cell: up to the first | not escaped as \|.
		cell := regexp.MustCompile(`^\|((?:[^|\\]|\\.)*)\|`).FindStringSubmatch(line)
		if cell == nil {
			t.Fatalf("README flag table: cannot read the row %q", line)
		}
		var names []string
		for _, m := range span.FindAllStringSubmatch(cell[1], -1) {
			n := name.FindString(m[1])
			if n == "" {
				t.Errorf("README flag table: %q in row %q names no flag", m[0], line)
				continue
			}
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
		rows = append(rows, names)
	}
	if len(rows) == 0 {
		t.Fatal("README flag table has no rows")
	}
	return rows
}

// checkReadmeFlags compares README's flag rows with specs: every name of a
// flag that is not hidden is in README, in the row of its other names, and
// README names no other flag (nor a hidden one).
func checkReadmeFlags(rows [][]string, specs []flagSpec) []string {
	var problems []string
	rowOf := map[string]int{}
	for i, row := range rows {
		for _, n := range row {
			if j, dup := rowOf[n]; dup {
				problems = append(problems, n+" is in two rows of README's flag table: "+strings.Join(rows[j], ", ")+" and "+strings.Join(row, ", "))
			}
			rowOf[n] = i
		}
	}
	known := map[string]bool{}
	for _, s := range specs {
		for _, n := range s.names {
			known[n] = !s.hidden
		}
		if s.hidden {
			continue
		}
		row := -1
		for _, n := range s.names {
			i, ok := rowOf[n]
			switch {
			case !ok:
				problems = append(problems, n+" (gorun "+s.names[0]+") is not in README's flag table")
			case row >= 0 && i != row:
				problems = append(problems, n+" is not in the same README row as its alias "+s.names[0])
			default:
				row = i
			}
		}
	}
	for _, row := range rows {
		for _, n := range row {
			shown, ok := known[n]
			switch {
			case !ok:
				problems = append(problems, "README's flag table lists "+n+", which gorun does not have")
			case !shown:
				problems = append(problems, "README's flag table lists "+n+", which is hidden")
			}
		}
	}
	return problems
}

// TestREADMEFlagTable: README's flag table lists exactly gorun's flags
// (runFlags), each with its aliases in one row. The rows' texts are
// README's own (longer than the usage's help): they are not compared.
func TestREADMEFlagTable(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkReadmeFlags(readmeFlagRows(t, string(b)), runFlags(&runOptions{}, &runFlagArgs{})) {
		t.Error(p)
	}
}

// TestREADMEFlagCheck: the comparison TestREADMEFlagTable makes fails on
// a flag missing from either side, an alias in another row, and a hidden
// flag listed.
func TestREADMEFlagCheck(t *testing.T) {
	specs := []flagSpec{
		{names: []string{"-np", "-n"}},
		{names: []string{"--tp"}},
		{names: []string{"--pp"}},
		{names: []string{"--secret"}, hidden: true},
	}
	tests := []struct {
		name string
		rows [][]string
		want string // in a problem; "" for none
	}{
		{"same", [][]string{{"-np", "-n"}, {"--tp", "--pp"}}, ""},
		{"flag missing from README", [][]string{{"-np", "-n"}, {"--tp"}}, "--pp (gorun --pp) is not in README"},
		{"alias missing from README", [][]string{{"-np"}, {"--tp", "--pp"}}, "-n (gorun -np) is not in README"},
		{"flag gorun lacks", [][]string{{"-np", "-n"}, {"--tp", "--pp"}, {"--ep"}}, "lists --ep, which gorun does not have"},
		{"alias in another row", [][]string{{"-np"}, {"-n"}, {"--tp", "--pp"}}, "-n is not in the same README row"},
		{"hidden flag listed", [][]string{{"-np", "-n"}, {"--tp", "--pp"}, {"--secret"}}, "--secret, which is hidden"},
		{"flag in two rows", [][]string{{"-np", "-n"}, {"--tp", "--pp"}, {"--tp"}}, "--tp is in two rows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkReadmeFlags(tt.rows, specs)
			if tt.want == "" {
				if len(got) > 0 {
					t.Errorf("problems %q, want none", got)
				}
				return
			}
			if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("problems %q, want one saying %q", got, tt.want)
			}
		})
	}
}

// TestREADMEFlagRows: the README reader finds the table's rows and their
// flags, escaped pipes and arguments included.
func TestREADMEFlagRows(t *testing.T) {
	readme := "# x\n\n## Using gorun\n\ntext\n\n| flag | what it does |\n|---|---|\n" +
		"| `-np N`, `-n N` | ranks |\n" +
		"| `--map-by slot\\|node` | fill `slot` |\n" +
		"| `-x VAR`, `-x VAR=value` | export |\n" +
		"| `--pmi[=false]` | PMI |\n" +
		"\nafter\n\n## Next\n\n| flag | what it does |\n|---|---|\n| `--other` | no |\n"
	got := readmeFlagRows(t, readme)
	want := [][]string{{"-np", "-n"}, {"--map-by"}, {"-x"}, {"--pmi"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("rows %q, want %q", got, want)
	}
}
