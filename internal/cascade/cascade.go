// Package cascade is gorun's retrieval cascade (issue 17; TierCheck
// §3.3, ../shared/papers/002): when ranks must be restored and the step
// they resume from is not known to be held everywhere, it decides, from
// what each rank can be restored from, the step T every rank resumes from
// and where each rank's state at T comes from; and it does the disk
// part, rebuilding a rank's state at T from the durable tier.
//
// # The protocol
//
// Each rank's state can come from three tiers, cheapest first:
//
//  1. Local: the rank's own slots on its host (ckpt's two committed
//     steps);
//  2. Holder: a replica holder on another host (full mode: the steps it
//     holds; diff mode: any step from its base to its newest
//     differential), or the rank's erasure-coded stripe;
//  3. Disk: the durable tier (package durable): the job's committed base
//     at step v (the commit record's) plus the rank's differentials after
//     v on disk, contiguous (diff mode), from which every step from v to
//     the last of them can be rebuilt.
//
// The agents say, per rank, which steps each tier can give ([Avail]: a
// list of spans per tier). [Decide] takes the global minimum: T is the
// newest step that every rank can reach from some tier (the intersection,
// over ranks, of what each rank's tiers can give, at its newest), and each
// rank restores from the cheapest tier that has T. With memory tiers that
// hold no more than the overwrite rule keeps (G and the step after it) and
// a disk that holds v and differentials up to some step, this is TierCheck's
// anchor consensus followed by the global minimum of the differentials'
// reach: in gorun --resume after the whole job died, T is the minimum over
// ranks of v plus each rank's contiguous differentials. Every rank that
// restores from disk replays T - v differentials onto the same base v.
//
// # Trust
//
// An availability is a claim, made by the agent that looked (an agent
// reads its own slots and its rank's files; package durable verifies
// every byte it reads). Decide trusts the claims to choose T, and checks
// only their shape (steps in range, spans ordered). Nothing is served on a
// claim's word: each tier verifies what it gives against the CRC32Cs the
// owner committed (ckpt's slot headers, a holder's tables, the CRC32Cs a
// differential record carries, durable's chunk CRCs), so a claim that
// turns out false fails that rank's restore, with an error, and never
// gives it other bytes. The disk part ([Reach], [Load]) trusts nothing in
// the directory: it decodes and checks every record (difflog.Decode), the
// seal the owner put on it, that the steps and Adam step counts follow one
// another and that every record is of the rank's layout, and, with a
// lossless log, that the state it rebuilt has exactly the CRC32Cs the
// owner committed at T.
//
// # Side effects
//
// Decide is a pure function: no clock, no I/O. Reach and Load read the
// durable directory (package durable) and nothing else; they write only
// into the caller's buffers.
package cascade

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Tier is where a rank's state comes from, cheapest first.
type Tier int

const (
	None   Tier = iota // no tier (a rank Decide found nowhere)
	Local              // Tier 1: the rank's own slots on its host
	Holder             // Tier 2: a replica holder (or the erasure-coded stripe)
	Disk               // Tier 3: the durable tier, base plus replayed differentials
)

func (t Tier) String() string {
	switch t {
	case Local:
		return "local"
	case Holder:
		return "holder"
	case Disk:
		return "disk"
	}
	return "none"
}

// MaxStep bounds the steps of an availability (gorun's steps are 0 to
// 2^53-1; -1 means none).
const MaxStep = 1<<53 - 1

// Span is every step from From to To, From ≤ To.
type Span struct{ From, To int64 }

// One returns the span of step s alone.
func One(s int64) Span { return Span{s, s} }

// Avail is what one rank can be restored from: per tier, the spans of
// steps the tier can give. In Disk, at most one span, whose From is the
// committed base step (every rank's the same).
type Avail struct {
	Local, Holder, Disk []Span
}

func (a *Avail) tier(t Tier) []Span {
	switch t {
	case Local:
		return a.Local
	case Holder:
		return a.Holder
	case Disk:
		return a.Disk
	}
	return nil
}

// Plan is Decide's answer.
type Plan struct {
	// T is the step every rank resumes from.
	T int64
	// Base is the committed base step the ranks restored from disk
	// replay from (the From of their Disk span), or -1 if none is.
	Base int64
	// Source is each rank's cheapest tier holding T.
	Source []Tier
}

