// Package protecthook holds the test hooks of package protect's client,
// which tests of other packages (internal/keeper's, which run the client
// against the service) set. It imports nothing: protect's dependencies
// stay minimal. Nothing but tests may set a hook.
package protecthook

// Staged, if set (by tests), runs in a Client's background staging of
// step between the copy into the slot and the Commit.
var Staged func(step int64)
