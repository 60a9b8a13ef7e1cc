package keeper

import (
	"context"
	"fmt"
	"testing"
)

// TestECDiffRollBack is a roll-back to the durable tier in diff mode
// under erasure coding (2+2, two ranks per host, a base every 4 steps)
// at the level of the rank services: the ranks ran to step 13 (H 8 or
// 12, the old schedule's bases 0, 4, 8, 12), then the job rolls back to
// T = 6, below H and not a base step of the old schedule: every host
// RollBack(1, T), every rank's state at T is reloaded (Reload, from the
// ranks' known bytes, as cascade.Load would from disk) and the ranks go
// on from T on another trajectory (another seed: any differential, base
// or share of the abandoned one would give other bytes). The published H
// starts again from -1 (the launcher's progress.rollback), and the new
// schedule's bases are T, T+4, ...: H is one of them. Then, at G 9 with H
// = T (decode at T, replay of the new logs (6, 9]) and later at a newer
// H, every set of at most M lost hosts restores every lost rank bitwise
// (everySubset: M+1 lost, bitwise or unrecoverable, never other bytes).
//
// With RollBack doing only Restart (H kept at the old schedule's 8 or
// 12), the hosts truncate the new logs through the old H and the new
// bases wait at no gate: the restores at H = T fail.
func TestECDiffRollBack(t *testing.T) {
	const k, m, every = 2, 2, 4
	for _, tc := range []struct {
		name   string
		t      int64
		before int64 // G before the roll-back
		// flip: host 0's ranks reload their states at t with a byte of
		// the optimizer region flipped, as a lossy codec's replay gives
		// other bytes than the ones coded at t in the old generation.
		flip bool
		// holdH: after G T+3, H is held at T while the ranks code the new
		// schedule's next base, T+4, below the old H (12): a holder that
		// kept an owner's old H (baseH, sent before the old schedule's
		// refreshes of 16 and later: 12 or more) would install the
		// refresh of T+4 at once and drop the base at T, which the
		// decodes at H = T read.
		holdH bool
	}{
		{name: "T6", t: 6, before: 13},
		{name: "T6, H held at T", t: 6, before: 18, holdH: true},
		{name: "T12 base, reloaded bytes differ", t: 12, before: 14, flip: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			T := tc.t
			j := newECDiffRecJob(t, k, m, every, m+1)
			j.run(0, tc.before)
			g0, h0 := j.published()
			if h0 < T || g0 < T+1 {
				t.Fatalf("G %d, H %d before the roll-back: want H at T = %d or past it", g0, h0, T)
			}
			for h, x := range j.c.hosts {
				if err := x.RollBack(1, T); err != nil {
					t.Fatalf("host %d: RollBack: %v", h, err)
				}
				if got := x.H(); got != noStep {
					t.Fatalf("host %d: H %d after the roll-back, want -1", h, got)
				}
			}
			// The launcher publishes G = T and H = -1 in the new generation.
			j.mu.Lock()
			j.g, j.hb = T, noStep
			j.mu.Unlock()
			reloaded := make([]map[string][]byte, len(j.hostOf))
			for r, h := range j.hostOf {
				at := map[string][]byte{}
				for name, b := range j.rs[r].want(T) {
					at[name] = append([]byte(nil), b...)
				}
				if tc.flip && h == 0 {
					at["optimizer"][0] ^= 1
				}
				fill := func(views [][]byte) (int, error) {
					for i, reg := range diffRegions {
						switch reg.Name {
						case "params":
							for b := range views[i] {
								views[i][b] = byte(T*5 + int64(b))
							}
						default:
							copy(views[i], at[reg.Name])
						}
					}
					return int(T) + 1, nil
				}
				if _, err := j.c.hosts[h].Reload(r, diffRegions, T, fill); err != nil {
					t.Fatalf("rank %d: Reload: %v", r, err)
				}
				reloaded[r] = at
			}
			for r, h := range j.hostOf {
				states := map[int64]map[string][]byte{T: reloaded[r]}
				dr, err := newDiffRank(t, j.c.hosts[h], r, 12, states) // another trajectory from T
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(dr.close)
				res, err := dr.restore(context.Background())
				if err != nil || res.Step != T || res.Tier != 1 {
					t.Fatalf("rank %d: restore %+v, %v; want step %d from its own slot", r, res, err, T)
				}
				j.rs[r] = dr
			}
			newBase := func(hb int64) bool { return hb >= T && (hb-T)%every == 0 }

			// G T+3: H is T (the next base, T+4, is not committed yet).
			j.run(T+1, T+3)
			g, hb := j.published()
			if hb != T || g != T+3 {
				t.Fatalf("after the roll-back: G %d, H %d; want G %d, H %d", g, hb, T+3, T)
			}
			for h, x := range j.c.hosts[:j.work] {
				if got := x.H(); got != T {
					t.Fatalf("host %d: H %d, want %d", h, got, T)
				}
			}
			j.everySubset(g, hb)
			if t.Failed() {
				return
			}
			if tc.holdH {
				if h0 <= T+every {
					t.Fatalf("H %d before the roll-back: want it past T+%d", h0, every)
				}
				j.mu.Lock()
				j.freezeH = true
				j.mu.Unlock()
				next := T + every
				j.runUntil(T+4, T+4*every, fmt.Sprintf("every Base >= %d and G > %d", next, next), func() bool {
					for r := range j.hostOf {
						if j.c.progress(r).Base < next {
							return false
						}
					}
					g, _ := j.published()
					return g > next
				})
				g2, hb2 := j.published()
				if hb2 != T || g2 <= next {
					t.Fatalf("with H held back: G %d, H %d; want G past %d, H %d", g2, hb2, next, T)
				}
				j.everySubset(g2, hb2)
				return
			}
			j.run(T+4, T+13)
			g, hb = j.published()
			if !newBase(hb) || hb <= T || hb > g {
				t.Fatalf("G %d, H %d: want H a base of the new schedule (%d + %d·n) after it", g, hb, T, every)
			}
			j.everySubset(g, hb)
		})
	}
}

