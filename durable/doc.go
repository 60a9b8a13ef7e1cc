// Package durable is gorun's durable tier (DESIGN.md §5, "Persistent
// tier"; issue 17): one job's base checkpoints, completion markers,
// commit record and differential log, in a directory on a local SSD or a
// shared file system (--ckpt-dir), written so that a crash at any moment,
// a full disk or a failing one never leaves a version that looks valid
// and is not, and read back verifying every byte.
//
// It follows PCcheck (Strati et al., EuroSys '25; ../shared/papers/001):
// up to N checkpoints of a rank in flight at once, into N+1 preallocated
// files, several writer goroutines per checkpoint, data made durable
// before the metadata that describes it, and a per-rank pointer to the
// newest version that only moves forward; and TierCheck's two-phase
// commit and watermark reclamation (../shared/papers/002, §3.4 and §4):
// every rank writes a completion marker once its version is durable, the
// launcher writes the job's commit record once every rank's marker
// exists, only committed versions are used to resume, and nothing a
// recovery at the commit record could need is deleted.
//
// # The directory
//
// One directory holds one job (its first run and every --resume of it):
//
//	DIR/MANIFEST                 the job's identity and layout, written once
//	DIR/COMMITTED                the job's commit record: the newest step every rank has durably
//	DIR/r<rank>/base.<i>         rank's base files, i = 0 to N (N+1 of them)
//	DIR/r<rank>/LATEST           rank's pointer: the newest complete version
//	DIR/r<rank>/LOCK             empty; flocked by the Store that has the rank open
//	DIR/r<rank>/done.<step>      rank's completion marker for step
//	DIR/r<rank>/diff.<a>-<b>     a batch of rank's differential records, steps a to b
//	DIR/r<rank>/trim.<step>      empty; a trim of rank's log to step is under way or was cut short
//
// Ranks, steps, i, a and b are decimal without leading zeros (ranks 0 to
// 2^31-1, steps 0 to 2^63-1, a ≤ b; a trim record's step may also be -1,
// every step). Any other name is not the package's
// and is left alone, except names ending ".tmp" followed by anything,
// which are this package's temporary files (see Atomic replacement); Open
// removes those of its rank. Files are created 0600 and
// directories 0700.
//
// Integers are little-endian in every file: a shared file system may be
// read on another machine than the one that wrote it.
//
// # Atomic replacement
//
// MANIFEST, COMMITTED, LATEST, markers and batches are small files that
// are never modified in place: each is written whole to a temporary name
// in the same directory (its final name followed by ".tmp" and random
// characters), fsynced, renamed over its final name, and the directory is
// fsynced. A crash leaves either the old file or the new one (and perhaps
// a temporary, which nothing reads), never a mix.
//
// # The manifest
//
//	offset  size  field
//	0       4     magic "GRDM"
//	4       1     format version (1)
//	5       3     zero
//	8       4     length L of the body, 2 to 1 MiB
//	12      4     CRC32C (Castagnoli) of the body
//	16      L     body: the [Manifest] as JSON (its field names), nothing after it
//
// The manifest is written once, by [CreateManifest], when the job first
// starts; [CheckManifest] compares a --resume's expectation with it
// field by field.
//
// # Base files
//
// A base file holds one version of a rank's regions (the [Region]s the
// manifest lists for the rank, in order, 1 to 16 of them, names as in
// package ckpt, 0 to 1<<40 bytes each). Its regions are cut into chunks
// of C bytes (C a multiple of 4096 from 4096 to 1 GiB; the last chunk of a
// region may be shorter, a region of 0 bytes has none), K chunks in all,
// each with its CRC32C. The file is laid out as
//
//	offset         size            field
//	0              4096            header
//	4096           4·K             chunk table: the chunks' CRC32Cs, region by region
//	4096+4·K       zero up to T    T = 4096 + (4·K rounded up to a multiple of 4096)
//	T              size(0)         region 0, then zeros up to a multiple of 4096
//	...                            each region at the 4096-aligned offset after the one before
//
// and its size is exactly the end of the last region rounded up to 4096.
// The zeros (after the chunk table, after each region) are under no CRC:
// a save writes them (a file may hold bytes of an earlier layout there)
// and Load and Verify check them.
// The space is reserved with fallocate when the file is created, and the
// file is never truncated or reopened with O_TRUNC afterwards (only
// resized, while it holds no version, if a later run chose another chunk
// size).
//
// The header:
//
//	offset  size  field
//	0       4     magic "GRDB"
//	4       1     format version (1)
//	5       3     zero
//	8       4     state: 0x45455246 free (holds no version), 0x454E4F44
//	              complete; any other value is corruption. The two differ
//	              in 8 bits.
//	12      4     rank
//	16      8     step (0 when free)
//	24      8     version: the rank's save counter (0 when free)
//	32      8     chunk size C
//	40      4     region count R, 1 to 16
//	44      4     CRC32C of the chunk table's 4·K bytes (0 when free)
//	48      16    zero
//	64      40·R  regions: name (32 bytes, ASCII, zero-padded), size (8)
//	64+40R        zero up to 4092
//	4092    4     CRC32C of bytes [0, 4092)
//
// A free header still describes the file's layout, so that the file can
// be checked (its size against the layout) while it holds no version.
//
// # Saving a version
//
// [Store.Save] writes one version of a rank's regions, at a step, from
// the caller's source buffers (the committed slot of package ckpt, whose
// CRC32Cs the caller passes too):
//
//  1. it takes a free base file (one whose header says free and that no
//     other save is writing): the file the pointer names and the one
//     holding the committed version are complete, never free. With
//     Concurrency saves in flight already, or no free file, it fails at
//     once with an error wrapping [ErrBusy];
//  2. it writes the file's header as free (the store's layout, step 0)
//     and fdatasyncs it, so that whatever the file held can never be
//     taken for what is written next (the file is free already; this
//     makes it so on disk even if its header was not rewritten since an
//     earlier crash);
//  3. Writers goroutines take chunks in turn; each copies its chunk from
//     the source into a buffer of its own while computing its CRC32C
//     (so that the bytes checksummed are the bytes written, whatever
//     happens to the source meanwhile), and pwrites the buffer at the
//     chunk's offset (a region's last chunk with the zeros after it),
//     with O_DIRECT where the file system takes it (the buffers are
//     page-aligned, as are the chunks' offsets and lengths): no second
//     copy into the page cache, no dirty pages left to write back; a
//     file system that refuses it has the chunks written through the
//     page cache, as do the saves after a caller waited for a save's
//     copy (Store.CopyWaited: the copy into the page cache ends sooner
//     than the device's writes);
//  4. once every chunk is read it checks each region's CRC32C, combined
//     from its chunks', against the caller's: a source overwritten while
//     it was read fails the save here. Then it calls the caller's copied
//     function (the caller may release the source);
//  5. it writes the chunk table (and the zeros after it) and fdatasyncs
//     the file: every data byte and every chunk CRC is durable;
//  6. it writes the header as complete (step, version, table CRC) and
//     fdatasyncs it;
//  7. it moves the rank's pointer (LATEST) to this version if this
//     version's counter is higher than the pointer's (an older save that
//     finishes late leaves a newer pointer alone), both in memory (under
//     the store's mutex) and on disk (atomic replacement, under the same
//     mutex, so the file only moves forward too);
//  8. it writes the rank's completion marker done.<step>.
//
// A crash before 6 completes leaves the file's header free or torn (a
// header whose CRC fails is corrupt and holds no version): nothing torn
// is ever read. A crash after 6 leaves a complete version, found by
// scanning the headers even if the pointer or the marker was not
// written; without its marker it is never committed. Any error (ENOSPC,
// EIO, a bad source) before 6 abandons the version: the file stays free
// and the error is returned (if even rewriting the header as free fails,
// the file is set aside until a later Save or Reclaim manages to). An
// error in 7 or 8 leaves a complete version whose marker may be missing:
// Save returns the error, and the next Save or Reclaim tries 7 and 8
// again; the version is kept until the watermark passes it (its marker
// may have reached the disk, and the launcher may have committed it).
//
// A save counts as in flight, for Concurrency, from 1 to 8. One that
// completes after Reclaim moved the watermark past its step can never
// be committed (the commit record only moves forward): its file is freed
// at once, and it gets neither pointer nor marker. The save's look at
// the watermark and its writes of 7 and 8 are one step for Reclaim and
// Close (a mutex they hold): a Reclaim either moves the watermark before
// the look, or removes the markers after the marker is written, never in
// between, so no marker outlives the version it names; after Close, no
// save writes a pointer or a marker.
//
// The pointer:
//
//	offset  size  field
//	0       4     magic "GRDP"
//	4       1     format version (1)
//	5       3     zero
//	8       4     rank
//	12      4     i, the base file (base.<i>)
//	16      8     step
//	24      8     version
//	32      4     CRC32C of bytes [0, 4096) of the file's header, as complete
//	36      4     CRC32C of bytes [0, 36)
//
// A completion marker done.<step> has the same 40 bytes, with magic
// "GRDK": the rank's version of step is complete in base.<i>.
//
// # Committing and abandoning
//
// One party, the launcher (the caller of [Commit]; in gorun, package
// launcher, from the ranks' reports), decides every base step: committed,
// or abandoned for good. The commit record:
//
//	offset  size  field
//	0       4     magic "GRDC"
//	4       1     format version (1)
//	5       3     zero
//	8       8     step
//	16      4     zero
//	20      4     CRC32C of bytes [0, 20)
//
// Commit only moves the record forward: a step not after the recorded
// one changes nothing. A version the commit record does not name is never
// used to resume. The protocol:
//
//  1. Each rank reports the steps of its markers ([Store.Marked], then
//     those of its saves that succeed) and a resolved step S_r: a step
//     such that every save of the rank of a step at or before S_r has
//     ended, written with its marker or not at all (it failed, was
//     skipped ([ErrBusy]) or was given up): the step before its oldest
//     save still in flight, or its newest step when none is. The rank's
//     markers at or before S_r, as reported, are final: a step it did
//     not report a marker of there, it never reports one of later (a
//     complete version whose marker write failed counts as failed, even
//     if a retry later writes its marker).
//  2. The launcher takes X, the minimum of the ranks' S_r (and of any
//     bound of its own: gorun's G), never below the X it published
//     before nor below its commit record. Every step at or before X is
//     decided: if some of them after the commit record and after the
//     previous X have every rank's marker, it commits the newest of
//     them (Commit); every other step at or before X is abandoned. It
//     never commits a step at or before an X it published.
//  3. It publishes D, the commit record's step, and X (D ≤ X); each rank
//     calls [Store.Reclaim](D) and [Store.Abandon](D, X), in that order.
//
// Abandon(D, X) frees every complete version of a step s ≤ X other than
// D, and removes its marker, so that a rank whose saves failed or were
// skipped on some ranks (their versions sharing no step) always gets its
// files back: without it a version no commit ever names would hold its
// file for good, and with every file held the rank's saves all fail
// ErrBusy. It is safe, as no version the launcher may still commit is
// freed: if s < D, the commit record passed s and only moves forward; if
// D < s ≤ X, the launcher decided s when it published X, and commits only
// steps after X from then on, so s is never committed; D itself is kept
// (by Abandon and by Reclaim), and any step after X is not touched. The
// ranks' reports being final at or before S_r ≥ X, no marker of a step
// at or before X appears in a report after the decision: the launcher's
// view of those steps cannot change. A save of a step at or before X
// other than D that completes after Abandon (which step 1 rules out) is
// freed at once, unmarked, as after Reclaim.
//
// # Reclaiming
//
// Once the commit record names step W (the watermark), [Store.Reclaim](W)
// frees the rank's base files holding versions of steps before W
// (rewriting their headers as free), removes its markers of steps before
// W and its differential batches that end at or before W. The version of
// W and anything newer stay: a recovery at W needs W's base and every
// differential after W. Reclaim frees nothing when the rank holds no
// complete version of W. (Abandon, called after it with X ≥ W, frees the
// versions before W even then, and the one the pointer names: a version
// of a step before W is never committed.)
//
// # Differential batches
//
// [AppendBatch] writes one batch of a rank's differential records, of
// steps a to b (one record per step), as one file:
//
//	offset  size  field
//	0       4     magic "GRDL"
//	4       1     format version (1)
//	5       3     zero
//	8       4     rank
//	12      4     record count b-a+1
//	16      8     a
//	24      8     b
//	32      4     zero
//	36      4     CRC32C of bytes [0, 36)
//	40            the records, in step order, each:
//	                0   8   step
//	                8   4   length n of the data
//	                12  4   CRC32C of the record's bytes [0, 12) followed by its data
//	                16  n   data (opaque: the caller's differential)
//
// and nothing after the last record. The file appears whole or not at
// all (atomic replacement).
//
// [ScanBatches](from, upTo) reads the log back: the records of the steps
// after from, up to upTo, contiguous, handed to the caller's function one
// batch at a time, in step order, each batch checked whole (every CRC)
// before any of its records is handed over. It stops at the first gap
// (an error wrapping [ErrGap]) or batch that does not verify (wrapping
// [ErrCorrupt]), the records handed over before being valid; where
// batches overlap it reads the one reaching furthest towards upTo (and of
// those the one that ends first), and the next if that one does not
// verify. A batch file holding no step from from+1 to upTo is never
// opened: a replay to a step inside the log reads nothing after it. The
// records handed over are the caller's only until its function returns:
// the next batch is read into the same buffers, so that a scan holds one
// batch's records at a time, however long the log (a batch's records of
// sizes the batch before did not have go into new buffers, and the old
// ones are dropped once it is handed over).
//
// [TrimBatches](S) cuts the log at step S (a resume at S, whose run
// writes its own steps after S): the batches that end after S are
// removed, and one that straddles S is first written again as the batch
// of its steps up to S. The old batch and the rewritten one overlap, and
// a scan prefers the one reaching further: were the old one left beside
// the new history's batches (a crash between the rewrite and the
// removal, a removal that did not reach the disk, a writer that went on
// after a trim that failed), a scan would hand over the old history's
// steps after S, then the new one's. So a trim that removes anything
// first writes the trim record trim.<S> (an empty file, atomic
// replacement), then the prefixes, removes the batches ending after S
// and fsyncs the directory, and only then removes the record (and
// fsyncs the directory again). While a trim record trim.<S> exists, a
// scan ends the log at S (the least S of them), with an error wrapping
// [ErrGap] that names the record when batches go on after it: everything
// after S may be of the history cut, the batches written since
// included. A later trim to S' trims to min(S, S') and removes the
// record. A history is never mixed: a scan reads the old history up to
// S, and the new one after S only once the trim has completed. A trim
// record that cannot be written makes the trim remove the batches after
// S without rewriting the prefix (a gap before S, not a mix).
//
// # Resuming and restoring
//
// A job resumed at step G (the commit record's, plus the differentials
// replayed after it) must first forget what its previous run wrote after
// G, or the markers of a version nobody will finish could be taken for
// the new run's: [Store.Truncate](G) frees the base files of steps after
// G, removes the markers of steps after G, removes the batches after G
// ([TrimBatches]: rewriting a batch that straddles G as one that ends at
// G, behind a trim record) and points
// LATEST at the newest version left. Every rank's Truncate must complete
// before the launcher next looks at markers. Then [Store.Reclaim](C), C
// the commit record's step, frees the versions before C that the dead run
// left (a save that finished after its last Reclaim): a fresh Store
// knows no watermark, and without it those files would stay held.
//
// # What is checked
//
// Everything read from the directory is checked before use: magic,
// format version, CRCs, zero fields and padding, ranks and steps against the file's
// name and the caller's expectation, regions against the manifest and
// the caller's buffers, file sizes against the layout. Offsets and
// lengths come from the validated layout, never from unchecked bytes.
// What a read allocates is bounded whatever a file's size or contents
// say: the small files by their format's size (a larger one is
// corrupt), a base file's table by its validated header, a batch by
// reading one of more than 64 MiB record by record, a record of more
// than 64 MiB having its CRC32C checked in pieces before it is read
// into a buffer of its size (unless a scan holds a buffer that large
// already, from the batch before, or has read a record that large that
// verified: a bad record then costs the scan no more than a good one
// did) (a batch of more than 64 GiB is corrupt); a record of a batch read record by record that a scan does
// not hand over (before from or after upTo) is checked in pieces, never
// read into a buffer of its size. A
// file that does not verify is an error wrapping [ErrCorrupt] (a
// [*CorruptError] naming the file and the first bad byte range); a
// version that does not verify is never returned.
//
// # Concurrency
//
// A Store is safe for concurrent use; up to Concurrency Saves run at
// once, and Load, Latest, Reclaim and Abandon beside them. Truncate
// must not run beside a Save. One Store at a time may have a rank open,
// whatever process or host it is in: Open takes an exclusive flock
// (LOCK_EX, without waiting) on DIR/r<rank>/LOCK, held until Close,
// before it touches anything of the rank's, and fails with an error
// wrapping [ErrLocked] if another Store holds it (a host that took a
// rank over while the rank's old host still writes: the new one tries
// again later). On a shared file system the lock is as good as the file
// system's flock (NFS emulates it with its byte-range locks, and an old
// host cut off from the server loses its lock when its lease ends).
// The package's functions on the directory (Markers, Commit,
// ReadCommitted, AppendBatch, ScanBatches, List, Verify) are safe beside
// Stores; Commit must have one caller (the launcher).
package durable
