package depcheck

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tableLead begins the line of README.md that introduces the package
// table.
const tableLead = "The packages follow `../shared/DESIGN.md` §2"

// TestREADMEPackageTable: the package table of README.md has one row per
// package of the module (go list ./...), and its other rows name
// directories of the tree without a Go package (examples/torch, python/):
// a package added, removed or renamed without the README following fails
// here.
func TestREADMEPackageTable(t *testing.T) {
	root := moduleRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tableRows(string(readme))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	isDir := func(dir string) bool {
		fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(dir)))
		return err == nil && fi.IsDir()
	}
	for _, p := range checkTable(rows, modulePackages(t), isDir) {
		t.Errorf("README.md's package table: %s", p)
	}
}

// TestCheckTable: checkTable reports a package without a row, a row
// naming nothing, a duplicate row; and accepts rows of non-Go directories
// and a trailing slash.
func TestCheckTable(t *testing.T) {
	pkgs := []string{"ckpt", "internal/agent", "examples/hello"}
	dirs := []string{"ckpt", "internal/agent", "examples/hello", "examples", "python"}
	isDir := func(d string) bool { return slices.Contains(dirs, d) }
	for _, tt := range []struct {
		name string
		rows []string
		want []string
	}{
		{"exact", []string{"ckpt/", "internal/agent", "examples/hello"}, nil},
		{"non-Go directory", []string{"ckpt", "internal/agent", "examples/hello", "python/"}, nil},
		{"package missing", []string{"ckpt", "examples/hello"}, []string{"no row for package internal/agent"}},
		{"package gone", []string{"ckpt", "internal/agent", "examples/hello", "rank/"}, []string{"row rank names no package and no directory of the tree"}},
		{"duplicate", []string{"ckpt", "internal/agent", "examples/hello", "ckpt/"}, []string{"two rows for ckpt"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkTable(tt.rows, pkgs, isDir); !slices.Equal(got, tt.want) {
				t.Errorf("checkTable(%q) = %q, want %q", tt.rows, got, tt.want)
			}
		})
	}
}

// TestTableRows: tableRows reads the first cell of each row after the
// table's header, up to the first line that is not a row, and refuses a
// missing table or a first cell that is not one code span.
func TestTableRows(t *testing.T) {
	for _, tt := range []struct {
		name, text string
		want       []string
		err        bool
	}{
		{"rows", "x\n" + tableLead + ":\n\n| package | what |\n|---|---|\n| `a/` | A |\n| `b/c` | B, `d` |\n\nafter\n| `e` | not read |\n", []string{"a", "b/c"}, false},
		{"no lead", "| package | what |\n|---|---|\n| `a` | A |\n", nil, true},
		{"no table", tableLead + ":\n\ntext\n", nil, true},
		{"two names", tableLead + ":\n\n| package | what |\n|---|---|\n| `a`, `b` | A |\n", nil, true},
		{"plain name", tableLead + ":\n\n| package | what |\n|---|---|\n| a | A |\n", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tableRows(tt.text)
			if (err != nil) != tt.err || !slices.Equal(got, tt.want) {
				t.Errorf("tableRows = %q, %v; want %q, error %v", got, err, tt.want, tt.err)
			}
		})
	}
}

// tableRows returns the directories the package table of a README names:
// the first cell of every row of the table that follows the line beginning
// with tableLead, each one code span (`ckpt/`), without its trailing slash.
func tableRows(readme string) ([]string, error) {
	lines := strings.Split(readme, "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, tableLead) })
	if i < 0 {
		return nil, fmt.Errorf("no line begins with %q", tableLead)
	}
	for i++; i < len(lines) && !strings.HasPrefix(lines[i], "|"); i++ {
		if strings.HasPrefix(lines[i], "#") {
			break
		}
	}
	if i+1 >= len(lines) || !strings.HasPrefix(lines[i], "|") || !strings.HasPrefix(lines[i+1], "|---") {
		return nil, errors.New("no table (header and |---| line) after " + tableLead)
	}
	var rows []string
	for _, l := range lines[i+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		cells := strings.Split(l, "|")
		first := strings.TrimSpace(cells[1])
		name, ok := strings.CutPrefix(first, "`")
		name, ok2 := strings.CutSuffix(name, "`")
		if !ok || !ok2 || name == "" || strings.ContainsAny(name, "` ,") {
			return nil, fmt.Errorf("row %q: the first cell is not one directory as code (`dir/`)", l)
		}
		rows = append(rows, strings.TrimSuffix(name, "/"))
	}
	return rows, nil
}

// checkTable returns what is wrong with the table's rows, given the
// module's packages (pkgs, as paths under the module) and isDir, which
// tells whether a directory exists in the tree: a package without a row,
// a row naming neither a package nor a directory, two rows for one name.
// A row's trailing slash is not part of its name.
func checkTable(rows, pkgs []string, isDir func(dir string) bool) []string {
	var problems []string
	seen := map[string]bool{}
	for _, r := range rows {
		r = strings.TrimSuffix(r, "/")
		if seen[r] {
			problems = append(problems, "two rows for "+r)
			continue
		}
		seen[r] = true
		if !slices.Contains(pkgs, r) && !isDir(r) {
			problems = append(problems, "row "+r+" names no package and no directory of the tree")
		}
	}
	for _, p := range pkgs {
		if !seen[p] {
			problems = append(problems, "no row for package "+p)
		}
	}
	return problems
}

// moduleRoot returns the directory of the module's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatalf("go env GOMOD: not in a module (%q)", gomod)
	}
	return filepath.Dir(gomod)
}
