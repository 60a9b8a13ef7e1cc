package durable

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// errTODO is returned by what is not written yet (the API's first commit).
var errTODO = errors.New("durable: not implemented yet")

// Region is one of a rank's protected regions: its name (as in package
// ckpt: [a-z][a-z0-9_-]{0,31}, not "hdr") and its size in bytes, 0 to
// MaxRegionSize.
type Region struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// Limits.
const (
	MaxRegions     = 16      // regions per rank
	MaxRegionSize  = 1 << 40 // bytes per region
	MaxWorld       = 1 << 20 // ranks per job
	MaxConcurrency = 8       // saves in flight per rank, DefaultConcurrency's cap
	// DefaultChunkSize is the chunk size of files a Store creates when
	// Options.ChunkSize is 0: the unit of a writer's pwrite and of a
	// CRC32C in the chunk table.
	DefaultChunkSize = 4 << 20
	// DefaultWriters is the number of writer goroutines of a Save when
	// Options.Writers is 0 (PCcheck §3.4: "ideally 2 to 4").
	DefaultWriters = 4
)

// Manifest is a job's identity and layout, written once when the job
// first starts ([CreateManifest]) and compared with a --resume's
// ([CheckManifest]). Protect, Codec and Command are opaque to the
// package: it only compares them.
type Manifest struct {
	Job     string     `json:"job"`     // the first run's job id, 1 to 64 of [a-z0-9-]
	World   int        `json:"world"`   // world size, 1 to MaxWorld
	Regions [][]Region `json:"regions"` // each rank's regions, in order; World entries
	Protect string     `json:"protect"` // protect mode (--protect-mode)
	Codec   string     `json:"codec"`   // diff codec
	Every   int        `json:"every"`   // --ckpt-every: steps between bases, ≥ 1
	Command string     `json:"command"` // what the job runs (say a hash of program and arguments)
}

// CreateManifest writes DIR/MANIFEST (atomic replacement; see the
// package comment) after checking m. It fails, writing nothing, with an
// error wrapping fs.ErrExist if the directory has a manifest already.
func CreateManifest(dir string, m *Manifest) error { return errTODO }

// ReadManifest reads and checks DIR/MANIFEST. No manifest is an error
// wrapping ErrNoManifest, a bad one an error wrapping ErrCorrupt.
func ReadManifest(dir string) (*Manifest, error) { return nil, errTODO }

// CheckManifest compares the directory's manifest with m, what a resumed
// job expects: an error wrapping ErrMismatch names the first field that
// differs ("world size 8, the directory's job has 4", "rank 3's region
// 1 \"optimizer\": 2097152 bytes, the directory's job has 1048576"). No
// manifest is an error wrapping ErrNoManifest.
func CheckManifest(dir string, m *Manifest) error { return errTODO }

// CheckDir checks that dir exists, is a directory and is writable (it
// creates, fsyncs and removes a probe file), for a clear error at start
// (gorun exits 2 on it).
func CheckDir(dir string) error { return errTODO }

// Options configures a Store. The zero value is valid.
type Options struct {
	// Concurrency is N, the number of Saves that may be in flight at
	// once (0 means 1, at most MaxConcurrency). Open makes sure the rank
	// has at least N+1 base files, and keeps any more it finds.
	Concurrency int
	// Writers is the number of goroutines writing one Save's chunks (0
	// means DefaultWriters).
	Writers int
	// ChunkSize is the chunk size of the base files Open creates, and
	// of the free ones a Save writes (0 means DefaultChunkSize; else a
	// multiple of 4096, up to 1 GiB). A file holding a version keeps its
	// chunk size until it is free again.
	ChunkSize int
	// Logger gets the store's warnings (nil: discarded).
	Logger *slog.Logger
}

// Store is one rank's base files in a job's directory. It is safe for
// concurrent use (see the package comment).
type Store struct {
}

