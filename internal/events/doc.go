// Package events is the schema of gorun's events file (gorun --events
// FILE): the record of a job, one JSON object per line, written by the
// launcher as things happen and read back by `gorun report` (and by
// anyone's scripts). The launcher writes through [Writer]; [Reader]
// decodes a file into typed records.
//
// # Lines
//
// Every line is one JSON object with
//
//	"t"      number  seconds since the job started (microsecond
//	                 precision): when it happened, or for a recovery
//	                 stage when the stage was reached
//	"event"  string  the record's kind, one of those below
//
// and the kind's fields beside them. Lines are in the order they were
// written; t does not go backwards except for the recovery stages, which
// are written when their epoch ends (with their own times).
//
// A reader must ignore fields it does not know and may skip kinds it
// does not know: newer writers add both. [Reader] does: an unknown kind
// reads as an [Unknown] record. A field's meaning or type never changes
// within a schema version; a change that would is a new version.
//
// # Kinds
//
// launch (always the first line)
//
//	"schema"    int       the schema version ([SchemaVersion])
//	"job"       string    the job id (GORUN_JOB_ID)
//	"np"        int       the number of ranks
//	"hosts"     array     the job's hosts in order, each
//	                      {"name", "role": "running" or "spare",
//	                      "ranks": [its ranks at the start]}; the
//	                      per-host arrays of sample index this list
//	"spares"    int       the spare hosts
//	"redundancy" string   "replicas:K" or "ec:K+M"
//	"protect"   string    the protect mode: "full" or "diff"
//	"recovery"  string    the recovery mode: "restart" or "in-place"
//	"program"   [string]  the program and its arguments (the ranks'
//	                      environment, where secrets live, is never
//	                      written)
//
// rendezvous: every host registered and the first epoch table went out
//
//	"registered" int      hosts registered (spares included)
//	"took"       number   seconds from the start to the table
//
// sample: the state protection's figures, every sample period while
// ranks run and something changed (the period is 250 ms, and 10 ms per
// host beyond 25 hosts: 1 s at 100, 10 s at 1,000). Per-host arrays are indexed like
// launch's hosts; a host without ranks has -1 steps and zero figures.
//
//	"epoch", "gen"   int      the epoch and restart generation the
//	                          figures are of
//	"g"              int      G, the step every rank can resume from (-1:
//	                          none yet)
//	"d"              int      the durable tier's committed step (absent:
//	                          none)
//	"rate"           number   steps per second per rank since the
//	                          sample before (0 in the first)
//	"min", "max"     [int]    per host, the least and greatest step
//	                          committed by its ranks (-1: none)
//	"wait"           [number] per host, seconds its ranks waited at the
//	                          overwrite rule, summed over them, since they
//	                          started (a counter: take differences)
//	"repl_bytes"     [int]    per host, bytes its ranks sent to replica
//	                          holders, summed (a counter)
//	"stages"         [int]    per host, steps its ranks staged for commit,
//	                          summed (a counter)
//
// A sample of H hosts is about 5·H numbers, some 40 bytes per host (40 KB
// at 1,000 hosts) whatever the number of ranks: O(ranks) to compute,
// O(hosts) to write, and at most about 4 KB of samples a second.
//
// failure: something failed, as the launcher saw it (what it decided
// follows as fence, splice, restart or abort, and the recovery stages)
//
//	"host"     string  the host
//	"rank"     int     the rank, or -1 for the host as a whole
//	"what"     string  "rank-exit", "agent-failed", "host-lost" or "gpu"
//	"exit"     int     a rank's exit status (rank-exit; absent when a
//	                   signal ended it)
//	"signal"   string  the signal that ended the rank ("SIGKILL"; absent
//	                   when it exited)
//	"msg"      string  what the agent or rank said, if anything
//
// fence: "host", a lost host cut off from the job.
//
// splice: "epoch", "lost", "with" (host names), "ranks" (the moved
// ranks), "spare" (true: with is a spare, else a host with free slots).
//
// restart: "epoch", "gen", "g": every rank restarts in generation gen,
// resuming from step g (-1: the start).
//
// publish: "epoch", "gen", "g", "restore" (ranks restoring from other
// hosts): the epoch's table went out.
//
// under-protected: "epoch", "owners": ranks whose replicas are fewer than
// configured until re-sent. protected: every replica is in place again.
//
// detected, classified, replaced, published, restored, resumed: "epoch",
// "cause" (the failure decisions' reason, in words): the recovery epoch
// reached the stage at "t". They are written when the epoch ends, just
// before its timeline, in stage order; a stage not reached is left out.
//
// timeline: "epoch", "cause", "superseded" (a later failure ended it),
// and "detected", "classified", "replaced", "published", "restored",
// "resumed": seconds since the start, or null for a stage not reached
// (replaced is null for a restart in place).
//
// abort: "code", "msg": the job stops.
//
// exit (always the last line of a job that ended)
//
//	"code"     int     gorun's exit code
//	"reason"   string  why the job stopped ("" when every rank ended by
//	                   itself)
//	"duration" number  seconds from the start to the end
package events
