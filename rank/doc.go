// Package rank protects the training state of a job's ranks, every step,
// in memory (DESIGN.md §5; DEADPOOL §V-B, §VI-A; TierCheck Tier-1/2).
//
// It has two sides. The service side runs inside the gorun agent of each
// host: a [Host] holds one service per local rank, which keeps the rank's
// state in two ping-pong shared-memory slots (package ckpt), answers the
// rank's requests on its socket (PROTOCOL.md), replicates every committed
// step's replicated regions (all but params) to the rank's replica
// holders on other hosts over authenticated links, stores the replicas
// other hosts send, and applies the overwrite rule: a slot holding step t
// is overwritten only once step t+1 is recoverable for every rank (G, the
// globally recoverable step, which the launcher aggregates and publishes).
//
// The client side, [Client], is what a Go trainer uses: it maps the slot
// files, copies a step into the staging slot in the background while the
// trainer computes (as a GPU's copy engine would), and [Client.Wait] before
// the next optimizer step is the one synchronization point. A stdlib-only
// Python client speaking the same protocol is in python/gorun_rank.py.
package rank
