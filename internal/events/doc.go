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
// are written when their epoch ends (with their own times). A file being
// written, or cut short (a full disk), may end in a partial line with no
// newline: [Reader] reports it as [ErrTruncated] after the records
// before it.
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
// rendezvous: every host with ranks registered and the first epoch table
// went out (it does not wait for spares)
//
//	"registered" int      hosts registered when the table went out
//	                      (spares that had registered by then included;
//	                      a spare registering later is not counted)
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
//	                          started
//	"repl_bytes"     [int]    per host, bytes its ranks sent to replica
//	                          holders, summed
//	"stages"         [int]    per host, steps its ranks staged for commit,
//	                          summed
//
// wait, repl_bytes and stages are sums of the ranks' counters since each
// rank started: they grow while the ranks run, and drop when ranks
// restart (a new generation starts them from 0) or move to another host
// (a splice: the lost host's figures go to 0, the new host's start from
// its ranks' new counters). Take differences between samples of one
// epoch and generation, and count a drop as a restart from 0.
//
// A sample of H hosts is about 5·H numbers, some 50 to 60 bytes per host
// in a long job (steps and byte counts grow digits; ~60 KB at 1,000
// hosts) whatever the number of ranks: O(ranks) to compute, O(hosts) to
// write, and at most about 6 KB of samples a second.
//
// failure: a failure the recovery state machine decided on, one record
// per incident (the ranks a lost host takes with it, the peers of a
// crashed rank, a GPU-faulted host's agent exiting are that failure, not
// more records). What it decided follows as fence, splice, restart or
// abort, and the recovery stages.
//
//	"host"     string  the host
//	"rank"     int     the rank, or -1 for the host as a whole
//	"what"     string  how it was seen: "rank-exit" (a rank ended badly
//	                   on its own), "hang" (a rank made no progress for
//	                   --hang-timeout), "agent-failed" (the host's agent
//	                   exited or failed), "host-lost" (no heartbeat, or a
//	                   suspicion not cleared in time) or "gpu" (a GPU
//	                   fault that takes the host)
//	"class"    string  the machine's classification: "host-loss",
//	                   "rank-exit", "hang" or "gpu-permanent" (gorun
//	                   status's failure class, and gorun_failures_total's
//	                   class label, with decision its decision label)
//	"decision" string  what it decided: "splice" (the host's ranks move
//	                   to a replacement), "restart" (every rank restarts
//	                   in place), "rollback" (to the durable tier),
//	                   "wait" (for a suspected host to answer before
//	                   choosing the replacement; a splice or abort comes
//	                   later), "abort" (the job stops) or "none" (nothing
//	                   to recover: a spare or a host without ranks, the
//	                   job stopping or done, a GPU fault nothing can
//	                   replace the host for, or whose replacement would
//	                   lose its ranks' state; such a host is decided on
//	                   again later, and its replacement, when it comes,
//	                   is a second record for the fault: class
//	                   "gpu-permanent", decision "splice" or "rollback",
//	                   detected when it was decided, the fault's time in
//	                   msg)
//	"epoch"    int     the recovery epoch the decision started or joined:
//	                   its timeline record has the same epoch (absent
//	                   for none: abort, none, wait)
//	"detected" number  when the failure was first seen, in seconds since
//	                   the start (the record's "t" is when it was decided
//	                   on, later by up to the suspect timeout for a
//	                   suspected host): gorun status's DETECTED; the
//	                   timeline's "detected" for the epoch it started
//	"exit"     int     a rank's exit status (rank-exit; absent when a
//	                   signal ended it)
//	"signal"   string  the signal that ended the rank ("SIGKILL"; absent
//	                   when it exited)
//	"msg"      string  why, in the machine's words ("no heartbeat for
//	                   3s", "rank 1 on host a (pid 12) exited with code
//	                   3"); always set
//
// fence: "host", a lost host cut off from the job.
//
// splice: a lost host's ranks move to another host
//
//	"epoch"  int     the recovery epoch
//	"lost"   string  the lost host
//	"with"   string  the host taking its ranks
//	"ranks"  [int]   the moved ranks
//	"spare"  bool    true: with is a spare, else a host with free slots
//
// restart: every rank restarts in generation gen
//
//	"epoch", "gen"  int  the recovery epoch and the new generation
//	"g"             int  the step they resume from (-1: the start)
//
// publish: the epoch's table went out
//
//	"epoch", "gen"  int  the epoch and generation
//	"g"             int  the step the ranks resume from (-1: the start)
//	"restore"       int  how many ranks restore from other hosts (a
//	                     count, not a list)
//
// under-protected: some ranks' state has fewer copies than configured
// until re-sent
//
//	"epoch"   int    the recovery epoch that left them so (its
//	                 splice's or restart's epoch)
//	"owners"  [int]  the ranks whose copies are missing
//
// protected (no fields): every copy is in place again.
//
// detected, classified, replaced, published, restored, resumed: "epoch"
// (int), "cause" (string: the failure decision's reason, in words): the
// recovery epoch reached the stage at "t". They are written when the
// epoch ends (resumed, superseded, or the job's end), just before its
// timeline, in stage order, each at its own time (so t goes back); a
// stage not reached is left out.
//
// timeline: a recovery epoch's record, written when it ends, at that
// time (after the failure that superseded it)
//
//	"epoch"       int     the epoch (failure records' "epoch")
//	"cause"       string  the decision's reason, in words
//	"superseded"  bool    a later failure ended it
//	"unfinished"  bool    the job ended before the epoch resumed (absent:
//	                      false)
//	"detected", "classified", "replaced", "published", "restored",
//	"resumed"     number  seconds since the start, or null for a stage
//	                      not reached (replaced is null for a restart in
//	                      place)
//
// abort: the job stops: "code" (int, gorun's exit code), "msg" (string,
// why).
//
// exit (always the last line of a job that ended)
//
//	"code"     int     gorun's exit code
//	"reason"   string  why the job stopped: the abort's message, or ""
//	                   when no failure stopped it (every rank ended by
//	                   itself, or a signal such as SIGINT stopped it: its
//	                   code, 128+n, says which)
//	"duration" number  seconds from the start to the end
//
// # Versions
//
// A launch record's "schema" is the version of the whole file. [Reader]
// refuses a file whose schema is newer than [SchemaVersion] or missing
// (a file that does not start with a launch record has none). Schema 1
// is the form of the first release that writes events files; what
// changed while it was being written (the failure and under-protected
// records' "epoch", say) counts as no version. From then on the rule
// above holds: a change of a field's meaning or type is schema 2. gorun
// status's snapshot follows the same rule (jobstatus.Version).
package events
