// Package wire is the one place that defines what crosses gorun's process
// boundaries: control-plane subjects, the environment variable names of the
// rank contract, and the messages agents and the launcher exchange.
//
// Every decoder here treats its input as untrusted: a malformed message gives
// an error naming what is wrong, never a panic, and the decoders are fuzzed.
package wire
