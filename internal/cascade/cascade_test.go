package cascade_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/cascade"
)

type span = cascade.Span

func one(s int64) span { return cascade.One(s) }

// TestDecide is the cascade's decision table: per-rank availability in,
// T, the base replayed from and each rank's source out.
func TestDecide(t *testing.T) {
	L, H, D := cascade.Local, cascade.Holder, cascade.Disk
	for _, tc := range []struct {
		name   string
		avail  []cascade.Avail
		t      int64
		base   int64
		source []cascade.Tier
		err    error
		msg    string
	}{
		{
			name:  "every rank local",
			avail: []cascade.Avail{{Local: []span{one(7), one(8)}}, {Local: []span{one(8), one(7)}}},
			t:     8, base: -1, source: []cascade.Tier{L, L},
		},
		{
			name: "the overwrite rule: one rank staged past G, the other not yet",
			// rank 1 committed 9 (its slots hold 8 and 9), rank 0 only 8 (7 and 8)
			avail: []cascade.Avail{{Local: []span{one(7), one(8)}}, {Local: []span{one(8), one(9)}}},
			t:     8, base: -1, source: []cascade.Tier{L, L},
		},
		{
			name: "a lost host: its rank from a holder, the others local",
			avail: []cascade.Avail{
				{Local: []span{one(7), one(8)}, Holder: []span{one(8)}},
				{Holder: []span{one(7), one(8)}},
			},
			t: 8, base: -1, source: []cascade.Tier{L, H},
		},
		{
			name: "the newest step, even if only the disk reaches it",
			avail: []cascade.Avail{
				{Local: []span{one(5)}, Holder: []span{{3, 9}}, Disk: []span{{0, 12}}},
			},
			t: 12, base: 0, source: []cascade.Tier{D},
		},
		{
			name: "local preferred to holder and disk for the same step",
			avail: []cascade.Avail{
				{Local: []span{one(9)}, Holder: []span{{3, 9}}, Disk: []span{{0, 9}}},
				{Holder: []span{{3, 9}}, Disk: []span{{0, 9}}},
			},
			t: 9, base: -1, source: []cascade.Tier{L, H},
		},
		{
			name: "whole job died (--resume): T is the minimum reach over ranks",
			avail: []cascade.Avail{
				{Disk: []span{{10, 26}}},
				{Disk: []span{{10, 23}}},
				{Disk: []span{{10, 31}}},
			},
			t: 23, base: 10, source: []cascade.Tier{D, D, D},
		},
		{
			name:  "--resume in full mode: the committed base itself",
			avail: []cascade.Avail{{Disk: []span{one(10)}}, {Disk: []span{one(10)}}},
			t:     10, base: 10, source: []cascade.Tier{D, D},
		},
		{
			name: "host and all its holders lost: that rank from disk, the others replay-free",
			avail: []cascade.Avail{
				{Local: []span{one(19), one(20)}, Disk: []span{{10, 20}}},
				{Disk: []span{{10, 22}}},
			},
			t: 20, base: 10, source: []cascade.Tier{L, D},
		},
		{
			name: "the disk reaches less than memory: every rank rolls back to it",
			avail: []cascade.Avail{
				{Local: []span{one(19), one(20)}, Disk: []span{{10, 30}}},
				{Disk: []span{{10, 17}}},
			},
			t: 17, base: 10, source: []cascade.Tier{D, D},
		},
		{
			name: "diff-mode holder spans and a disk span",
			avail: []cascade.Avail{
				{Holder: []span{{12, 18}}},
				{Holder: []span{{4, 15}}, Disk: []span{{10, 16}}},
				{Local: []span{one(14), one(15)}},
			},
			t: 15, base: -1, source: []cascade.Tier{H, H, L},
		},
		{
			name: "TierCheck's global miss: no common step",
			avail: []cascade.Avail{
				{Local: []span{one(20)}},
				{Disk: []span{{10, 17}}},
			},
			err: cascade.ErrNoCommonStep, msg: "rank 1 can be restored to only steps 10 to 17",
		},
		{
			name:  "a rank with nothing",
			avail: []cascade.Avail{{Disk: []span{{3, 5}}}, {}},
			err:   cascade.ErrNoCommonStep, msg: "rank 1 can be restored to nothing",
		},
		{
			name:  "rank 0 with nothing",
			avail: []cascade.Avail{{}, {Local: []span{one(1)}}},
			err:   cascade.ErrNoCommonStep, msg: "rank 0",
		},
		{
			name: "adjacent spans of two tiers join",
			avail: []cascade.Avail{
				{Local: []span{{5, 8}}, Disk: []span{{9, 12}}},
				{Disk: []span{{9, 12}}, Holder: []span{{6, 8}}},
				{Holder: []span{{7, 10}}},
			},
			t: 10, base: 9, source: []cascade.Tier{D, D, H},
		},
		{name: "no ranks", avail: nil, err: cascade.ErrBadAvail},
		{name: "reversed span", avail: []cascade.Avail{{Local: []span{{5, 4}}}}, err: cascade.ErrBadAvail},
		{name: "negative step", avail: []cascade.Avail{{Holder: []span{{-1, 4}}}}, err: cascade.ErrBadAvail},
		{name: "step past 2^53", avail: []cascade.Avail{{Holder: []span{{0, 1 << 53}}}}, err: cascade.ErrBadAvail},
		{name: "two disk spans", avail: []cascade.Avail{{Disk: []span{{0, 4}, {6, 8}}}}, err: cascade.ErrBadAvail},
		{
			name:  "disk bases differ",
			avail: []cascade.Avail{{Disk: []span{{10, 14}}}, {Disk: []span{{11, 14}}}},
			err:   cascade.ErrBadAvail, msg: "one commit record per job",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := cascade.Decide(tc.avail)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("Decide: %v, want %v", err, tc.err)
				}
				if !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("Decide: %v, want it to say %q", err, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if p.T != tc.t || p.Base != tc.base || !slices.Equal(p.Source, tc.source) {
				t.Errorf("plan T=%d base=%d sources %v, want T=%d base=%d sources %v", p.T, p.Base, p.Source, tc.t, tc.base, tc.source)
			}
			if tc.base >= 0 && p.Replays() != tc.t-tc.base {
				t.Errorf("Replays %d, want %d", p.Replays(), tc.t-tc.base)
			}
		})
	}
}

