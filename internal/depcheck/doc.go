// Package depcheck holds no code: its tests keep the import rules of
// DESIGN.md §2 (lower packages never import higher ones; only the embedded
// control-plane server imports nats-server; what a Go rank links reaches
// no NATS), give every package of the module a rule, and keep README.md's
// package table to the packages of the tree.
package depcheck
