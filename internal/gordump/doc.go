// Package gordump takes and reads goroutine dumps (the text of
// runtime.Stack with all goroutines, that of runtime/pprof's goroutine
// profile at debug=2) to find the goroutines gorun left running: those
// with a frame, or a creator, in gorun's own code (the module
// github.com/gorun/gorun, or package main of a gorun binary), other than
// the goroutine that took the dump. The runtime's and the standard
// library's own goroutines (os/signal's loop, which never ends) are not
// gorun's and do not count.
//
// cmd/gorun writes such a dump at its exit when GORUN_DEBUG_GOROUTINES
// names a file (Write); the chaos suite (internal/chaos) reads it after
// every job, and the launcher's TestRunGoroutines judges its leftovers
// with the same rule (Leftover).
package gordump
