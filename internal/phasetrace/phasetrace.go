// Package phasetrace records when a launch passes its phases, to measure
// gorun's critical path. It is a debugging aid, not a flag: with
// GORUN_DEBUG_PHASES=FILE in its environment, `gorun run` calls Start at
// the top of its main and Write as it returns, and FILE then holds one
// line per phase: its name, the first and the last time it was marked
// (wall-clock Unix nanoseconds, comparable with another process's on the
// same host) and how many times. internal/benchlaunch's -phases reads it.
// Unset, Mark costs one atomic load.
package phasetrace

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Env names the file the phases are written to.
const Env = "GORUN_DEBUG_PHASES"

var (
	on atomic.Bool
	mu sync.Mutex // guards phases and order
	// phases are the marks by name; order is the names in their first
	// mark's order.
	phases = map[string]*Phase{}
	order  []string
)

// Phase is one phase's marks.
type Phase struct {
	Name        string
	First, Last int64 // Unix nanoseconds
	N           int
}

// Start turns recording on and marks "main".
func Start() {
	on.Store(true)
	Mark("main")
}

// Enabled reports whether Start was called.
func Enabled() bool { return on.Load() }

// Mark records that the launch passed phase name now.
func Mark(name string) {
	if !on.Load() {
		return
	}
	now := time.Now().UnixNano()
	mu.Lock()
	defer mu.Unlock()
	p := phases[name]
	if p == nil {
		p = &Phase{Name: name, First: now}
		phases[name] = p
		order = append(order, name)
	}
	p.Last = now
	p.N++
}

// Write writes the phases marked to path, "exit" last. It does not follow
// a symbolic link at path (a file in a shared /tmp another user could
// have put there).
func Write(path string) error {
	Mark("exit")
	mu.Lock()
	defer mu.Unlock()
	var b strings.Builder
	for _, n := range order {
		p := phases[n]
		fmt.Fprintf(&b, "%s %d %d %d\n", p.Name, p.First, p.Last, p.N)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("phasetrace: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return fmt.Errorf("phasetrace: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("phasetrace: %w", err)
	}
	return nil
}

// Read reads a file Write wrote.
func Read(path string) ([]Phase, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("phasetrace: %w", err)
	}
	defer f.Close()
	var ps []Phase
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 {
			return nil, fmt.Errorf("phasetrace: bad line %q", sc.Text())
		}
		p := Phase{Name: fs[0]}
		var errs [3]error
		p.First, errs[0] = strconv.ParseInt(fs[1], 10, 64)
		p.Last, errs[1] = strconv.ParseInt(fs[2], 10, 64)
		p.N, errs[2] = strconv.Atoi(fs[3])
		for _, e := range errs {
			if e != nil {
				return nil, fmt.Errorf("phasetrace: bad line %q: %w", sc.Text(), e)
			}
		}
		ps = append(ps, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("phasetrace: %w", err)
	}
	return ps, nil
}
