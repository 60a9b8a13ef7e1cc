package hotswap

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImports: hotswap makes decisions only; it imports topology and the
// standard library, nothing else (DESIGN §2).
func TestImports(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if p != "github.com/gorun/gorun/topology" && strings.Contains(strings.SplitN(p, "/", 2)[0], ".") {
				t.Errorf("%s imports %s", f, p)
			}
			if p == "os" || p == "net" || p == "os/exec" {
				t.Errorf("%s imports %s: the machine does no I/O", f, p)
			}
		}
	}
}