// TestDecideIsTheNewestCommonStep checks Decide against brute force on
// every small availability of two ranks: T is the newest step both reach,
// each source the cheapest tier holding it.
func TestDecideIsTheNewestCommonStep(t *testing.T) {
	const steps = 6
	// Spans of [0, steps), each tier of each rank: none, or one span.
	var choices []*span
	choices = append(choices, nil)
	for a := int64(0); a < steps; a++ {
		for b := a; b < steps; b++ {
			choices = append(choices, &span{a, b})
		}
	}
	mk := func(s *span) []span {
		if s == nil {
			return nil
		}
		return []span{*s}
	}
	in := func(ss []span, x int64) bool {
		for _, s := range ss {
			if s.From <= x && x <= s.To {
				return true
			}
		}
		return false
	}
	n := 0
	for _, l0 := range choices {
		for _, h1 := range choices {
			for _, d := range choices {
				if d != nil && d.From != 0 {
					continue // one base per job: disk spans from 0 here
				}
				av := []cascade.Avail{{Local: mk(l0), Disk: mk(d)}, {Holder: mk(h1), Disk: mk(d)}}
				want := int64(-1)
				for x := int64(steps - 1); x >= 0; x-- {
					if (in(av[0].Local, x) || in(av[0].Disk, x)) && (in(av[1].Holder, x) || in(av[1].Disk, x)) {
						want = x
						break
					}
				}
				p, err := cascade.Decide(av)
				if want < 0 {
					if !errors.Is(err, cascade.ErrNoCommonStep) {
						t.Fatalf("%+v: %v, %+v, want no common step", av, err, p)
					}
					continue
				}
				n++
				if err != nil || p.T != want {
					t.Fatalf("%+v: T=%d (%v), want %d", av, p.T, err, want)
				}
				if s0 := map[bool]cascade.Tier{true: cascade.Local, false: cascade.Disk}[in(av[0].Local, want)]; p.Source[0] != s0 {
					t.Fatalf("%+v: rank 0 from %v, want %v", av, p.Source[0], s0)
				}
				if s1 := map[bool]cascade.Tier{true: cascade.Holder, false: cascade.Disk}[in(av[1].Holder, want)]; p.Source[1] != s1 {
					t.Fatalf("%+v: rank 1 from %v, want %v", av, p.Source[1], s1)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no case had a common step")
	}
}
