package agent

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// group is the one owner of every goroutine an agent starts: each is
// started by Go (or counted by a subgroup, the same group seen by a part
// of the agent that waits for its own goroutines first), under a name
// saying what it does. Run does not return before wait has seen them all
// end, or, for those blocked on something outside the agent's control (a
// hung GPU discovery, a rank stuck in the kernel), before wait's bound:
// then it logs which are left.
//
// The zero group is usable; a nil *group starts goroutines uncounted
// (tests that exercise a part of the agent alone).
type group struct {
	mu      sync.Mutex
	running map[string]int // name → goroutines of that name still running
	changed chan struct{}  // closed (and replaced) when one ends
}

// Go runs f on a new goroutine of the group.
func (g *group) Go(name string, f func()) {
	if g == nil {
		go f()
		return
	}
	g.add(name, 1)
	go func() {
		defer g.done(name)
		f()
	}()
}

func (g *group) add(name string, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running == nil {
		g.running = map[string]int{}
	}
	g.running[name] += n
}

func (g *group) done(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running[name]--; g.running[name] <= 0 {
		delete(g.running, name)
	}
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// wait waits, at most d, for every goroutine of the group to end, but
// those named in unstoppable (goroutines blocked where nothing the agent
// owns can end them, left to end with the process). It returns what is
// left ("name" or "name ×n", sorted): nothing if they all ended.
func (g *group) wait(d time.Duration, unstoppable ...string) []string {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		g.mu.Lock()
		var left []string
		for _, name := range slices.Sorted(maps.Keys(g.running)) {
			if n := g.running[name]; n > 1 {
				left = append(left, fmt.Sprintf("%s ×%d", name, n))
			} else {
				left = append(left, name)
			}
		}
		waiting := false
		for name := range g.running {
			waiting = waiting || !slices.Contains(unstoppable, name)
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		changed := g.changed
		g.mu.Unlock()
		if !waiting {
			return left
		}
		select {
		case <-changed:
		case <-t.C:
			return left
		}
	}
}

// subgroup is a part of the agent's group that its owner (the rank
// sockets, the GPU watch, the PMI servers, a resume, a roll-back) waits for
// on its own, before it closes what they use; its goroutines count in the
// group too. It has sync.WaitGroup's Add, Done, Go and Wait. Its group is
// set once, before its first goroutine; without one it is a plain
// WaitGroup.
type subgroup struct {
	g    *group
	name string
	wg   sync.WaitGroup
}

func newSubgroup(g *group, name string) subgroup { return subgroup{g: g, name: name} }

// Add adds n goroutines, which each call Done at their end.
func (s *subgroup) Add(n int) {
	s.wg.Add(n)
	if s.g != nil {
		s.g.add(s.name, n)
	}
}

// Done ends one goroutine.
func (s *subgroup) Done() {
	if s.g != nil {
		s.g.done(s.name)
	}
	s.wg.Done()
}

// Go runs f on a new goroutine of the subgroup.
func (s *subgroup) Go(f func()) {
	s.Add(1)
	go func() {
		defer s.Done()
		f()
	}()
}

// Wait waits for the subgroup's goroutines.
func (s *subgroup) Wait() { s.wg.Wait() }
