// Package depcheck holds no code: its test keeps the import rules of
// DESIGN.md §2 (lower packages never import higher ones; only the embedded
// control-plane server imports nats-server).
package depcheck
