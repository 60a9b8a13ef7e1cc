//go:build race

package chaos

// raceEnabled: TestChaos is skipped under -race. It builds its binaries
// without -race and spends its time in them, so a -race pass repeats
// the plain one at twice the cost (make test runs both).
const raceEnabled = true
