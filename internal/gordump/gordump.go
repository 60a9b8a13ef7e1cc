package gordump

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Module is gorun's module path: a goroutine with a frame in it is
// gorun's.
const Module = "github.com/gorun/gorun"

// ErrFormat: the text is not a goroutine dump.
var ErrFormat = errors.New("gordump: not a goroutine dump")

// Goroutine is one goroutine of a dump.
type Goroutine struct {
	ID    int
	State string   // "running", "chan receive, 2 minutes", ...
	Funcs []string // its frames' functions, innermost first, then its creator's
	Stack string   // its text in the dump, header included
}

// Gorun reports whether g runs, or was created by, gorun's code.
func (g Goroutine) Gorun() bool {
	return slices.ContainsFunc(g.Funcs, func(f string) bool {
		return strings.HasPrefix(f, Module+"/") || strings.HasPrefix(f, "main.")
	})
}

// Parse reads a dump: goroutines separated by blank lines, each a header
// "goroutine N [STATE]:", then per frame a function line and a
// tab-indented file line, and maybe "created by F in goroutine M".
func Parse(dump []byte) ([]Goroutine, error) {
	var out []Goroutine
	for _, block := range strings.Split(strings.TrimSpace(string(dump)), "\n\n") {
		block = strings.Trim(block, "\n")
		if block == "" {
			continue
		}
		lines := strings.Split(block, "\n")
		g, err := header(lines[0])
		if err != nil {
			return nil, err
		}
		g.Stack = block
		for _, l := range lines[1:] {
			if l == "" || l[0] == '\t' || strings.HasPrefix(l, "...") {
				continue // a file line; "...additional frames elided..."
			}
			l = strings.TrimPrefix(l, "created by ")
			if i := strings.Index(l, " in goroutine "); i >= 0 {
				l = l[:i]
			}
			if i := strings.LastIndexByte(l, '('); i > 0 && strings.HasSuffix(l, ")") {
				l = l[:i] // its arguments
			}
			g.Funcs = append(g.Funcs, l)
		}
		out = append(out, g)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no goroutine", ErrFormat)
	}
	return out, nil
}

// header parses "goroutine N [STATE]:".
func header(l string) (Goroutine, error) {
	rest, ok := strings.CutPrefix(l, "goroutine ")
	id, state, ok2 := strings.Cut(rest, " [")
	state, ok3 := strings.CutSuffix(state, "]:")
	n, err := strconv.Atoi(id)
	if !ok || !ok2 || !ok3 || err != nil {
		return Goroutine{}, fmt.Errorf("%w: header %q", ErrFormat, l)
	}
	return Goroutine{ID: n, State: state}, nil
}

// Leftover returns gorun's goroutines in dump other than the first, the
// one that took it (runtime.Stack writes the caller's first), and the
// main goroutine (main.main's: the program itself, whose return is its
// exit; a test binary's runs the tests).
func Leftover(dump []byte) ([]Goroutine, error) {
	gs, err := Parse(dump)
	if err != nil {
		return nil, err
	}
	var out []Goroutine
	for _, g := range gs[1:] {
		if g.Gorun() && !slices.Contains(g.Funcs, "main.main") {
			out = append(out, g)
		}
	}
	return out, nil
}

// Take returns the dump of every goroutine, the caller's first.
func Take() []byte {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) || len(buf) >= 64<<20 {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waiting, when set (by a test), is called each time Write found gorun's
// goroutines left and is about to wait for them.
var waiting func()

// Write writes a dump of every goroutine to path, once gorun's other
// goroutines are gone or wait has passed: goroutines ending as their
// owner returns (a closed connection's reader) may take a moment after
// it. It polls runtime.NumGoroutine, and takes a dump only when the
// count changed.
func Write(path string, wait time.Duration) error {
	dump := Take()
	for deadline, n := time.Now().Add(wait), runtime.NumGoroutine(); ; {
		if left, err := Leftover(dump); err != nil || len(left) == 0 {
			break
		}
		if waiting != nil {
			waiting()
		}
		for runtime.NumGoroutine() == n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling the count: nothing to wait on
		}
		if time.Now().After(deadline) {
			dump = Take()
			break
		}
		n = runtime.NumGoroutine()
		dump = Take()
	}
	if err := os.WriteFile(path, dump, 0o644); err != nil {
		return fmt.Errorf("gordump: %w", err)
	}
	return nil
}
