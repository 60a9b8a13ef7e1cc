// Package ckpt protects a rank's training state. This first part holds the
// state in host shared memory, in two "ping-pong" slots (DEADPOOL §VI-A,
// DESIGN.md §5): step s is written into the slot that does not hold the
// newest committed step, checksummed, and committed by writing that
// slot's header last, so that the other slot keeps step s-1 intact
// whatever happens while s is written.
//
// # Regions and slots
//
// A rank's protected state is a set of named regions ([Region]; for now
// optimizer, params and meta), 1 to 16 of them, each with a name matching
// [a-z][a-z0-9_-]{0,31} (other than "hdr") and a size fixed at creation,
// 0 to 1<<40 bytes.
// [Create] makes the files of a rank's slots, [Open] maps existing ones
// (a restarted rank, or the agent). A step is written in three moves:
//
//	st, err := slots.Stage(step)         // mark the older slot uncommitted
//	copy(st.Region("params"), params)    // fill every region's view
//	err = st.Commit()                    // CRC32C each region, then commit
//
// and read back with [Slots.Newest], which returns the newest committed
// step whose every region's CRC32C verifies, falling back to the other
// slot when the newest does not verify.
//
// [Slots.At] reads a given step instead, verified the same way (it never
// falls back), and [Slots.Truncate] forgets the steps after a given one
// (see Restoring).
//
// Steps must increase. ckpt does not enforce the overwrite rule of
// DESIGN.md §5 (stage step s only once step s-1 is globally recoverable):
// the caller waits for it before calling Stage, which overwrites the slot
// holding the older of the two committed steps.
//
// # Files
//
// A rank's files live in one directory, /dev/shm unless [Options] says
// otherwise, and are named by job, rank and region:
//
//	gorun-<job>.r<rank>.hdr        the header file: layout and the two slot headers
//	gorun-<job>.r<rank>.<region>   one data file per region: [slot 0 | slot 1]
//
// Job ids are exactly those internal/wire.ValidJobID accepts: 1 to 64
// characters of [a-z0-9-], not starting with '-' (the ids gorun
// generates are 16 of [a-z0-9]; ckpt may not import internal/wire, so
// it has its own copy of the rule, which must stay the same). They never
// contain '.', so "gorun-<job>." is a prefix of that job's files only:
// job "a" does not own the files of job "a-r0" (gorun-a-r0.r0.hdr) or
// "a-b". Region names cannot contain '.' either, and no region may be
// named "hdr", whose data file would be the header file. Ranks are
// written in decimal without leading zeros, 0 to 2^31-1. [RemoveJob]
// removes the regular files whose names have exactly this form for the
// job, and nothing else; [Remove], those of one rank. An agent ending,
// or a rank leaving its host, removes only the files it made
// ([RemoveOwned]): two agents of a job that share the directory (hosts
// emulated by network namespaces share /dev/shm) use the same names for
// a rank that moved from one to the other, and the newest maker owns
// them. Both take the rank's names lock ([Claim.Names]) to make or
// remove them, waiting for it at most [NamesWait] ([ErrNamesBusy]), and
// go on without it where it cannot be taken ([ErrNoNamesLock]).
//
// Files are created 0600 with O_EXCL and O_NOFOLLOW (after removing the
// rank's old files, whose other mappings keep the old memory), and both
// are mapped MAP_SHARED: the rank, its agent and a restarted rank see the
// same bytes, and a crash of the process writing them loses nothing that
// was committed. The data files' space is reserved with fallocate at
// creation, so that a full /dev/shm is an error from Create rather than
// a SIGBUS when a slot is written. Open refuses files that are not
// regular, not owned by this user or writable by others, and files whose
// sizes are not exactly what the layout says (a truncated file is an
// error, not a SIGBUS later). A file shrunk by another process after it
// was mapped would still raise SIGBUS on access to the lost pages; that
// is accepted because only the job's own processes, running as this
// user, can write these 0600 files (and turning the fault into a panic,
// with debug.SetPanicOnFault in every goroutine that touches a view, is
// not a burden to put on every user of the views for that).
//
// # The data files
//
// A region of size bytes has a data file of 2·stride bytes, stride being
// size rounded up to a multiple of 4096: slot 0 at offset 0, slot 1 at
// offset stride, each holding the region's bytes followed by zeros up to
// the stride. A region of size 0 has an empty file and empty views.
//
// # The header file
//
// The header file is 4096 bytes. Integers are in the machine's byte order
// (little-endian on amd64 and arm64, which gorun targets): the files are
// shared between the processes of one machine only and never leave it
// (replication sends region bytes, not these headers), and the fields
// that are read and written atomically can only be in that order.
//
//	offset  size  field
//	0       1024  layout, written once by Create and never changed
//	1024    1024  slot 0's header
//	2048    1024  slot 1's header
//	3072    1024  reserved (zero)
//
// The layout:
//
//	offset  size  field
//	0       4     magic "GRCK"
//	4       1     version (1)
//	5       3     reserved (zero)
//	8       4     region count N, 1 to 16
//	12      4     rank
//	16      64    job id, ASCII, zero-padded
//	80      48    reserved (zero)
//	128     40·N  region descriptors, in the regions' order:
//	                0   32  name, ASCII, zero-padded
//	                32  8   size in bytes, 0 to 1<<40
//	128+40N       zero up to offset 1020
//	1020    4     CRC32C (Castagnoli) of bytes [0, 1020)
//
// A slot's header:
//
//	offset  size  field
//	0       4     state: 0 empty (never written), 0x47415453 staging (being
//	              written; never valid), 0x544D4F43 committed; any other
//	              value is corruption. The values differ in many bits, so
//	              that no single flipped bit turns one into another.
//	4       4     CRC32C of bytes [8, 16+16·N) of this header
//	8       8     step
//	16      16·N  one entry per region, in the layout's order:
//	                0   8   size in bytes (the layout's)
//	                8   4   CRC32C of the region's size bytes in this slot
//	                12  4   reserved (zero)
//	16+16N        zero up to the end of the header
//
// # Staging and committing
//
// [Slots.Stage] picks the slot not holding the newest committed step (slot
// 0 when none is committed), then
//
//  1. sets the slot's state to staging, with an atomic swap, before
//     anything else touches the slot: from here on the slot can never
//     look valid until it is committed again, whatever is left half
//     written in it;
//  2. writes the step.
//
// The caller then fills the regions' views, and [Staged.Commit]
//
//  3. computes each region's CRC32C (a large region in pieces on up to
//     GOMAXPROCS goroutines, their CRCs then combined, since one core
//     checksums only about as fast as it copies) and writes the entries,
//     one per region;
//  4. writes the header's CRC;
//  5. sets the state to committed, with an atomic store, last.
//
// A crash anywhere before 5 leaves the slot staging, which readers skip,
// and the other slot as it was: the newest step committed before is still
// there, intact. A crash after 5 has committed the step.
//
// # Restoring
//
// A rank restored to step G, which need not be its newest (the newest
// step every rank can recover may be older), reads it with [Slots.At]:
// the committed slot holding exactly G, its every region's CRC32C
// verified, with the sequence-lock re-reads Newest does (see Memory
// ordering). At returns an error wrapping [ErrNoStep] when neither slot
// holds G committed, one wrapping [ErrCorrupt] when the slot holding it
// does not verify; it does not fall back to the other slot, and its
// Snapshot's Fallback is nil.
//
// Then it calls [Slots.Truncate](G): every slot holding a committed step
// after G is marked staging, with the same atomic swap Stage uses, under
// the writer's lock, and so becomes invalid to every reader (one
// verifying it at that moment reads again); a Staged in flight is
// abandoned, its Commit failing. The slot holding G is not touched. The
// next Stage(G+1) then goes to the slot not holding G, which keeps G
// intact while G+1 is written; without Truncate it would overwrite G,
// the newer step G+1 still being in the other slot. Truncate of a step
// at or after the newest committed one changes no slot.
//
// # Rank clients
//
// The writer that stages and commits (a rank service, owning the header
// file) need not be the process that writes the regions' bytes (the
// rank). [Slots.Files] gives the data file of every region ([RegionFile]:
// name, size, stride, absolute path, in Regions order) and [Slots.Dir]
// their directory; [MapData] maps one data file read-write and shared,
// with the checks Open makes (no symbolic link, a regular file of this
// user's that group and others cannot write, exactly 2·stride bytes,
// stride the size rounded up to 4096, a size of 0 to 1<<40), and returns
// the views of both slots. The service stages step s and tells the client
// the slot; the client fills that slot's views and says so; the service
// commits. The client's stores must happen before the service's commit
// reads them: the message that says the client is done orders them when
// it synchronizes the two (a write to and a read from a pipe or socket
// do, through the kernel's locks). The commit's CRC32C covers the bytes
// whichever process wrote them. A region of size 0 has empty views and no
// mapping.
//
// # Memory ordering
//
// Readers in other processes (the agent, a restarted rank) read the slot
// headers with atomic loads and the regions with plain loads; the writer
// writes the regions with plain stores and the state with atomic
// operations (sync/atomic on the mapped words, which are aligned: the
// mapping starts on a page boundary and every field is at a multiple of
// its size).
//
// Commit: the region bytes, the entries and the header CRC are all
// written before the state's atomic store in program order. A Go atomic
// store is a release (XCHG on amd64, STLR on arm64) and a Go atomic load
// an acquire (MOV on amd64, LDAR on arm64), so a reader whose load of the
// state returns committed sees every byte written before that store, on
// any processor, exactly as the Go memory model promises for goroutines
// (the atomic store is synchronized before the load that observes it).
// The mapping is the same physical memory in every process, and the
// hardware orders accesses to memory, not to address spaces, so the
// argument carries over to processes.
//
// Overwriting: a reader verifying a slot could race the writer staging
// into that very slot (which the overwrite rule makes the writer do only
// two commits later). Readers therefore check, as a sequence lock does,
// that the slot's state and step after reading its bytes are those they
// read before; if not, they read again. For that, the writer's staging
// mark must become visible before its first data store, and the reader's
// data loads must complete before its re-check; both are atomic
// read-modify-write operations (a swap, and a compare-and-swap that
// writes back the committed value it expects), which are full barriers
// on amd64 (LOCK-prefixed) and acquire-release atomics (SWPAL, CASAL) on
// arm64. Behind that is the CRC: bytes torn between two steps
// fail it, and a slot that fails it is never returned.
//
// # What is checked
//
// Everything read from the header file is checked before use: the layout
// (magic, version, CRC, region count, rank and job, names, sizes,
// reserved bytes) when the files are opened, against the regions the
// caller expects and the data files' sizes; a slot's header (state value,
// header CRC, entries' sizes and reserved bytes, steps distinct between
// the slots) each time it is read.
// Nothing read from the files is used as an offset or a length: those
// come from the validated layout. A bad layout is an error wrapping
// [ErrLayout], a slot that does not verify one wrapping [ErrCorrupt].
//
// # Concurrency
//
// A Slots is safe for concurrent use by several goroutines. There is one
// writer per rank at a time (the rank, or its rank service): Stage,
// Commit and Truncate are serialized within a Slots, but two processes
// staging into the same files at once are not supported (a rank client
// writing views from MapData is not a writer in this sense: it writes
// only the slot being staged, when told to). Views returned by Stage and
// Newest are slices over the mappings: they are valid until Close, and
// using them afterwards faults.
package ckpt
