// Package diffstore is a replica holder's copy of one owner's protected
// state in differential protection (gorun --protect-mode diff; TierCheck
// §3.2-§3.3): a base, the owner's full state at some step, and the log of
// the differentials that followed it, each the input of one optimizer step
// (the owner's gradient as a replay record, the step's Adam
// hyper-parameters, and the full bytes of the owner's small regions). A
// [Store] restores the owner's state at any step of its range, base plus a
// fused replay of the log ([replay.Fused]); [Store.Fold] folds a prefix of
// the log into the base ([Store.FoldChecked] checks the folded state
// first); a [BaseWriter] replaces the base with a fresh one
// that arrives in chunks while the differentials keep coming.
//
// The store is a data structure in memory: no I/O, and no goroutine that
// outlives a call (the caller runs Fold on a goroutine of its choice;
// RestorePieces replays on one of its own, ended before it returns). It
// is safe for concurrent use.
//
// # What is promised
//
//   - Range. The store restores the steps [first, last]: first is its
//     base's step (which may be -1, an owner's state before its first
//     step), last the step of its newest differential (the base's step if
//     the log is empty). Restore of any other step fails with ErrNotHeld.
//     Without a base (before the first one commits) it restores nothing.
//   - Exactness. The owner's optimizer region holds N float32 master
//     weights W and both Adam moments M and V (little-endian, at the
//     offsets of [Optimizer]); the trainer steps them with [replay.Step]
//     and hands the store, for step s, the gradient and hyper-parameters
//     it used. When every differential since the base was encoded
//     lossless (replay's Raw codec), Restore(s) returns the owner's state
//     at s bit for bit, whatever the folds and base refreshes in between:
//     replay's sequential and fused paths give the same bits, so folding
//     is only an optimization and never changes what Restore returns. With
//     a lossy codec (Int8, TopK) the store accepts the differentials and
//     restores an approximation; it then makes no exactness claim
//     ([Store.Exact] says which steps are exact). The bytes of the
//     optimizer region outside W, M and V, if any, are the base's: the
//     owner must not change them between bases. The other regions are
//     carried whole by every differential.
//   - Base refresh. [Store.BeginBase](b) starts a new base at step b; its
//     chunks may arrive over many steps while Append goes on. Until
//     [BaseWriter.Commit] verifies every region's CRC32C against the
//     owner's, the old base and its whole log stay as they are; Commit then
//     switches to the new base and drops the log at or before b, at once
//     for every reader. A refresh that never commits (Abort, a newer
//     BeginBase, a Truncate before its step) changes nothing; one whose
//     CRC32Cs do not match is refused with ErrCorrupt and changes nothing.
//     A Fold goes past a refresh in progress only when what it folds is
//     exact (lossless since the base, see [Store.Exact]): the folded base
//     is then the owner's state bit for bit, so the refresh is only a
//     check, and the log stays as short as the caller's folds keep it
//     however slowly the refresh arrives. A refresh that finds the base
//     past b when it commits is verified and then dropped (the store holds
//     a later base). With a lossy log a Fold stops at b, so that the
//     refresh, which resets the drift, replaces the base when it commits;
//     the log then grows until it does. The next Fold or FoldChecked
//     measures how far the replaced path had drifted from the refresh
//     (the owner's true state): [Stats].Drift, over the master weights.
//   - Lost steps. If differentials were lost before a refresh at b (or
//     there is no base yet), the refresh keeps the differentials after b
//     itself, and the base brings them with it when it commits: the store
//     is never stuck waiting for a step nobody will send. [Store.Next]
//     says which step Append takes next (where the owner must resend
//     from). A step resent that the store holds already (same record) or
//     that is at or before the base's is taken as a no-op.
//   - Input from the wire. Everything is validated (step order, record
//     CRC and layout, N, region names and sizes, hyper-parameters). Every
//     byte Restore depends on is covered by a CRC32C: the record by its
//     own, a differential's step, hyper-parameters and other regions by
//     its Sum ([Diff.Seal]), a base's regions by the sums its Commit
//     checks and its step by Commit's step argument; Adam's step count T
//     must follow the previous differential's, or the base's (known once
//     a fold or a refresh the log reached set it); a
//     refused Append leaves the store unchanged, and nothing panics on bad
//     input.
//   - Concurrency. Append, Next, Held, Range, Exact, Stats, SetG,
//     BeginBase and the BaseWriter's methods never wait for a Fold or a
//     Restore in progress (they are on the replication receive path): they
//     hold the store's lock only for bookkeeping, never during a copy, a
//     checksum or a replay. (A BaseWriter's methods run one at a time, so
//     Abort waits for a Write's copy in progress.) Restore, RestorePieces
//     and Truncate wait for a Fold or FoldChecked in progress, and those
//     for them; Restores run side by side. BeginBase only tries the
//     folds' lock (sync.RWMutex.TryLock), never waits for it.
//
// # Who waits for whom, and when a buffer is reused
//
// The store hands a buffer back, or reuses one, only where nothing can
// read it any more. A base's bytes and a differential's record are read
// by Restore and RestorePieces, which hold the folds' lock (foldMu) for
// reading from the moment they look at the log until they return; Fold,
// FoldChecked and Truncate hold it for writing. So:
//
//   - Records. Fold, FoldChecked and Truncate hand the records they drop
//     from the log to the function given to [Store.SetRecycle], with
//     foldMu write-held (no Restore in progress; one that starts later
//     sees the log without them). Records dropped elsewhere (a refresh
//     that commits, under the store's lock alone, while a Restore may be
//     reading them) go to the garbage collector.
//   - A checked fold's spare. FoldChecked replays into a spare buffer and
//     then swaps it with the base's optimizer region, with foldMu
//     write-held: the old buffer is the next spare.
//   - A refresh's buffers. A refresh that never became the base
//     (superseded at Commit, aborted) was read by nobody but its own
//     Writes, which its lock excludes: its buffers are kept for the next
//     BeginBase at once. A base that a refresh replaced may be read by a
//     Restore begun before: its buffers are kept aside, and reused only at
//     the next point where foldMu is write-held (a fold, a Truncate, or a
//     BeginBase whose TryLock succeeds).
//
// The store keeps at most two spare buffers per region (a fold's spare
// and a refresh's, which overlap), plus, with a lossy log, the base a
// refresh replaced until the next fold measured its drift;
// [Stats].SpareBytes counts them.
//
// # Append takes ownership of the buffers
//
// Append keeps a differential's byte slices as received (the record and
// every other region's bytes): the caller must not reuse, change or
// return them to a pool afterwards, even when Append returns nil for a
// step it already held. The store gives a record back only through the
// function given to [Store.SetRecycle], when no reader can hold it. The record's gradient is read in place at every
// replay when it is 8-byte aligned (as from make), and copied once, at
// Append, when it is not.
//
// # The caller's part
//
//   - Acknowledge only what is held. Append returning nil means the
//     differential was taken, not that its step is restorable: before the
//     first base commits, or while a refresh after lost steps is in
//     progress, it is not. A holder acknowledges step s to the owner
//     (counts it replicated) only when [Store.Held](s).
//   - Tell the store G. Fold and the commit of a base at b drop the steps
//     before them, so neither may pass the step the job may restart from
//     (G): the caller tells the store G with [Store.SetG], and the store
//     keeps to it. Fold stops at G; a refresh verified at b > G waits, in
//     progress, until SetG reaches b, and is then installed. (Until the
//     first SetG, G is unbounded.)
//   - Resend from Next. After a gap, the owner resends from [Store.Next].
//   - Truncate(after) discards the steps after a restart to G.
//   - Fold. The log grows by one differential per step until the caller
//     folds it (gorun folds when it holds --diff-fold N steps beyond G): the
//     store does not bound it, and [Store.Stats] reports its length and
//     bytes. A lossless log folded every N steps holds at most N+1
//     differentials, a refresh in progress or not; a lossy one also those
//     from a refresh's step until it commits, so the owner should send a
//     refresh within a few N steps.
//   - Memory. A store holds its base (the regions' sizes), a refresh's
//     buffers while one is in progress (allocated by [Store.BeginBase]
//     unless it reuses spare ones), its spare buffers (Stats.SpareBytes,
//     at most two sets of the regions, and a replaced base kept for a
//     drift measurement) and its differentials as received:
//     a caller that bounds its memory reserves those before it allocates
//     or begins them.
package diffstore
