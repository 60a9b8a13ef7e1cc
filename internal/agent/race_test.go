//go:build race

package agent

// raceEnabled: the tests are built with -race.
const raceEnabled = true
