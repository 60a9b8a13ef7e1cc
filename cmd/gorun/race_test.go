//go:build race

package main

// raceEnabled makes the end-to-end tests build gorun with -race too.
const raceEnabled = true