// Open opens rank's base files in dir, creating DIR/r<rank> and the
// base files it lacks (N+1 of them, preallocated). regions are the
// rank's regions, in order (the manifest's). It reads every base file's
// header to learn which versions the rank holds; files whose headers do
// not verify are treated as free (and logged), as are those holding a
// version of other regions. It removes the package's temporary files in
// the rank's directory.
func Open(dir string, rank int, regions []Region, opt Options) (*Store, error) {
	return nil, errTODO
}

// Save writes one version of the rank's regions at step, from src (one
// slice per region, in order, each of the region's size), and makes it
// durable as the package comment describes: data, chunk table and header
// fdatasynced in that order, then the pointer moved forward, then the
// completion marker written. sums are the regions' CRC32Cs, as committed
// with src (ckpt.Staged.Sums, ckpt.Snapshot.Sums): a source that does not
// match them, whole, fails the save with an error wrapping ErrCorrupt
// and nothing is kept. copied, if not nil, is called once, when every
// byte of src has been read (before the data are synced); after it Save
// does not touch src. It is not called when Save fails before then.
//
// Save returns an error wrapping ErrBusy at once, without reading src,
// when Concurrency saves are in flight or no base file is free. Any
// error before the header is written abandons the version: the file
// stays free. ctx cancels a save in progress the same way. Steps need
// not increase from one Save to the next, but a version's counter is
// taken when Save starts, and the pointer names the complete version
// that started last.
func (s *Store) Save(ctx context.Context, step int64, src [][]byte, sums []uint32, copied func()) error {
	return errTODO
}

// Version is one complete version of a rank's regions in a base file.
type Version struct {
	Step    int64
	Version uint64 // the rank's save counter when the save started
	File    string // the base file's path
}

// Latest returns what the rank's pointer names: its newest complete
// version (false if none).
func (s *Store) Latest() (Version, bool) { return Version{}, false }

// Versions returns the rank's complete versions, by step.
func (s *Store) Versions() []Version { return nil }

// InFlight returns the number of Saves in progress.
func (s *Store) InFlight() int { return 0 }

// Load reads the rank's version of step into dst, as the package
// function Load does.
func (s *Store) Load(ctx context.Context, step int64, dst [][]byte) error { return errTODO }

// Reclaim frees what a recovery at committed, the step of the commit
// record, cannot need (see Reclaiming in the package comment) and
// returns the number of base files it freed. It frees nothing and
// returns an error wrapping ErrNoVersion when the rank holds no complete
// version of committed.
func (s *Store) Reclaim(committed int64) (int, error) { return 0, errTODO }

// Truncate forgets everything the rank wrote after step (see Resuming
// and restoring in the package comment): for a job resumed, or a rank
// restored, at step. It fails if a Save is in flight.
func (s *Store) Truncate(step int64) error { return errTODO }

// Close waits for nothing and releases the store's files; Saves in
// flight fail. Closing twice is a no-op.
func (s *Store) Close() error { return errTODO }

// Load reads rank's version of step in dir into dst (one slice per
// region, in order, each exactly the region's size), verifying the
// header and every chunk's CRC32C as it reads. It uses the complete
// version of step with the highest counter. No complete version of step
// is an error wrapping ErrNoVersion; one that does not verify, an error
// wrapping ErrCorrupt naming the file, the region and the byte range
// (dst then holds partial data). Load does not look at the commit
// record: a resume loads the step ReadCommitted returns.
func Load(ctx context.Context, dir string, rank int, step int64, dst [][]byte) error {
	return errTODO
}

// Markers reports, for each rank 0 to world-1, whether it has a valid
// completion marker for step.
func Markers(dir string, world int, step int64) ([]bool, error) { return nil, errTODO }

// Commit writes the commit record for step, if it is after the recorded
// one (else it does nothing and returns nil). The caller must have seen
// every rank's marker for step.
func Commit(dir string, step int64) error { return errTODO }

// ReadCommitted returns the commit record's step. No record is an error
// wrapping ErrNotCommitted, a bad one an error wrapping ErrCorrupt.
func ReadCommitted(dir string) (int64, error) { return 0, errTODO }