// Replays returns how many differentials a rank restored from disk
// replays (T - Base), or 0.
func (p *Plan) Replays() int64 {
	if p.Base < 0 {
		return 0
	}
	return p.T - p.Base
}

// ErrNoCommonStep is wrapped by Decide's error when no step is reachable
// for every rank (TierCheck's "global miss").
var ErrNoCommonStep = errors.New("cascade: no step every rank can be restored to")

// ErrBadAvail is wrapped by Decide's error about a malformed availability.
var ErrBadAvail = errors.New("cascade: malformed availability")

// Decide chooses T, the newest step every rank can be restored to, and
// each rank's source (see the package comment). avail has one entry per
// rank, in rank order (at least one).
func Decide(avail []Avail) (Plan, error) {
	if len(avail) == 0 {
		return Plan{}, fmt.Errorf("%w: no ranks", ErrBadAvail)
	}
	var common []Span // the steps every rank seen so far reaches, ascending, disjoint
	base := int64(-2)
	for r := range avail {
		a := &avail[r]
		var all []Span
		for _, t := range []Tier{Local, Holder, Disk} {
			for _, s := range a.tier(t) {
				if s.From < 0 || s.To < s.From || s.To > MaxStep {
					return Plan{}, fmt.Errorf("%w: rank %d: %s span [%d, %d]", ErrBadAvail, r, t, s.From, s.To)
				}
				all = append(all, s)
			}
		}
		if len(a.Disk) > 1 {
			return Plan{}, fmt.Errorf("%w: rank %d: %d disk spans, at most one", ErrBadAvail, r, len(a.Disk))
		}
		if len(a.Disk) == 1 {
			if base != -2 && a.Disk[0].From != base {
				return Plan{}, fmt.Errorf("%w: rank %d: a disk base at step %d, another rank's is at %d (one commit record per job)", ErrBadAvail, r, a.Disk[0].From, base)
			}
			base = a.Disk[0].From
		}
		u := union(all)
		if r == 0 {
			common = u
		} else {
			common = intersect(common, u)
		}
		if len(common) == 0 {
			what := "nothing"
			if len(u) > 0 {
				what = fmt.Sprintf("only steps %s", spans(u))
			}
			if r == 0 {
				return Plan{}, fmt.Errorf("%w: rank 0 can be restored from no tier", ErrNoCommonStep)
			}
			return Plan{}, fmt.Errorf("%w: rank %d can be restored to %s, none of which ranks 0 to %d all reach", ErrNoCommonStep, r, what, r-1)
		}
	}
	p := Plan{T: common[len(common)-1].To, Base: -1, Source: make([]Tier, len(avail))}
	for r := range avail {
		for _, t := range []Tier{Local, Holder, Disk} {
			if holds(avail[r].tier(t), p.T) {
				p.Source[r] = t
				break
			}
		}
		if p.Source[r] == Disk {
			p.Base = avail[r].Disk[0].From
		}
	}
	return p, nil
}

// holds reports whether a span of ss holds step s.
func holds(ss []Span, s int64) bool {
	return slices.ContainsFunc(ss, func(x Span) bool { return x.From <= s && s <= x.To })
}

// union returns the steps of ss as ascending, disjoint, non-adjacent
// spans.
func union(ss []Span) []Span {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b Span) int { return cmp.Compare(a.From, b.From) })
	var out []Span
	for _, s := range ss {
		if n := len(out); n > 0 && s.From <= out[n-1].To+1 {
			out[n-1].To = max(out[n-1].To, s.To)
			continue
		}
		out = append(out, s)
	}
	return out
}

// intersect returns the steps in both a and b (each ascending and
// disjoint), ascending and disjoint.
func intersect(a, b []Span) []Span {
	var out []Span
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].From, b[j].From), min(a[i].To, b[j].To)
		if lo <= hi {
			out = append(out, Span{lo, hi})
		}
		if a[i].To < b[j].To {
			i++
		} else {
			j++
		}
	}
	return out
}

func spans(ss []Span) string {
	s := ""
	for i, x := range ss {
		if i > 0 {
			s += ", "
		}
		if x.From == x.To {
			s += fmt.Sprint(x.From)
		} else {
			s += fmt.Sprintf("%d to %d", x.From, x.To)
		}
	}
	return s
}
