//go:build race

package keeper

// raceEnabled: the tests run under the race detector, about ten times
// slower; the exhaustive ones trim what only repeats code paths covered.
const raceEnabled = true
