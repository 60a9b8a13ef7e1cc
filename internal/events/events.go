package events

// SchemaVersion is the version of the schema this package writes and
// reads, in every launch record.
const SchemaVersion = 1

// An Event is one record's body: its kind's fields.
type Event interface {
	// Kind is the record's "event".
	Kind() string
}

// Record is one line of an events file.
type Record struct {
	// T is the time in seconds since the job started.
	T float64
	// Event is the body: one of this package's types, an Unknown for a
	// kind it does not know.
	Event Event
}

// Host roles in a launch record.
const (
	RoleRunning = "running"
	RoleSpare   = "spare"
)

// LaunchHost is one host of a launch record.
type LaunchHost struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	Ranks []int  `json:"ranks"`
}

// Launch is the first record of a job.
type Launch struct {
	Schema     int          `json:"schema"`
	Job        string       `json:"job"`
	NP         int          `json:"np"`
	Hosts      []LaunchHost `json:"hosts"`
	Spares     int          `json:"spares"`
	Redundancy string       `json:"redundancy"`
	Protect    string       `json:"protect"`
	Recovery   string       `json:"recovery"`
	Program    []string     `json:"program"`
}

// Rendezvous is the first epoch table going out.
type Rendezvous struct {
	Registered int     `json:"registered"`
	Took       float64 `json:"took"`
}

// Sample is the state protection's figures at one time.
type Sample struct {
	Epoch     uint64    `json:"epoch"`
	Gen       uint64    `json:"gen"`
	G         int64     `json:"g"`
	D         *int64    `json:"d,omitempty"`
	Rate      float64   `json:"rate"`
	Min       []int64   `json:"min"`
	Max       []int64   `json:"max"`
	Wait      []float64 `json:"wait"`
	ReplBytes []int64   `json:"repl_bytes"`
	Stages    []int64   `json:"stages"`
}

// Failure kinds (Failure.What).
const (
	FailRankExit = "rank-exit"
	FailAgent    = "agent-failed"
	FailHostLost = "host-lost"
	FailGPU      = "gpu"
	FailHang     = "hang"
)

// Failure is something that failed, as the launcher saw it.
type Failure struct {
	Host   string `json:"host"`
	Rank   int    `json:"rank"`
	What   string `json:"what"`
	Exit   *int   `json:"exit,omitempty"`
	Signal string `json:"signal,omitempty"`
	Msg    string `json:"msg,omitempty"`
	// Class and Decision are the failure's classification and what was
	// decided (doc.go); Epoch the recovery epoch it started or joined, 0
	// (absent) for none.
	Class    string `json:"class,omitempty"`
	Decision string `json:"decision,omitempty"`
	Epoch    uint64 `json:"epoch,omitempty"`
	// Detected is when the failure was first seen, in seconds since the
	// job started (the record's t is when it was decided on: later for
	// a suspected host); nil in files of gorun before it.
	Detected *float64 `json:"detected,omitempty"`
}

// Fence is a lost host cut off from the job.
type Fence struct {
	Host string `json:"host"`
}

// Splice moves a lost host's ranks to another host.
type Splice struct {
	Epoch uint64 `json:"epoch"`
	Lost  string `json:"lost"`
	With  string `json:"with"`
	Ranks []int  `json:"ranks"`
	Spare bool   `json:"spare"`
}

// Restart restarts every rank in a new generation.
type Restart struct {
	Epoch uint64 `json:"epoch"`
	Gen   uint64 `json:"gen"`
	G     int64  `json:"g"`
}

// Publish is an epoch's table going out.
type Publish struct {
	Epoch   uint64 `json:"epoch"`
	Gen     uint64 `json:"gen"`
	G       int64  `json:"g"`
	Restore int    `json:"restore"`
}

// UnderProtected names ranks with fewer replicas than configured.
type UnderProtected struct {
	Epoch  uint64 `json:"epoch"`
	Owners []int  `json:"owners"`
}

// Protected says every replica is in place again.
type Protected struct{}

// Abort is the job stopping.
type Abort struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
}

// The recovery stages, in order (Stage.Name).
var Stages = []string{"detected", "classified", "replaced", "published", "restored", "resumed"}

// Stage is a recovery epoch reaching one of its stages (Stages) at the
// record's time.
type Stage struct {
	Name  string `json:"-"`
	Epoch uint64 `json:"epoch"`
	Cause string `json:"cause"`
}

// Timeline is a recovery epoch's record: each stage's time since the
// start in seconds, nil for a stage not reached.
type Timeline struct {
	Epoch      uint64   `json:"epoch"`
	Cause      string   `json:"cause"`
	Superseded bool     `json:"superseded"`
	Unfinished bool     `json:"unfinished,omitempty"`
	Detected   *float64 `json:"detected"`
	Classified *float64 `json:"classified"`
	Replaced   *float64 `json:"replaced"`
	Published  *float64 `json:"published"`
	Restored   *float64 `json:"restored"`
	Resumed    *float64 `json:"resumed"`
}

// Exit is the job's end.
type Exit struct {
	Code     int     `json:"code"`
	Reason   string  `json:"reason"`
	Duration float64 `json:"duration"`
}

// Unknown is a record of a kind this package does not know (a newer
// writer's): its kind and the whole line.
type Unknown struct {
	Name string
	Line []byte
}

func (Launch) Kind() string         { return "launch" }
func (Rendezvous) Kind() string     { return "rendezvous" }
func (Sample) Kind() string         { return "sample" }
func (Failure) Kind() string        { return "failure" }
func (Fence) Kind() string          { return "fence" }
func (Splice) Kind() string         { return "splice" }
func (Restart) Kind() string        { return "restart" }
func (Publish) Kind() string        { return "publish" }
func (UnderProtected) Kind() string { return "under-protected" }
func (Protected) Kind() string      { return "protected" }
func (Abort) Kind() string          { return "abort" }
func (s Stage) Kind() string        { return s.Name }
func (Timeline) Kind() string       { return "timeline" }
func (Exit) Kind() string           { return "exit" }
func (u Unknown) Kind() string      { return u.Name }

// decoders make an empty body of each known kind, to decode into.
var decoders = map[string]func() Event{
	"launch":          func() Event { return &Launch{} },
	"rendezvous":      func() Event { return &Rendezvous{} },
	"sample":          func() Event { return &Sample{} },
	"failure":         func() Event { return &Failure{} },
	"fence":           func() Event { return &Fence{} },
	"splice":          func() Event { return &Splice{} },
	"restart":         func() Event { return &Restart{} },
	"publish":         func() Event { return &Publish{} },
	"under-protected": func() Event { return &UnderProtected{} },
	"protected":       func() Event { return &Protected{} },
	"abort":           func() Event { return &Abort{} },
	"timeline":        func() Event { return &Timeline{} },
	"exit":            func() Event { return &Exit{} },
}

func isStage(kind string) bool {
	for _, s := range Stages {
		if s == kind {
			return true
		}
	}
	return false
}
