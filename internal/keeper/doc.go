// Package keeper is the service side of state protection (DESIGN.md §5;
// DEADPOOL §V-B, §VI-A; TierCheck Tier-1/2): it runs inside the gorun
// agent of each host, and protects the training state of the host's
// ranks, every step, in memory. Trainers use package protect, the client
// side, whose protocol messages (protect/PROTOCOL.md) it shares.
//
// A [Keeper] holds one service per local rank, which keeps the rank's
// state in two ping-pong shared-memory slots (package ckpt), answers the
// rank's requests on its socket (protect/PROTOCOL.md), replicates every
// committed step's replicated regions (all but params) to the rank's
// replica holders on other hosts over authenticated links, stores the
// replicas other hosts send, and applies the overwrite rule: a slot
// holding step t is overwritten only once step t+1 is recoverable for
// every rank (G, the globally recoverable step, which the launcher
// aggregates and publishes).
package keeper
