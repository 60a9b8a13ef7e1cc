// Package hotswap makes a job's failure decisions: which failure is which
// (DEADPOOL Table II), whether to restart the ranks in place, splice a
// spare host in for a lost one, or stop the job, and with which exit code.
//
// # Model
//
// A [Machine] is a pure, deterministic state machine, as etcd raft's
// RawNode is: events in, actions out. [Machine.Step] takes the current
// time and one [Event] (a rank exited, an agent was lost, a heartbeat, a
// signal, a tick, ...) and returns the [Action]s the caller must carry out,
// in order (stop ranks, restart them, splice a host, publish an epoch,
// restore state, report, abort). The machine does no I/O, starts no
// goroutine and never reads a clock: time arrives with every event, as the
// time since the job started. The failure window closes on the first event
// at or after its end (or, when a rank's MPI_Abort was told before its
// exit, once that exit came, at most three seconds later: [RankAborted]);
// the other deadlines (suspect timeout, heartbeat and
// hang timeouts) are checked on [Tick], and [Machine.NextDeadline] says
// when one is due. The same events at the same times always give the same
// actions. A Machine is not
// safe for concurrent use: one goroutine (the launcher's loop) owns it.
//
// # Recovery epochs
//
// Every membership or generation change is a recovery epoch: the machine
// numbers it (epochs only grow), publishes the epoch's rank → host table
// and replica holders, says where every rank restores its state from, and
// follows the epoch through the caller's [RecoveryReport]s (epoch
// published, state restored, first step after resume) to its end, when it
// emits the epoch's [Timeline]. One recovery epoch runs at a time: a
// failure decided while one is under way ends it (its timeline is emitted
// as superseded) and the next epoch, numbered after it, starts from the
// state it left (ranks whose state was not restored yet are restored from
// their replicas again).
//
// Before an epoch is published the machine checks DEADPOOL's invariants:
// I1 every rank on exactly one live host and no host over its slots; I2
// exactly one owner per shard (the per-host rank lists and the rank → host
// table agree); I3 every rank's optimizer shard recoverable from memory
// (its own live slot, or a valid copy at a live holder on another host);
// I4 the resume step G is no later than any rank's committed step (a
// published G counts as committed by every rank: the launcher computes it
// from their replicated steps; a roll-back lowers both together, so I4
// is a defensive check that the events as handled now cannot fail). A
// violation stops the job with a report, never a silently wrong epoch.
//
// # Failures
//
// A rank that crashed on a healthy host restarts every rank in place (new
// generation and epoch, resume from G) while restarts are left; the same
// rank failing again with no progress, or no restart left, stops the job
// with the rank's status. MPI_Abort stops the job with its code. Rank
// failures are collected for the failure window, so that a rank killed by
// a signal is blamed rather than the peers that exited because they lost
// it. A host is lost when its agent exits, its heartbeats stop, a
// suspicion (a dropped control connection, a failed replication to it, a
// rank's PeerLostError naming its ranks) is not cleared by a contact
// within the suspect timeout, or a GPU reports a replace-class fault
// (unless nothing can take its ranks, or moving them would lose their
// state: the restore plan, worked out on a copy of the state with the host
// lost, fails and there is no durable version to roll back to; the host
// still runs, so it then stays, takes no other host's ranks, and is
// decided on again on a durable commit, copies re-sent, a recovery's end
// or a spare's registration; one that never goes is reported when the
// last rank ends, the job's status staying the ranks'). A lost host's ranks move to a spare (preferring one outside the failure
// domains of their replica holders), else, with [OnNoSpareFreeSlots], to a
// surviving host with free slots, holders re-placed so that no rank holds
// its own replica; else the job stops. Replicas the lost host held for
// survivors are gone: the job is under-protected until the caller reports
// them re-sent, and a second loss in that window is either survived
// (another copy exists) or reported as unrecoverable. With a durable
// tier that has a commit record (Config.Durable, [DiskCommitted]), a loss
// memory cannot serve rolls the whole job back to the step every rank
// reaches on disk instead ([GatherReach], [DiskReach], [RollbackToDisk]:
// rollback.go). A copy a restore found failing its CRC32C
// ([CopiesCorrupt], reported before the rank's exit) counts as lost, as
// a lost holder's, and the shard is under-protected ([UnderProtected]
// with Corrupt) until its owner re-sends a copy of a later step and G
// passes it. The rank's failure that follows is part of the recovery
// that ran the restore (a splice, or a restart already counted), not a
// new one: it is not charged to Config.MaxRestarts (even 0) nor counted
// by the crash-loop rule. The machine plans that recovery again without
// the corrupt copies: every rank restarts in place from another valid
// copy, or, when no restore plan from memory is left, the job rolls back
// the same way with every rank in place, or it stops with the rank's
// status naming the rank and the corrupt copies. Any other rank failure
// follows the rules above.
package hotswap