// Record is one differential record of a batch: its step and the
// caller's bytes.
type Record struct {
	Step int64
	Data []byte
}

// AppendBatch writes records, the differentials of steps first to last
// (records[i] of step first+i), as one batch file of rank, which appears
// whole or not at all.
func AppendBatch(dir string, rank int, first, last int64, records [][]byte) error {
	return errTODO
}

// ReadBatches returns rank's records of the steps after from,
// contiguous: from+1, from+2, ... as far as the batches that verify
// reach. stop is nil when the log simply ends there; else it says why
// it stopped, wrapping ErrGap (the next batch begins later) or
// ErrCorrupt (the next batch does not verify), and the records before
// are still valid.
func ReadBatches(dir string, rank int, from int64) (records []Record, stop error) {
	return nil, errTODO
}

// Usage is the durable tier's footprint: bytes on disk, per rank and in
// all (manifest and commit record included).
type Usage struct {
	Ranks []int64 // by rank
	Total int64
}

// Footprint returns the directory's usage, from the files' allocated
// sizes (st_blocks).
func Footprint(dir string) (Usage, error) { return Usage{}, errTODO }

// Problem is one thing Verify found wrong: a file and its first bad byte
// range, or a missing file.
type Problem struct {
	Path     string
	Off, End int64 // the first bad byte range, when Err is a *CorruptError
	Err      error
}

// Verify checks every file of the directory: the manifest, the commit
// record, and for every rank its base files' headers and every chunk's
// CRC32C, its pointer, markers and batches. It returns the problems it
// found (none: all is well); err is about the directory itself (say, it
// cannot be read).
func Verify(ctx context.Context, dir string) (problems []Problem, err error) {
	return nil, errTODO
}

// VersionState is a base file's state, as List reports it.
type VersionState int

const (
	StateFree      VersionState = iota // holds no version (or one being written)
	StateCorrupt                       // its header does not verify
	StateComplete                      // a complete version, not committed
	StateCommitted                     // the version the commit record names
)

// BaseFile is one base file, as List reports it.
type BaseFile struct {
	Path    string
	Index   int // i of base.<i>
	State   VersionState
	Step    int64  // when complete or committed
	Version uint64 // when complete or committed
	Bytes   int64  // the version's region bytes (complete or committed)
	Disk    int64  // allocated bytes on disk
	Err     error  // why it is corrupt
}

// Batch is one differential batch file, as List reports it (unverified).
type Batch struct {
	Path        string
	First, Last int64
	Disk        int64
}

// RankListing is one rank's files, as List reports them.
type RankListing struct {
	Rank    int
	Bases   []BaseFile
	Latest  *Version // the pointer (nil if none or bad)
	Markers []int64  // steps with a marker file (unverified), ascending
	Batches []Batch  // ascending
	Disk    int64
}

// Listing is what List reports about a directory.
type Listing struct {
	Manifest    *Manifest // nil if absent or bad (ManifestErr)
	ManifestErr error
	Committed   int64 // the commit record's step, when HasCommit
	HasCommit   bool
	CommitErr   error // a bad commit record
	Ranks       []RankListing
	Usage       Usage
}

// List reads the directory's manifest, commit record, and every rank's
// headers, pointer, markers and batches, without reading the data (Verify
// does): for gorun ckpt ls and show.
func List(dir string) (*Listing, error) { return nil, errTODO }

// DefaultConcurrency returns N, the number of saves to allow in flight,
// from PCcheck's Eq. (2)/(3): with a base every `every` steps of
// stepTime t each, and writeTime T_w to write one, training stalls less
// than a fraction overhead of the time (0.03 for 3%) when
//
//	T_w / (N · every · t) ≤ q,  q = 1 + overhead
//
// (the paper's q is a slowdown factor, runtime ≤ q·runtime₀), so N is
// ceil(T_w / (q · every · t)), at least 1 and at most MaxConcurrency.
// Nonpositive or unknown inputs give 1.
func DefaultConcurrency(writeTime, stepTime time.Duration, every int, overhead float64) int {
	return 1
}
