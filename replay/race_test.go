//go:build race

package replay

// raceEnabled: the race detector slows the big loops tenfold; tests shrink.
const raceEnabled = true
