package durable

import (
	"log/slog"
	"strconv"
)

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

// Version is one complete version of a rank's regions in a base file.
type Version struct {
	Step    int64
	Version uint64 // the rank's save counter when the save started
	File    string // the base file's path
}

// Record is one differential record of a batch: its step and the
// caller's bytes.
type Record struct {
	Step int64
	Data []byte
}

// Usage is the durable tier's footprint: bytes on disk, per rank and in
// all (manifest and commit record included).
type Usage struct {
	Ranks []int64 // by rank
	Total int64
}

// Problem is one thing Verify found wrong: a file and its first bad byte
// range, or a missing file.
type Problem struct {
	Path     string
	Off, End int64 // the first bad byte range, when Err is a *CorruptError
	Err      error
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

// String returns the state's name, as gorun ckpt prints it.
func (s VersionState) String() string {
	switch s {
	case StateFree:
		return "free"
	case StateCorrupt:
		return "corrupt"
	case StateComplete:
		return "complete"
	case StateCommitted:
		return "committed"
	}
	return "VersionState(" + strconv.Itoa(int(s)) + ")"
}
