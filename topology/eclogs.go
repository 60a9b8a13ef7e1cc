package topology

import "slices"

// ECLogHolders places the differential logs of a job run with
// --protect-mode diff under erasure coding: for every rank, the ranks
// that keep its differentials since the last coded base besides its
// clear copy's holder (the "log-only" holders), so that every rank's log
// is on M hosts other than its own.
//
// Under diff mode only base steps are erasure coded (parity cannot absorb
// a differential: Adam is not linear in the bytes), so the records after
// the newest coded base must themselves survive any M lost hosts of the
// group. A rank's clear-copy holder (on its data host, when the rank runs
// elsewhere) keeps one copy in its diff store; the log-only holders keep
// the others: M-1 of them when the rank has a clear-copy holder, M when
// it runs on its data host. They are chosen among the group's hosts other
// than the rank's own and its data host, a host's lowest rank holding for
// the host, spreading the logs so that every host keeps about as many as
// the others (the clear copies counted).
//
// rankHost is every rank's host, hostRanks every host's ranks (a host
// with none is never chosen: a parity host left vacant by a failure).
// With too few hosts, a rank gets fewer holders than it needs (its group
// then survives fewer losses, as SurvivesEC says of a vacant place). The
// result has a row per rank, nil for a rank in no group.
func ECLogHolders(groups []ECGroup, rankHost []int, hostRanks [][]int) [][]int {
	out := make([][]int, len(rankHost))
	ranked := func(h int) bool { return h >= 0 && h < len(hostRanks) && len(hostRanks[h]) > 0 }
	for _, g := range groups {
		m := len(g.Parity)
		load := make(map[int]int, len(g.Hosts))
		type need struct{ rank, data, n int }
		var needs []need
		for x, dg := range g.DataGroups {
			if x >= len(g.Data) {
				continue
			}
			dh := g.Data[x]
			for _, r := range dg {
				if r < 0 || r >= len(rankHost) {
					continue
				}
				n := m
				if rankHost[r] != dh && ranked(dh) {
					n-- // the clear copy's holder keeps one log
					load[dh]++
				}
				needs = append(needs, need{rank: r, data: dh, n: n})
			}
		}
		// The ranks that need the most holders choose first.
		slices.SortFunc(needs, func(a, b need) int {
			if a.n != b.n {
				return b.n - a.n
			}
			return a.rank - b.rank
		})
		for i, nd := range needs {
			var cand []int
			for _, h := range g.Hosts {
				if h != rankHost[nd.rank] && h != nd.data && ranked(h) {
					cand = append(cand, h)
				}
			}
			// Start at a rotating place so that ties spread; then the
			// least loaded hosts first.
			if len(cand) > 0 {
				cand = append(cand[i%len(cand):], cand[:i%len(cand)]...)
			}
			slices.SortStableFunc(cand, func(a, b int) int { return load[a] - load[b] })
			cand = cand[:min(nd.n, len(cand))]
			row := make([]int, 0, len(cand))
			for _, h := range cand {
				load[h]++
				row = append(row, slices.Min(hostRanks[h]))
			}
			if len(row) > 0 {
				out[nd.rank] = row
			}
		}
	}
	return out
}