// TestECDiffRollBackLateHolder: hosts restart on their own. A log-only
// holder whose host has not rolled back yet (its H still the old
// schedule's, past T+1) takes an owner's differential of the new
// generation, of step T+1 = 7, and then applies the roll-back's table
// (SetPlacement, as its agent does before it restarts): it keeps it, not
// truncating the owner's log through its old H, and keeps it through
// its own RollBack. Without the generation check in sweepLog the table's
// sweep empties the log (T, T+1] the owner counts as held.
func TestECDiffRollBackLateHolder(t *testing.T) {
	const k, m, every, T = 2, 2, 4, int64(6)
	j := newECDiffRecJob(t, k, m, every, 1)
	j.run(0, 13)
	if _, h0 := j.published(); h0 <= T+1 {
		t.Fatalf("H %d before the roll-back: want it past T+1 = %d", h0, T+1)
	}
	// An owner whose first log-only holder runs on another host.
	o, x := -1, -1
	for r, ls := range j.logs {
		if len(ls) > 0 && j.hostOf[ls[0]] != j.hostOf[r] {
			o, x = r, j.hostOf[ls[0]]
			break
		}
	}
	if o < 0 {
		t.Fatal("no rank with a log-only holder on another host")
	}
	for h, hx := range j.c.hosts {
		if h == x {
			continue
		}
		if err := hx.RollBack(1, T); err != nil {
			t.Fatalf("host %d: RollBack: %v", h, err)
		}
	}
	var others []*diffRank
	for r, h := range j.hostOf {
		if h == x {
			continue
		}
		at := j.rs[r].want(T)
		fill := func(views [][]byte) (int, error) {
			for i, reg := range diffRegions {
				if reg.Name == "params" {
					continue
				}
				copy(views[i], at[reg.Name])
			}
			return int(T) + 1, nil
		}
		if _, err := j.c.hosts[h].Reload(r, diffRegions, T, fill); err != nil {
			t.Fatalf("rank %d: Reload: %v", r, err)
		}
		dr, err := newDiffRank(t, j.c.hosts[h], r, 12, map[int64]map[string][]byte{T: at})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dr.close)
		if res, err := dr.restore(context.Background()); err != nil || res.Step != T {
			t.Fatalf("rank %d: restore %+v, %v", r, res, err)
		}
		others = append(others, dr)
	}
	// The ranks of the restarted hosts commit T+1 (the overwrite rule
	// lets them, G being T).
	for _, dr := range others {
		if err := dr.step(context.Background(), T+1); err != nil {
			t.Fatalf("rank %d: %v", dr.r, err)
		}
	}
	hx := j.c.hosts[x]
	j.c.waitFor(fmt.Sprintf("host %d's log of rank %d holding step %d", x, o, T+1), func() bool {
		return recordsAt(hx, o, T, T+1)
	})
	// Host x applies the roll-back's table before it restarts.
	var ranks []int
	for r, h := range j.hostOf {
		if h == x {
			ranks = append(ranks, r)
		}
	}
	// (Its own ranks restore from their own slots: a Source naming
	// them, which makes the table another placement here.)
	p := Placement{Ranks: ranks, HostOf: j.hostOf, Holders: j.holders, EC: j.groups, Epoch: 2, G: T, Logs: j.logs, H: noStep,
		Sources: map[int]Source{ranks[0]: {Opt: ranks[0], Params: ranks[0]}}}
	if err := hx.SetPlacement(p); err != nil {
		t.Fatal(err)
	}
	if !recordsAt(hx, o, T, T+1) {
		t.Fatalf("host %d (H %d, not rolled back yet) dropped rank %d's differential of step %d, of the new generation, at the roll-back's table", x, hx.H(), o, T+1)
	}
	if err := hx.RollBack(1, T); err != nil {
		t.Fatal(err)
	}
	if !recordsAt(hx, o, T, T+1) {
		t.Fatalf("host %d dropped rank %d's differential of step %d, of the new generation, at its RollBack", x, o, T+1)
	}
}
